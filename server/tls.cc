#include "server/tls.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "engine/ir/text.h"
#include "server/flag_file.h"

namespace memest {
namespace {

constexpr size_t kMaxPemBytes = 1 << 20;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;

}  // namespace

StatusOr<std::string> ReadPemFile(const char* flag, const std::string& path) {
  return ReadFlagFile(flag, path, kMaxPemBytes);
}

namespace {

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM file, or null.
std::unique_ptr<X509, X509Free> FirstCertificate(const std::string& pem) {
  Bio bio = MemoryBio(pem);
  return std::unique_ptr<X509, X509Free>(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

}  // namespace

Status CheckTlsPair(const std::string& cert_file, const std::string& key_file,
                    const char* cert_flag, const char* key_flag) {
  const std::string cert_name = cert_flag, key_name = key_flag;
  if (cert_file.empty() || key_file.empty()) {
    return InvalidArgument((cert_file.empty() ? cert_name : key_name) + ": TLS needs both " +
                           cert_name + " and " + key_name);
  }
  MEMEST_ASSIGN_OR_RETURN(std::string cert_pem, ReadPemFile(cert_flag, cert_file));
  MEMEST_ASSIGN_OR_RETURN(std::string key_pem, ReadPemFile(key_flag, key_file));
  auto cert = FirstCertificate(cert_pem);
  if (cert == nullptr) {
    return InvalidArgument(cert_name + ": " + Quote(cert_file) + " holds no PEM certificate");
  }
  Bio key_bio = MemoryBio(key_pem);
  // A key behind a passphrase is refused, never prompted for on the terminal.
  pem_password_cb* no_passphrase = [](char*, int, int, void*) { return 0; };
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, no_passphrase, nullptr));
  if (key == nullptr) {
    return InvalidArgument(key_name + ": " + Quote(key_file) +
                           " holds no PEM private key (or one protected by a passphrase)");
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return InvalidArgument(key_name + ": " + Quote(key_file) +
                           " is not the private key of the certificate in " + Quote(cert_file));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return InvalidArgument(cert_name + ": the certificate in " + Quote(cert_file) + " has expired");
  }
  return Status::Ok();
}

namespace {}  // namespace

StatusOr<std::shared_ptr<grpc::ServerCredentials>> WatchedTlsCredentials(const TlsOptions& tls) {
  if ((tls.cert_file.empty() || tls.key_file.empty()) && !tls.client_ca_file.empty()) {
    return InvalidArgument(std::string(tls.cert_file.empty() ? "--tls-cert" : "--tls-key") +
                           ": TLS needs both --tls-cert and --tls-key (--tls-client-ca is mutual "
                           "TLS)");
  }
  MEMEST_RETURN_IF_ERROR(CheckTlsPair(tls.cert_file, tls.key_file, "--tls-cert", "--tls-key"));
  if (!tls.client_ca_file.empty()) {
    MEMEST_ASSIGN_OR_RETURN(std::string ca_pem, ReadPemFile("--tls-client-ca", tls.client_ca_file));
    if (FirstCertificate(ca_pem) == nullptr) {
      return InvalidArgument("--tls-client-ca: " + Quote(tls.client_ca_file) +
                             " holds no PEM certificate");
    }
  }
  if (tls.reload_interval.count() <= 0) {
    return InvalidArgument("--tls-reload-seconds: must be positive, got " +
                           std::to_string(tls.reload_interval.count()));
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls.key_file, tls.cert_file, tls.client_ca_file,
      static_cast<unsigned int>(tls.reload_interval.count()));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (tls.client_ca_file.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

}  // namespace memest
