#include "tests/server/test_certs.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace memest::testing {
namespace {

EVP_PKEY* NewKey() { return EVP_EC_gen("P-256"); }

void AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &context, nid, value);
  if (extension == nullptr) throw std::runtime_error("bad extension");
  X509_add_ext(cert, extension, -1);
  X509_EXTENSION_free(extension);
}

// A certificate for `key` named `common_name`, valid for a day (or expired), unsigned.
X509* NewCertificate(EVP_PKEY* key, const std::string& common_name, bool expired) {
  static long serial = 1;
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), serial++);
  X509_gmtime_adj(X509_getm_notBefore(cert), expired ? -7200 : -60);
  X509_gmtime_adj(X509_getm_notAfter(cert), expired ? -3600 : 86400);
  X509_set_pubkey(cert, key);
  X509_NAME_add_entry_by_txt(X509_get_subject_name(cert), "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1,
                             0);
  return cert;
}

void WritePem(const std::string& path, X509* cert, EVP_PKEY* key) {
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) throw std::runtime_error("cannot write " + path);
  if (cert != nullptr) PEM_write_X509(file, cert);
  if (key != nullptr) PEM_write_PrivateKey(file, key, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(file);
}

}  // namespace

struct TestCa::Keys {
  EVP_PKEY* key = nullptr;
  X509* cert = nullptr;
};

TestCa::TestCa(const std::string& name) : keys_(std::make_unique<Keys>()) {
  keys_->key = NewKey();
  keys_->cert = NewCertificate(keys_->key, name, false);
  X509_set_issuer_name(keys_->cert, X509_get_subject_name(keys_->cert));
  AddExtension(keys_->cert, keys_->cert, NID_basic_constraints, "critical,CA:TRUE");
  AddExtension(keys_->cert, keys_->cert, NID_key_usage, "critical,keyCertSign,cRLSign");
  X509_sign(keys_->cert, keys_->key, EVP_sha256());
}

TestCa::~TestCa() {
  X509_free(keys_->cert);
  EVP_PKEY_free(keys_->key);
}

void TestCa::WriteCertificate(const std::string& path) const {
  WritePem(path, keys_->cert, nullptr);
}

void TestCa::Issue(const std::string& cert_path, const std::string& key_path,
                   const std::string& common_name, bool expired) const {
  EVP_PKEY* key = NewKey();
  X509* cert = NewCertificate(key, common_name, expired);
  X509_set_issuer_name(cert, X509_get_subject_name(keys_->cert));
  AddExtension(cert, keys_->cert, NID_basic_constraints, "critical,CA:FALSE");
  AddExtension(cert, keys_->cert, NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1");
  X509_sign(cert, keys_->key, EVP_sha256());
  WritePem(cert_path, cert, nullptr);
  WritePem(key_path, nullptr, key);
  X509_free(cert);
  EVP_PKEY_free(key);
}

void WriteEncryptedKey(const std::string& path, const std::string& passphrase) {
  EVP_PKEY* key = NewKey();
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) throw std::runtime_error("cannot write " + path);
  PEM_write_PrivateKey(file, key, EVP_aes_256_cbc(),
                       reinterpret_cast<const unsigned char*>(passphrase.data()),
                       static_cast<int>(passphrase.size()), nullptr, nullptr);
  std::fclose(file);
  EVP_PKEY_free(key);
}

std::string ReadText(const std::string& path) {
  std::ifstream file(path);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

}  // namespace memest::testing
