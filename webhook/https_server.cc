#include "webhook/https_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "engine/ir/text.h"
#include "server/tls.h"

namespace memest::webhook {

// The certificate and key files, and the pair last loaded from them, which every handshake
// serves: the SSL_CTX is left alone once the server runs (OpenSSL does not allow changing it
// while handshakes use it).
struct HttpsServer::Files {
  std::string cert, key;
  std::mutex mu;
  timespec cert_time{}, key_time{};  // guarded by mu
  X509* leaf = nullptr;              // guarded by mu
  STACK_OF(X509) * chain = nullptr;  // the certificates after the leaf; guarded by mu
  EVP_PKEY* private_key = nullptr;   // guarded by mu

  ~Files() { Clear(); }
  void Clear() {
    X509_free(leaf);
    sk_X509_pop_free(chain, X509_free);
    EVP_PKEY_free(private_key);
    leaf = nullptr;
    chain = nullptr;
    private_key = nullptr;
  }
};

namespace {

constexpr size_t kMaxBody = 8 << 20;  // Kubernetes sends objects of at most a few MiB
constexpr size_t kMaxHeaders = 16 << 10;
// The most one connection may take, handshake, request and reply together; the API server's
// own timeout is at most 30 s.
constexpr auto kPerConnection = std::chrono::seconds(10);

bool SameTime(const timespec& a, const timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

// Reloads the pair when either file changed; keeps the last good pair when the new files do not
// make one (a rotation caught half-way). Call with files.mu held.
void RefreshLocked(HttpsServer::Files& files) {
  struct stat cert {
  }, key{};
  if (stat(files.cert.c_str(), &cert) != 0 || stat(files.key.c_str(), &key) != 0) return;
  if (files.leaf != nullptr && SameTime(cert.st_mtim, files.cert_time) &&
      SameTime(key.st_mtim, files.key_time)) {
    return;
  }
  // Read as memest-server reads its TLS files: regular files of at most 1 MiB.
  const StatusOr<std::string> cert_pem = ReadPemFile("--serving-cert", files.cert);
  const StatusOr<std::string> key_pem = ReadPemFile("--serving-key", files.key);
  if (!cert_pem.ok() || !key_pem.ok()) return;  // the last good pair stays
  BIO* cert_bio = BIO_new_mem_buf(cert_pem->data(), static_cast<int>(cert_pem->size()));
  BIO* key_bio = BIO_new_mem_buf(key_pem->data(), static_cast<int>(key_pem->size()));
  X509* leaf = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
  STACK_OF(X509)* chain = sk_X509_new_null();
  while (X509* more = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr)) {
    sk_X509_push(chain, more);
  }
  pem_password_cb* no_passphrase = [](char*, int, int, void*) { return 0; };
  EVP_PKEY* private_key = PEM_read_bio_PrivateKey(key_bio, nullptr, no_passphrase, nullptr);
  BIO_free(cert_bio);
  BIO_free(key_bio);
  ERR_clear_error();  // the chain's end is a "no start line" error left on this thread's queue
  if (leaf == nullptr || private_key == nullptr || X509_check_private_key(leaf, private_key) != 1) {
    X509_free(leaf);
    sk_X509_pop_free(chain, X509_free);
    EVP_PKEY_free(private_key);
    return;
  }
  files.Clear();
  files.leaf = leaf;
  files.chain = chain;
  files.private_key = private_key;
  files.cert_time = cert.st_mtim;
  files.key_time = key.st_mtim;
}

// Every handshake: the current pair, reloaded first if the files changed.
int ServeCertificate(SSL* ssl, void* arg) {
  auto& files = *static_cast<HttpsServer::Files*>(arg);
  std::lock_guard<std::mutex> lock(files.mu);
  RefreshLocked(files);
  if (files.leaf == nullptr) return 0;
  return SSL_use_certificate(ssl, files.leaf) == 1 &&
                 SSL_use_PrivateKey(ssl, files.private_key) == 1 &&
                 SSL_set1_chain(ssl, files.chain) == 1
             ? 1
             : 0;
}

// One connection: its socket and TLS session, closed when it goes, and a deadline for all of it.
class Connection {
 public:
  Connection(int fd, SSL_CTX* context)
      : fd_(fd),
        ssl_(SSL_new(context)),
        deadline_(std::chrono::steady_clock::now() + kPerConnection) {
    SSL_set_fd(ssl_, fd_);
  }
  ~Connection() {
    if (accepted_) SSL_shutdown(ssl_);
    SSL_free(ssl_);
    close(fd_);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  bool Accept() { return Arm() && (accepted_ = SSL_accept(ssl_) == 1); }
  // Up to `size` bytes; 0 at the end, on an error or once the deadline passed.
  int Read(char* data, int size) { return Arm() ? std::max(0, SSL_read(ssl_, data, size)) : 0; }
  void Reply(int code, const char* type, const std::string& body) {
    const char* reason = code == 200   ? "OK"
                         : code == 400 ? "Bad Request"
                         : code == 404 ? "Not Found"
                                       : "Internal Server Error";
    const std::string all = "HTTP/1.1 " + std::to_string(code) + " " + reason +
                            "\r\nContent-Type: " + type +
                            "\r\nContent-Length: " + std::to_string(body.size()) +
                            "\r\nConnection: close\r\n\r\n" + body;
    if (Arm()) SSL_write(ssl_, all.data(), static_cast<int>(all.size()));
  }

 private:
  // The time left to the deadline as the socket's timeouts: a client that sends a byte now and
  // then cannot hold the connection past it. False once it passed.
  bool Arm() {
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
        deadline_ - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    const timeval timeout{static_cast<time_t>(left.count() / 1000000),
                          static_cast<suseconds_t>(left.count() % 1000000)};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    return true;
  }

  const int fd_;
  SSL* const ssl_;
  const std::chrono::steady_clock::time_point deadline_;
  bool accepted_ = false;
};

// One request on one connection: read, answer, close. Hostile peers are bounded: 16 KiB of
// headers, 8 MiB of body, kPerConnection for the handshake, the request and the reply together.
void Serve(int fd, SSL_CTX* context, const HttpsServer::Handler& handler) {
  Connection connection(fd, context);
  if (!connection.Accept()) return;
  std::string data;
  char chunk[4096];
  size_t end = std::string::npos;
  while ((end = data.find("\r\n\r\n")) == std::string::npos && data.size() < kMaxHeaders) {
    const int n = connection.Read(chunk, sizeof(chunk));
    if (n <= 0) break;
    data.append(chunk, static_cast<size_t>(n));
  }
  if (end == std::string::npos) {
    return connection.Reply(400, "text/plain", "no complete request head within 16 KiB\n");
  }
  const std::string head = data.substr(0, end);
  std::string body = data.substr(end + 4);
  const std::string method = head.substr(0, head.find(' '));
  const size_t path_start = head.find(' ') + 1;
  std::string path = head.substr(path_start, head.find(' ', path_start) - path_start);
  path = path.substr(0, path.find('?'));  // the API server adds ?timeout=10s
  long long length = -1;
  std::string lower = head;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const size_t header = lower.find("\r\ncontent-length:");
  if (header != std::string::npos) length = std::atoll(lower.c_str() + header + 17);
  if (path == "/healthz") return connection.Reply(200, "text/plain", "ok\n");
  if (method != "POST" || (path != "/validate" && path != "/mutate")) {
    return connection.Reply(404, "text/plain", "POST /validate or /mutate an AdmissionReview\n");
  }
  if (length < 0 || static_cast<size_t>(length) > kMaxBody) {
    return connection.Reply(400, "text/plain", "a Content-Length of at most 8 MiB is needed\n");
  }
  while (body.size() < static_cast<size_t>(length)) {
    const int n = connection.Read(chunk, sizeof(chunk));
    if (n <= 0) break;
    body.append(chunk, static_cast<size_t>(n));
  }
  body.resize(std::min(body.size(), static_cast<size_t>(length)));
  try {
    const StatusOr<std::string> answer = handler(body, path == "/mutate");
    if (!answer.ok()) return connection.Reply(400, "text/plain", answer.status().message() + "\n");
    connection.Reply(200, "application/json", *answer);
  } catch (const std::exception& error) {
    connection.Reply(500, "text/plain", std::string("the webhook failed: ") + error.what() + "\n");
  }
}

}  // namespace

StatusOr<std::unique_ptr<HttpsServer>> HttpsServer::Start(const std::string& address,
                                                          const std::string& cert_file,
                                                          const std::string& key_file, int threads,
                                                          Handler handler) {
  MEMEST_RETURN_IF_ERROR(CheckTlsPair(cert_file, key_file, "--serving-cert", "--serving-key"));
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return InvalidArgument("--address: expected HOST:PORT, got " + Quote(address));
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  if (getaddrinfo(host.c_str(), address.substr(colon + 1).c_str(), &hints, &found) != 0) {
    return InvalidArgument("--address: cannot resolve " + Quote(address));
  }
  std::unique_ptr<HttpsServer> server(new HttpsServer());
  server->listener_ = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int on = 1;
  setsockopt(server->listener_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  const bool bound = server->listener_ >= 0 &&
                     bind(server->listener_, found->ai_addr, found->ai_addrlen) == 0 &&
                     listen(server->listener_, 128) == 0;
  freeaddrinfo(found);
  if (!bound) return Unavailable("could not listen on " + Quote(address) + " (--address)");
  sockaddr_storage local{};
  socklen_t size = sizeof(local);
  getsockname(server->listener_, reinterpret_cast<sockaddr*>(&local), &size);
  server->port_ =
      ntohs(local.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&local)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&local)->sin_port);

  server->files_ = std::make_unique<Files>();
  server->files_->cert = cert_file;
  server->files_->key = key_file;
  {
    std::lock_guard<std::mutex> lock(server->files_->mu);
    RefreshLocked(*server->files_);
  }
  server->context_ = SSL_CTX_new(TLS_server_method());
  SSL_CTX_set_min_proto_version(server->context_, TLS1_2_VERSION);
  SSL_CTX_set_cert_cb(server->context_, ServeCertificate, server->files_.get());
  server->handler_ = std::move(handler);
  server->pool_ = std::make_unique<WorkPool>(threads, 4 * threads);
  HttpsServer* self = server.get();
  server->acceptor_ = std::thread([self] { self->Accept(); });
  return server;
}

void HttpsServer::Accept() {
  while (true) {
    const int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // EMFILE and the like
      continue;
    }
    if (!pool_->TrySubmit([this, fd] { Serve(fd, context_, handler_); })) close(fd);  // busy
  }
}

HttpsServer::~HttpsServer() {
  stopping_ = true;
  if (listener_ >= 0) shutdown(listener_, SHUT_RDWR);  // wakes accept()
  if (acceptor_.joinable()) acceptor_.join();
  pool_.reset();  // the requests in progress finish
  if (listener_ >= 0) close(listener_);
  if (context_ != nullptr) SSL_CTX_free(context_);
}

}  // namespace memest::webhook
