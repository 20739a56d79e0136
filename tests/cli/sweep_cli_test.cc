// `memest sweep` as a user runs it: a row per combination of the lists, each the estimate of
// that configuration; --json one object per result; exit codes; the lists' own mistakes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/memest_command.h"
#include "tests/cli/subprocess.h"

namespace memest {
namespace {

using ::memest::testing::Child;
using ::memest::testing::RunResult;
using ::testing::HasSubstr;

std::vector<std::string> Gpt2Sweep(std::vector<std::string> extra) {
  std::vector<std::string> args = {"sweep", "--preset",    "gpt2-small", "--seq",
                                   "128",   "--precision", "bf16",       "--no-advice"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The JSON objects `memest ... --json` printed one after another.
std::vector<nlohmann::json> JsonObjects(const std::string& out) {
  std::vector<nlohmann::json> objects;
  std::istringstream in(out);
  while (in >> std::ws && in.peek() != EOF) {
    nlohmann::json j;
    in >> j;
    objects.push_back(j);
  }
  return objects;
}

TEST(SweepCliTest, ARowPerCombinationEachTheEstimateOfIt) {
  const RunResult table =
      Memest(Gpt2Sweep({"--local", "--batches", "2,64", "--devices", "t4,a100-80gb"}));
  EXPECT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("batch  device"));
  EXPECT_THAT(table.out, ::testing::ContainsRegex("\n  64 +t4 +[0-9.]+ GiB .* no\n"));
  EXPECT_THAT(table.out, ::testing::ContainsRegex("\n  64 +a100-80gb +[0-9.]+ GiB .* yes\n"));

  const RunResult json =
      Memest(Gpt2Sweep({"--local", "--json", "--batches", "2,64", "--devices", "t4,a100-80gb"}));
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const std::vector<nlohmann::json> results = JsonObjects(json.out);
  ASSERT_EQ(results.size(), 4u);
  const RunResult alone =
      Memest({"estimate", "--local", "--json", "--preset", "gpt2-small", "--seq", "128",
              "--precision", "bf16", "--no-advice", "--batch", "64", "--device", "t4"});
  ASSERT_EQ(alone.exit_code, 2) << alone.err;  // does not fit
  EXPECT_EQ(JsonInt(results[2]["index"]), 2);
  EXPECT_EQ(results[2]["estimate"], nlohmann::json::parse(alone.out));

  const RunResult none = Memest(Gpt2Sweep({"--local", "--batches", "64,128", "--device", "t4"}));
  EXPECT_EQ(none.exit_code, 2) << none.err;
}

TEST(SweepCliTest, RefusalsAreListedOnceAndTheListsOwnMistakesAreBadInput) {
  const RunResult mixed = Memest(Gpt2Sweep({"--local", "--batches", "1,2", "--devices", "l4,tpu"}));
  EXPECT_EQ(mixed.exit_code, 0) << mixed.err;
  EXPECT_THAT(mixed.out, HasSubstr("[1, 3] NOT_FOUND: config.device_name: unknown device 'tpu'"));
  const RunResult refused = Memest(Gpt2Sweep({"--local", "--batches", "0,-1"}));
  EXPECT_EQ(refused.exit_code, 3) << refused.out;
  EXPECT_THAT(refused.out, HasSubstr("INVALID_ARGUMENT: config.batch_size"));
  const RunResult refused_json = Memest(Gpt2Sweep({"--local", "--json", "--batches", "0,-1"}));
  EXPECT_EQ(refused_json.exit_code, 3) << refused_json.out;
  EXPECT_EQ(JsonObjects(refused_json.out).size(), 2u);

  const RunResult both = Memest(Gpt2Sweep({"--local", "--batch", "2", "--batches", "1,2"}));
  EXPECT_EQ(both.exit_code, 3);
  EXPECT_THAT(both.err, HasSubstr("--batches: give --batch or --batches, not both"));
  const RunResult word =
      Memest({"sweep", "--local", "--preset", "gpt2-small", "--precisions", "bf16,fp12"});
  EXPECT_EQ(word.exit_code, 3);
  EXPECT_THAT(word.err, HasSubstr("--precision: unknown value \"fp12\""));
  std::string many;
  for (int i = 1; i <= 300; ++i) many += (i > 1 ? "," : "") + std::to_string(i);
  const RunResult huge = Memest(Gpt2Sweep(
      {"--local", "--batches", many, "--devices", "l4,t4,a100-80gb", "--optimizers", many}));
  EXPECT_EQ(huge.exit_code, 3);
  EXPECT_THAT(huge.err, HasSubstr("--batches x --devices x --optimizers: 300 x 3 x 300 values "
                                  "make more than 65536 configurations"));
}

TEST(SweepCliTest, AgainstRealServerAsLocally) {
  Child server({MEMEST_SERVER_PATH, "--address", "127.0.0.1:0"});
  const std::string address =
      server.WaitForLine("memest-server listening on ", std::chrono::seconds(20));
  ASSERT_THAT(address, HasSubstr("127.0.0.1:")) << server.Output();
  const std::vector<std::string> lists = {"--json",          "--batches", "1,4",
                                          "--optimizers",    "adamw,sgd", "--checkpoints",
                                          "none,every-block"};
  std::vector<std::string> remote = lists, local = lists;
  remote.insert(remote.end(), {"--server", address});
  local.push_back("--local");
  const RunResult over = Memest(Gpt2Sweep(remote));
  const RunResult here = Memest(Gpt2Sweep(local));
  ASSERT_EQ(over.exit_code, 0) << over.err;
  ASSERT_EQ(here.exit_code, 0) << here.err;
  const std::vector<nlohmann::json> a = JsonObjects(over.out), b = JsonObjects(here.out);
  EXPECT_EQ(a.size(), 8u);
  EXPECT_EQ(a, b);
  EXPECT_EQ(server.Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace memest
