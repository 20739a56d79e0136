// TLS and mutual TLS (server/tls.h) over real connections, with certificates the test makes:
// plaintext and untrusted clients are refused, client certificates are required and verified,
// rotated files are picked up without a restart, bad files refuse the start naming the flag, and
// the plaintext health port answers probes.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "memest/v1/memest.grpc.pb.h"
#include "server/serve.h"
#include "tests/server/health_client.h"
#include "tests/server/test_certs.h"

namespace memest {
namespace {

using ::testing::HasSubstr;
using testing::ReadText;
using testing::TestCa;
using Serving = grpc::health::v1::HealthCheckResponse;

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/memest-tls-test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    ca_.WriteCertificate(Path("ca.pem"));
    other_ca_.WriteCertificate(Path("other-ca.pem"));
    ca_.Issue(Path("server.pem"), Path("server.key"), "memest-server");
    ca_.Issue(Path("client.pem"), Path("client.key"), "trainer-1");
    other_ca_.Issue(Path("rogue.pem"), Path("rogue.key"), "rogue");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  TlsOptions ServerTls(bool mutual) const {
    TlsOptions tls;
    tls.cert_file = Path("server.pem");
    tls.key_file = Path("server.key");
    if (mutual) tls.client_ca_file = Path("ca.pem");
    return tls;
  }

  std::unique_ptr<EstimatorServer> Start(ServerOptions options) {
    options.address = "127.0.0.1:0";
    auto server = EstimatorServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    return server.ok() ? std::move(server).value() : nullptr;
  }

  // ListDevices over a new connection that trusts `ca` and, when given, presents `client`.
  grpc::Status Call(const EstimatorServer& server, const std::string& ca,
                    const std::string& client = "") {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadText(Path(ca));
    if (!client.empty()) {
      ssl.pem_cert_chain = ReadText(Path(client + ".pem"));
      ssl.pem_private_key = ReadText(Path(client + ".key"));
    }
    return Call(server.port(), grpc::SslCredentials(ssl));
  }
  static grpc::Status Call(int port, const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    auto stub = v1::MemoryEstimator::NewStub(
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), credentials, args));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListDevicesResponse response;
    return stub->ListDevices(&context, v1::ListDevicesRequest(), &response);
  }

  // grpc.reflection.v1alpha's list_services, as one message each way.
  static grpc::StatusCode ListServices(
      int port, const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    grpc::GenericStub stub(
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), credentials, args));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    const char list_services[] = {0x3a, 0x00};  // ServerReflectionRequest{list_services: ""}
    grpc::Slice slice(list_services, sizeof(list_services));
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", {},
                   &request, &response, [&done](grpc::Status s) { done.set_value(s); });
    return done.get_future().get().error_code();
  }

  std::string dir_;
  TestCa ca_{"memest test CA"};
  TestCa other_ca_{"another CA"};
};

TEST_F(TlsTest, ServesTlsAndRefusesPlaintextAndUntrustedClients) {
  ServerOptions options;
  options.tls = ServerTls(false);
  auto server = Start(options);
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(Call(*server, "ca.pem").ok());
  EXPECT_EQ(Call(server->port(), grpc::InsecureChannelCredentials()).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Call(*server, "other-ca.pem").error_code(), grpc::StatusCode::UNAVAILABLE)
      << "a client that does not trust the server's CA connected";
}

TEST_F(TlsTest, MutualTlsRequiresAClientCertificateFromItsCa) {
  ServerOptions options;
  options.tls = ServerTls(true);
  auto server = Start(options);
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(Call(*server, "ca.pem", "client").ok());
  EXPECT_EQ(Call(*server, "ca.pem").error_code(), grpc::StatusCode::UNAVAILABLE)
      << "a client without a certificate connected";
  EXPECT_EQ(Call(*server, "ca.pem", "rogue").error_code(), grpc::StatusCode::UNAVAILABLE)
      << "a client whose certificate another CA signed connected";
}

TEST_F(TlsTest, RotatedCertificatesArePickedUpWithoutARestart) {
  ServerOptions options;
  options.tls = ServerTls(true);
  options.tls.reload_interval = std::chrono::seconds(1);
  auto server = Start(options);
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(Call(*server, "ca.pem", "client").ok());

  // The server's certificate now comes from the other CA, and so do its clients'. The old
  // client's certificate is kept.
  std::filesystem::copy_file(Path("client.pem"), Path("old-client.pem"));
  std::filesystem::copy_file(Path("client.key"), Path("old-client.key"));
  other_ca_.Issue(Path("next.pem"), Path("next.key"), "memest-server");
  other_ca_.WriteCertificate(Path("next-ca.pem"));
  std::filesystem::rename(Path("next.key"), Path("server.key"));
  std::filesystem::rename(Path("next.pem"), Path("server.pem"));
  std::filesystem::rename(Path("next-ca.pem"), Path("ca.pem"));
  other_ca_.Issue(Path("client.pem"), Path("client.key"), "trainer-1");
  other_ca_.WriteCertificate(Path("other-ca.pem"));

  bool rotated = false;
  for (int i = 0; i < 100 && !rotated; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    rotated = Call(*server, "other-ca.pem", "client").ok();
  }
  EXPECT_TRUE(rotated) << "the new certificates were not served within 10 s";
  // The server no longer trusts a client certificate of the old CA.
  EXPECT_FALSE(Call(*server, "other-ca.pem", "old-client").ok()) << "the old CA is still trusted";
}

TEST_F(TlsTest, BadFilesRefuseTheStartNamingTheFlag) {
  ca_.Issue(Path("expired.pem"), Path("expired.key"), "memest-server", /*expired=*/true);
  ca_.Issue(Path("other.pem"), Path("other.key"), "memest-server");
  testing::WriteEncryptedKey(Path("locked.key"), "s3cret");
  std::filesystem::create_directory(Path("a-directory"));
  std::FILE* junk = std::fopen(Path("junk.pem").c_str(), "w");
  std::fputs("not a certificate\n", junk);
  std::fclose(junk);
  struct Case {
    std::string cert, key, client_ca, message;
  };
  const Case cases[] = {
      {"server.pem", "", "", "--tls-key: TLS needs both --tls-cert and --tls-key"},
      {"", "server.key", "", "--tls-cert: TLS needs both"},
      {"", "", "ca.pem", "--tls-cert: TLS needs both --tls-cert and --tls-key (--tls-client-ca"},
      {"missing.pem", "server.key", "", "--tls-cert: cannot read"},
      {"junk.pem", "server.key", "", "--tls-cert: '" + Path("junk.pem") + "' holds no PEM"},
      {"server.pem", "junk.pem", "", "--tls-key: '" + Path("junk.pem") + "' holds no PEM"},
      {"server.pem", "other.key", "", "is not the private key of the certificate in"},
      {"expired.pem", "expired.key", "", "--tls-cert: the certificate in"},
      {"server.pem", "server.key", "junk.pem", "--tls-client-ca: '"},
      {"server.pem", "server.key", "missing.pem", "--tls-client-ca: cannot read"},
      {"server.pem", "locked.key", "", "--tls-key: '" + Path("locked.key") + "' holds no PEM"},
      {"a-directory", "server.key", "", "--tls-cert: '" + Path("a-directory") + "' is not a "},
  };
  for (const Case& c : cases) {
    ServerOptions options;
    options.address = "127.0.0.1:0";
    options.tls.cert_file = c.cert.empty() ? "" : Path(c.cert);
    options.tls.key_file = c.key.empty() ? "" : Path(c.key);
    options.tls.client_ca_file = c.client_ca.empty() ? "" : Path(c.client_ca);
    const auto server = EstimatorServer::Start(options);
    ASSERT_FALSE(server.ok()) << c.message;
    EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(server.status().message(), HasSubstr(c.message));
  }
}

// Kubernetes' gRPC probe speaks no TLS: the health port is plaintext, serves health only, and
// follows the main port's status.
TEST_F(TlsTest, TheHealthPortIsPlaintextAndServesOnlyHealth) {
  ServerOptions options;
  options.tls = ServerTls(true);
  options.health_address = "127.0.0.1:0";
  auto server = Start(options);
  ASSERT_NE(server, nullptr);
  ASSERT_NE(server->health_port(), 0);
  auto health = grpc::CreateChannel("127.0.0.1:" + std::to_string(server->health_port()),
                                    grpc::InsecureChannelCredentials());
  EXPECT_EQ(testing::CheckHealth(health, ""), Serving::SERVING);
  EXPECT_EQ(testing::CheckHealth(health, "memest.v1.MemoryEstimator"), Serving::SERVING);
  EXPECT_EQ(Call(server->health_port(), grpc::InsecureChannelCredentials()).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  // Nor reflection, which the main port serves.
  EXPECT_EQ(ListServices(server->health_port(), grpc::InsecureChannelCredentials()),
            grpc::StatusCode::UNIMPLEMENTED);
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadText(Path("ca.pem"));
  ssl.pem_cert_chain = ReadText(Path("client.pem"));
  ssl.pem_private_key = ReadText(Path("client.key"));
  EXPECT_EQ(ListServices(server->port(), grpc::SslCredentials(ssl)), grpc::StatusCode::OK);
  server->StopServing();
  EXPECT_EQ(testing::CheckHealth(health, ""), Serving::NOT_SERVING);
  EXPECT_TRUE(Call(*server, "ca.pem", "client").ok()) << "calls are still taken while draining";
}

}  // namespace
}  // namespace memest
