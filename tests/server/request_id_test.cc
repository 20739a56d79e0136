// Request ids (server/request_id.h): the caller's kept when it is a plain token, else the
// server's own; echoed in the reply's initial metadata of unary and streaming calls.
#include "server/request_id.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "tests/server/test_server.h"

namespace memest {
namespace {

bool Hex16(const std::string& id) {
  if (id.size() != 16) return false;
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

TEST(RequestIdTest, KeepsPlainTokensOnly) {
  for (const char* id : {"a", "req-42", "2026-11-29T17:00:00.123Z", "trace_id.span:7"}) {
    EXPECT_TRUE(ValidRequestId(id)) << id;
  }
  for (const std::string& id :
       {std::string(), std::string(65, 'a'), std::string("two words"), std::string("line\nforged"),
        std::string("quote\""), std::string("caf\xc3\xa9")}) {
    EXPECT_FALSE(ValidRequestId(id)) << id;
  }
  EXPECT_TRUE(ValidRequestId(std::string(64, 'a')));
}

TEST(RequestIdTest, NewIdsAreDistinctHex) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = NewRequestId();
    EXPECT_TRUE(Hex16(id)) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

// The id the server sent back with a ListDevices call that gave `given` (empty: none).
std::string Echoed(testing::TestServer& server, const std::string& given) {
  grpc::ClientContext context;
  if (!given.empty()) context.AddMetadata(kRequestIdKey, given);
  v1::ListDevicesResponse response;
  const grpc::Status status = server.stub().ListDevices(&context, {}, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  const auto& metadata = context.GetServerInitialMetadata();
  const auto it = metadata.find(kRequestIdKey);
  if (it == metadata.end()) return "<none>";
  return std::string(it->second.data(), it->second.size());
}

TEST(RequestIdTest, EveryReplyCarriesOne) {
  testing::TestServer server;
  EXPECT_EQ(Echoed(server, "job-1234.step:7"), "job-1234.step:7");
  EXPECT_TRUE(Hex16(Echoed(server, "")));
  EXPECT_TRUE(Hex16(Echoed(server, "has spaces")));  // refused: the server's own instead

  // A failed Estimate and a stream (Plan) carry it too.
  grpc::ClientContext estimate;
  estimate.AddMetadata(kRequestIdKey, "estimate-1");
  v1::EstimateResponse response;
  EXPECT_FALSE(server.stub().Estimate(&estimate, v1::EstimateRequest(), &response).ok());
  EXPECT_EQ(estimate.GetServerInitialMetadata().find(kRequestIdKey)->second, "estimate-1");

  grpc::ClientContext plan;
  plan.AddMetadata(kRequestIdKey, "plan-1");
  auto reader = server.stub().Plan(&plan, v1::PlanRequest());
  v1::PlanEvent event;
  while (reader->Read(&event)) {
  }
  EXPECT_FALSE(reader->Finish().ok());
  EXPECT_EQ(plan.GetServerInitialMetadata().find(kRequestIdKey)->second, "plan-1");
}

}  // namespace
}  // namespace memest
