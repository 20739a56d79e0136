// Bearer-token authentication (server/auth.h): with --auth-token-file every estimator call must
// carry the token, health checks stay open, the token is reread when its file changes, and a
// file that cannot give a token is refused at start naming the flag.
#include "server/auth.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "server/serve.h"
#include "tests/server/health_client.h"
#include "tests/server/test_server.h"

namespace memest {
namespace {

std::string WriteToken(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

// ListDevices carrying `token` ("": no authorization metadata).
grpc::Status Devices(testing::TestServer& server, const std::string& token) {
  grpc::ClientContext context;
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  v1::ListDevicesResponse response;
  return server.stub().ListDevices(&context, {}, &response);
}

TEST(AuthTest, SameTokenComparesWholeStrings) {
  EXPECT_TRUE(SameToken("s3cret", "s3cret"));
  EXPECT_FALSE(SameToken("s3cret", "s3cre"));
  EXPECT_FALSE(SameToken("s3cret", "s3cret0"));
  EXPECT_FALSE(SameToken("s3cret", "S3cret"));
  EXPECT_FALSE(SameToken("", "x"));
  EXPECT_TRUE(SameToken("", ""));
}

TEST(AuthTest, CallsNeedTheTokenAndHealthChecksDoNot) {
  ServerOptions options;
  options.auth_token_file = WriteToken("token", "  s3cret-token\n");  // trimmed
  testing::TestServer server(options);

  grpc::Status status = Devices(server, "");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(status.error_message().find("bearer token"), std::string::npos);
  status = Devices(server, "wrong-token");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(status.error_message().find("wrong-token"), std::string::npos);  // never echoed
  EXPECT_TRUE(Devices(server, "s3cret-token").ok());

  // Every method: a stream and an estimate too.
  grpc::ClientContext plan;
  auto reader = server.stub().Plan(&plan, v1::PlanRequest());
  v1::PlanEvent event;
  while (reader->Read(&event)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  v1::EstimateRequest request;
  request.mutable_model()->mutable_preset()->set_name("gpt2-small");
  v1::EstimateResponse response;
  EXPECT_EQ(server.Estimate(request, &response).error_code(), grpc::StatusCode::UNAUTHENTICATED);

  EXPECT_EQ(testing::CheckHealth(server.channel(), "memest.v1.MemoryEstimator"),
            grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST(AuthTest, TheTokenIsRereadWhenItsFileChanges) {
  ServerOptions options;
  options.auth_token_file = WriteToken("rotated", "first-token");
  testing::TestServer server(options);
  EXPECT_TRUE(Devices(server, "first-token").ok());
  WriteToken("rotated", "second-token-longer");  // another size: seen whatever the mtime
  EXPECT_EQ(Devices(server, "first-token").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Devices(server, "second-token-longer").ok());
}

TEST(AuthTest, AFileWithoutATokenIsRefusedAtStart) {
  for (const std::string& path : {std::string("/nonexistent/token"), WriteToken("empty", " \n"),
                                  WriteToken("spaced", "two words")}) {
    ServerOptions options;
    options.address = "127.0.0.1:0";
    options.auth_token_file = path;
    auto server = EstimatorServer::Start(options);
    ASSERT_FALSE(server.ok()) << path;
    EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(server.status().message().find("--auth-token-file"), std::string::npos);
  }
}

}  // namespace
}  // namespace memest
