// The webhook's HTTPS endpoint (OpenSSL on a plain socket; Debian 12's civetweb cannot start its
// TLS against OpenSSL 3): POST /validate and /mutate take an
// AdmissionReview and answer one (webhook/admission.h); GET /healthz answers "ok" for probes.
// The certificate and key are checked at the start and reread when either file changes (the
// next handshake serves the new pair), so a cert-manager rotation needs no restart.
#ifndef MEMEST_WEBHOOK_HTTPS_SERVER_H_
#define MEMEST_WEBHOOK_HTTPS_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "engine/ir/status.h"
#include "server/work_pool.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace memest::webhook {

class HttpsServer {
 public:
  // (body, mutate) -> the response body; an error is answered 400 with its message.
  using Handler = std::function<StatusOr<std::string>(const std::string& body, bool mutate)>;

  // Listens on `address` (HOST:PORT; port 0: any free port) with the PEM files, `threads`
  // request threads. INVALID_ARGUMENT for bad files (naming the flag), UNAVAILABLE when the
  // address cannot be bound.
  static StatusOr<std::unique_ptr<HttpsServer>> Start(const std::string& address,
                                                      const std::string& cert_file,
                                                      const std::string& key_file, int threads,
                                                      Handler handler);
  ~HttpsServer();  // stops, after the requests in progress

  int port() const { return port_; }

  struct Files;  // the certificate files and what was last loaded from them

 private:
  HttpsServer() = default;
  void Accept();  // the acceptor thread: hands each connection to the pool

  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  SSL_CTX* context_ = nullptr;
  std::unique_ptr<Files> files_;
  Handler handler_;
  std::unique_ptr<WorkPool> pool_;  // one connection a job; a full queue closes new ones
  std::thread acceptor_;
};

}  // namespace memest::webhook

#endif  // MEMEST_WEBHOOK_HTTPS_SERVER_H_
