// Structured logs (server/json_log.h): every line is one JSON object, a call's record has its
// fields as keys, and no text can break a line or the JSON.
#include "server/json_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/subprocess.h"

namespace memest {
namespace {

std::vector<nlohmann::json> Lines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    EXPECT_TRUE(nlohmann::json::accept(line)) << "not JSON: " << line;
    if (nlohmann::json::accept(line)) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

TEST(JsonLogTest, MessagesAndFieldsAreOneJsonObjectALine) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  spdlog::logger logger("json-test", sink);
  UseJsonLogs(logger);
  EXPECT_TRUE(JsonLogs());
  logger.info("plain \"quoted\"\nsecond line\x01 and bad \xff\xfe bytes");
  logger.warn("{}", JsonFields("\"rpc\":" + JsonString("Estimate") + ",\"us\":42"));
  const std::vector<nlohmann::json> lines = Lines(out.str());
  ASSERT_EQ(lines.size(), 2u) << out.str();
  EXPECT_EQ(lines[0]["level"], "info");
  EXPECT_EQ(lines[0]["msg"], "plain \"quoted\"\nsecond line\x01 and bad \uFFFD\uFFFD bytes");
  EXPECT_THAT(lines[0]["time"].get<std::string>(),
              ::testing::MatchesRegex(
                  "20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}[.][0-9]{6}Z"));
  EXPECT_EQ(lines[1]["level"], "warning");
  EXPECT_EQ(lines[1]["rpc"], "Estimate");
  EXPECT_EQ(lines[1]["us"], 42);
  EXPECT_FALSE(lines[1].contains("msg"));
}

TEST(JsonLogTest, JsonStringKeepsUtf8AndEscapesTheRest) {
  EXPECT_EQ(JsonString("caf\xc3\xa9 \xe2\x82\xac"), "\"caf\xc3\xa9 \xe2\x82\xac\"");
  EXPECT_EQ(JsonString("a\\b\t"), "\"a\\\\b\\t\"");
  EXPECT_EQ(JsonString(std::string("\0x", 2)), "\"\\u0000x\"");
  EXPECT_EQ(JsonString("\xe2\x82"), "\"\\ufffd\\ufffd\"");  // a cut sequence
  // Not UTF-8 by RFC 3629 either: an overlong '/' and an encoded surrogate.
  EXPECT_EQ(JsonString("\xc0\xaf"), "\"\\ufffd\\ufffd\"");
  EXPECT_EQ(JsonString("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");
}

// The binary: with --log-format json, a call's line carries its fields, a hostile preset name
// included, and every line of the log is JSON.
TEST(JsonLogTest, TheServerLogsCallsAsJson) {
  testing::Child server({MEMEST_SERVER_BINARY, "--address", "127.0.0.1:0", "--log-format", "json"});
  const std::string address =
      server.WaitForLine("memest-server listening on ", std::chrono::seconds(30));
  ASSERT_FALSE(address.empty()) << server.Output();
  const testing::RunResult call = testing::Run(
      {MEMEST_CLI_BINARY, "estimate", "--server", address, "--preset", "gpt2\"small\n{", "--json"});
  EXPECT_NE(call.exit_code, 0);
  server.Stop(SIGTERM);
  std::string log = server.Output();
  log = log.substr(log.find('\n') + 1);  // the "listening on" line is for scripts, not JSON
  const std::vector<nlohmann::json> lines = Lines(log);
  ASSERT_GE(lines.size(), 3u) << log;
  bool found = false;
  for (const nlohmann::json& line : lines) {
    if (!line.contains("rpc")) continue;
    found = true;
    EXPECT_EQ(line["rpc"], "Estimate");
    EXPECT_EQ(line["code"], "NOT_FOUND");
    EXPECT_THAT(line["model"].get<std::string>(), ::testing::HasSubstr("gpt2\\\"small\\n{"));
    EXPECT_TRUE(line["us"].is_number());
    EXPECT_TRUE(line.contains("error"));
    EXPECT_EQ(line["id"].get<std::string>().size(), 16u);
  }
  EXPECT_TRUE(found) << log;
}

}  // namespace
}  // namespace memest
