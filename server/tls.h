// TLS and mutual TLS for memest-server, from certificate files that are watched and reloaded.
//
// With a certificate and its key the server speaks TLS only; with a client CA as well it asks
// every client for a certificate and refuses the handshake unless it chains to that CA (mutual
// TLS). gRPC rereads the files every `reload_interval`, so a certificate is rotated by replacing
// them (cert-manager's Secret update, say) without a restart; a file that becomes unreadable or
// invalid keeps the last good certificates (gRPC logs why).
//
// The files are checked once at the start so that a bad flag refuses the start, naming it:
// readable PEM, a private key that matches the certificate, a certificate not yet expired, a CA
// bundle with at least one certificate.
#ifndef MEMEST_SERVER_TLS_H_
#define MEMEST_SERVER_TLS_H_

#include <grpcpp/security/server_credentials.h>

#include <chrono>
#include <memory>
#include <string>

#include "engine/ir/status.h"

namespace memest {

struct TlsOptions {
  std::string cert_file;       // --tls-cert: the server's certificate chain, PEM
  std::string key_file;        // --tls-key: its private key, PEM
  std::string client_ca_file;  // --tls-client-ca: mutual TLS; clients' certificates chain to it
  std::chrono::seconds reload_interval = std::chrono::seconds(60);

  bool enabled() const {
    return !cert_file.empty() || !key_file.empty() || !client_ca_file.empty();
  }
};

// Checks the files and returns credentials that watch them. INVALID_ARGUMENT naming the flag for
// a missing or unreadable file, one that is not PEM, a key that does not match the certificate,
// an expired certificate, or a client CA without a certificate and key.
StatusOr<std::shared_ptr<grpc::ServerCredentials>> WatchedTlsCredentials(const TlsOptions& tls);

// The checks of the certificate and key, naming the flags that gave them: readable regular PEM
// files, the key the certificate's (and not behind a passphrase), the certificate not expired.
Status CheckTlsPair(const std::string& cert_file, const std::string& key_file,
                    const char* cert_flag, const char* key_flag);

// A PEM file's contents (at most 1 MiB), or INVALID_ARGUMENT naming `flag` and the path.
StatusOr<std::string> ReadPemFile(const char* flag, const std::string& path);

}  // namespace memest

#endif  // MEMEST_SERVER_TLS_H_
