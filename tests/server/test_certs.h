// Certificates for the TLS tests, made with OpenSSL in the test itself: a CA, and certificates it
// signs for 127.0.0.1 and localhost (valid for a day, or expired an hour ago).
#ifndef MEMEST_TESTS_SERVER_TEST_CERTS_H_
#define MEMEST_TESTS_SERVER_TEST_CERTS_H_

#include <memory>
#include <string>

namespace memest::testing {

class TestCa {
 public:
  explicit TestCa(const std::string& name);  // a self-signed CA called `name`
  ~TestCa();
  TestCa(const TestCa&) = delete;
  TestCa& operator=(const TestCa&) = delete;

  // Writes the CA's certificate (PEM) to `path`.
  void WriteCertificate(const std::string& path) const;
  // Writes a new key and a certificate for it, signed by this CA, with subject CN `common_name`
  // and subject alternative names localhost and 127.0.0.1 (PEM) to the two paths.
  void Issue(const std::string& cert_path, const std::string& key_path,
             const std::string& common_name, bool expired = false) const;

 private:
  struct Keys;
  std::unique_ptr<Keys> keys_;
};

// Writes a new private key protected by `passphrase` (PEM, AES-256-CBC) to `path`.
void WriteEncryptedKey(const std::string& path, const std::string& passphrase);

// The contents of a file ("" when it cannot be read).
std::string ReadText(const std::string& path);

}  // namespace memest::testing

#endif  // MEMEST_TESTS_SERVER_TEST_CERTS_H_
