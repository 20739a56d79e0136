// Tests of the `memest` command as a user runs it: the built binary, with --local (the engine
// in-process) and against a real memest-server started on port 0. They check what a user and
// a script rely on: the table's sections, the JSON mapping, model files, and exit codes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/cli/memest_command.h"
#include "tests/cli/subprocess.h"
#include "tests/server/test_certs.h"

namespace memest {
namespace {

using ::memest::testing::Child;
using ::memest::testing::Run;
using ::memest::testing::RunResult;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kMemest = MEMEST_CLI_PATH;
const std::string kServer = MEMEST_SERVER_PATH;
const std::string kSourceDir = MEMEST_SOURCE_DIR;

// The categories every breakdown lists, as the table and the JSON mapping name them.
const char* const kCategoryNames[] = {
    "parameters",  "gradients",          "optimizer_state", "master_and_casts",
    "activations", "temporaries",        "inputs",          "kv_cache",
    "workspace",   "allocator_overhead", "cuda_context"};
const char* const kCategoryJsonKeys[] = {
    "parameters", "gradients", "optimizerState", "masterAndCasts",    "activations", "temporaries",
    "inputs",     "kvCache",   "workspace",      "allocatorOverhead", "cudaContext"};

// Writes `text` to a file called `name` in the test's temporary directory; returns its path.
std::string WriteTempFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream out(path);
  out << text;
  EXPECT_TRUE(out.good()) << "could not write " << path;
  return path;
}

// A small GPT-2 step: quick to estimate, with every phase and category.
std::vector<std::string> SmallGpt2(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"estimate", "--preset",    "gpt2-small", "--batch",
                                   "2",        "--seq",       "128",        "--optimizer",
                                   "adamw",    "--precision", "bf16"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(CliTest, PresetTableListsCategoriesPhasesAndPeak) {
  const RunResult r = Memest(SmallGpt2({"--local", "--device", "a100-80gb"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* category : kCategoryNames) EXPECT_THAT(r.out, HasSubstr(category));
  EXPECT_THAT(r.out, HasSubstr("Peak: "));
  EXPECT_THAT(r.out, HasSubstr("Peaks by phase"));
  EXPECT_THAT(r.out, HasSubstr("<- allocated"));  // the peak phase is marked
  EXPECT_THAT(r.out, HasSubstr("forward"));
  EXPECT_THAT(r.out, HasSubstr("backward"));
  EXPECT_THAT(r.out, HasSubstr("layers by saved bytes"));
  EXPECT_THAT(r.out, HasSubstr("Fit: FITS on a100-80gb"));
  EXPECT_THAT(r.out, HasSubstr("headroom"));
  EXPECT_THAT(r.out, HasSubstr("GiB"));
  EXPECT_EQ(r.err, "");
}

TEST(CliTest, JsonIsTheProtoMappingWithTheBreakdown) {
  const RunResult r = Memest(SmallGpt2({"--local", "--json", "--capacity", "80GiB"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out);  // throws (fails) if not JSON
  ASSERT_TRUE(json.contains("breakdown")) << r.out;
  int64_t total = 0;
  for (const char* key : kCategoryJsonKeys) {
    ASSERT_TRUE(json["breakdown"].contains(key)) << key;
    total += JsonInt(json["breakdown"][key]);
  }
  EXPECT_GT(JsonInt(json["breakdown"]["parameters"]), 0);
  EXPECT_GT(JsonInt(json["breakdown"]["optimizerState"]), 0);
  // A small step peaks in the optimizer step, after activations are freed; the forward
  // phase's peak holds them.
  bool saw_forward = false;
  for (const auto& phase : json["phases"]) {
    if (phase["phase"] != "PHASE_FORWARD") continue;
    saw_forward = true;
    EXPECT_GT(JsonInt(phase["byCategory"]["activations"]), 0) << phase;
  }
  EXPECT_TRUE(saw_forward) << json["phases"];
  // The breakdown is what nvidia-smi would show: reserved + context, i.e. the fit's need.
  EXPECT_EQ(total, JsonInt(json["fit"]["requiredBytes"]));
  EXPECT_TRUE(json["fit"]["fits"].get<bool>());
  EXPECT_GT(JsonInt(json["peak"]["allocatedBytes"]), 0);
  EXPECT_GT(JsonInt(json["parameterCount"]), 100'000'000);  // GPT-2 small: 124M
}

TEST(CliTest, NoDeviceMeansExitZeroAndNoVerdict) {
  const RunResult r = Memest(SmallGpt2({"--local"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Fit: no device given"));
}

// Every model file in examples/ estimates, and the table names its layers.
struct ExampleCase {
  const char* file;
  const char* scope;  // a scope the table must list
};

class ExampleModelTest : public ::testing::TestWithParam<ExampleCase> {};

TEST_P(ExampleModelTest, EstimatesLocally) {
  const ExampleCase& c = GetParam();
  const RunResult r = Memest({"estimate", "--local", "--model", kSourceDir + "/examples/" + c.file,
                              "--batch", "64", "--optimizer", "adam"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("layer"));
  EXPECT_THAT(r.out, HasSubstr(c.scope));
  EXPECT_THAT(r.out, HasSubstr("activations"));
}

INSTANTIATE_TEST_SUITE_P(Examples, ExampleModelTest,
                         ::testing::Values(ExampleCase{"mlp.json", "fc1"},
                                           ExampleCase{"mlp.yaml", "fc1"},
                                           ExampleCase{"swish.json", "act"}));

// examples/mlp.yaml is examples/mlp.json in YAML: the answers are the same to the byte.
TEST(CliTest, YamlAndJsonModelFilesAgree) {
  auto estimate = [](const std::string& file) {
    const RunResult r = Memest({"estimate", "--local", "--model", kSourceDir + "/examples/" + file,
                                "--batch", "64", "--json", "--no-advice"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  EXPECT_EQ(estimate("mlp.yaml"), estimate("mlp.json"));
}

TEST(CliTest, YamlSyntaxErrorNamesFileAndLine) {
  const std::string path =
      WriteTempFile("bad-model.yaml", "layers:\n  input_shape: [8\n  loss: sum\n");
  const RunResult r = Memest({"estimate", "--local", "--model", path});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, HasSubstr(path));
  EXPECT_THAT(r.err, HasSubstr("line"));
}

// What the README says of examples/swish.json: the advice names silu.
TEST(CliTest, SwishExampleAdvisesSilu) {
  const RunResult r = Memest({"estimate", "--local", "--model", kSourceDir + "/examples/swish.json",
                              "--batch", "4096", "--optimizer", "adam"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Advice:"));
  EXPECT_THAT(r.out, HasSubstr("silu"));
}

TEST(CliTest, DoesNotFitExitsTwo) {
  const RunResult r = Memest({"estimate", "--local", "--model", kSourceDir + "/examples/mlp.json",
                              "--batch", "64", "--capacity", "100MiB"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("DOES NOT FIT"));
  EXPECT_THAT(r.out, HasSubstr("short by"));

  // A large preset on a small card, the same way.
  const RunResult big = Memest({"estimate", "--local", "--preset", "gpt2-small", "--batch", "64",
                                "--seq", "1024", "--device", "rtx4090", "--no-advice"});
  EXPECT_EQ(big.exit_code, 2) << big.out << big.err;
}

// Bad input: exit code 3, and stderr names what was wrong.
struct BadInputCase {
  const char* name;
  std::vector<std::string> args;
  const char* names;  // what stderr must mention
};

class BadInputTest : public ::testing::TestWithParam<BadInputCase> {};

TEST_P(BadInputTest, ExitsThreeNamingTheField) {
  const BadInputCase& c = GetParam();
  std::vector<std::string> args = c.args;
  args.push_back("--local");
  const RunResult r = Memest(args);
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr(c.names));
  EXPECT_EQ(r.out, "");
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadInputTest,
    ::testing::Values(
        BadInputCase{
            "NegativeBatch", {"estimate", "--preset", "gpt2-small", "--batch=-4"}, "batch_size"},
        BadInputCase{
            "ZeroBatch", {"estimate", "--preset", "gpt2-small", "--batch", "0"}, "batch_size"},
        BadInputCase{"UnknownPreset", {"estimate", "--preset", "gpt5-huge"}, "gpt5-huge"},
        BadInputCase{"BadPresetParam",
                     {"estimate", "--preset", "gpt2-small", "--param", "seq=-7"},
                     "model.preset.params.seq"},
        BadInputCase{"MalformedParam",
                     {"estimate", "--preset", "gpt2-small", "--param", "seq=long"},
                     "--param seq"},
        BadInputCase{"UnknownPrecision",
                     {"estimate", "--preset", "gpt2-small", "--precision", "fp8"},
                     "--precision"},
        BadInputCase{"UnknownOptimizer",
                     {"estimate", "--preset", "gpt2-small", "--optimizer", "adamax"},
                     "--optimizer"},
        BadInputCase{"UnknownDevice",
                     {"estimate", "--preset", "gpt2-small", "--device", "tpu-v5"},
                     "tpu-v5"},
        BadInputCase{"BadCapacity",
                     {"estimate", "--preset", "gpt2-small", "--capacity", "80 parsecs"},
                     "--capacity"},
        BadInputCase{
            "OptimizerInInference",
            {"estimate", "--preset", "gpt2-small", "--mode", "inference", "--optimizer", "adam"},
            "config.optimizer.kind"},
        BadInputCase{"CheckpointInInference",
                     {"estimate", "--preset", "gpt2-small", "--mode", "inference", "--checkpoint",
                      "every-block"},
                     "config.checkpoint.policy"},
        BadInputCase{"KeepGradsInInference",
                     {"estimate", "--preset", "mlp", "--mode", "inference", "--keep-grads"},
                     "config.zero_grad_keep_grads"},
        BadInputCase{"HoldOutputsInInference",
                     {"estimate", "--preset", "mlp", "--mode", "inference", "--no-hold-outputs"},
                     "config.hold_outputs"},
        BadInputCase{"HoldOutputsBothWays",
                     {"estimate", "--preset", "mlp", "--hold-outputs", "--no-hold-outputs"},
                     "--hold-outputs and --no-hold-outputs"},
        BadInputCase{"GenerateTokensInTraining",
                     {"estimate", "--preset", "gpt2-small", "--generate-tokens", "8"},
                     "config.generate_tokens"},
        BadInputCase{
            "GenerateTokensWithoutKvCache",
            {"estimate", "--preset", "mlp", "--mode", "inference", "--generate-tokens", "8"},
            "config.generate_tokens"},
        BadInputCase{"CheckpointKBeyondBlocks",
                     {"estimate", "--preset", "gpt2-small", "--checkpoint", "every-k",
                      "--checkpoint-k", "40"},
                     "config.checkpoint.every_k: 40 is more than the model's 12 blocks"},
        BadInputCase{"CheckpointKWithoutEveryK",
                     {"estimate", "--preset", "gpt2-small", "--checkpoint-k", "2"},
                     "config.checkpoint.every_k"},
        BadInputCase{
            "ExpandableSegmentsOnCpu",
            {"estimate", "--preset", "mlp", "--runtime", "cpu-1.13", "--expandable-segments"},
            "config.expandable_segments"},
        BadInputCase{"GpuOnCpu",
                     {"estimate", "--preset", "mlp", "--runtime", "cpu-1.13", "--device", "a100"},
                     "config.device_name"},
        BadInputCase{
            "EmptyDevice", {"estimate", "--preset", "mlp", "--device", ""}, "config.device_name"},
        BadInputCase{"NoModel", {"estimate", "--batch", "8"}, "--preset, --model or --hf-config"},
        BadInputCase{
            "MissingModelFile", {"estimate", "--model", "/nonexistent/model.json"}, "--model"},
        BadInputCase{
            "HfConfigWithoutSeq",
            {"estimate", "--hf-config", kSourceDir + "/tests/data/hf_configs/llama-3.2-1b.json"},
            "model.hf_config.seq: required"},
        BadInputCase{
            "HfConfigWithParam",
            {"estimate", "--hf-config", kSourceDir + "/tests/data/hf_configs/llama-3.2-1b.json",
             "--seq", "128", "--param", "layers=2"},
            "--param: only applies to --preset"},
        BadInputCase{"PresetAndHfConfig",
                     {"estimate", "--preset", "mlp", "--hf-config",
                      kSourceDir + "/tests/data/hf_configs/gpt2.json"},
                     "--preset and --hf-config: give one model"},
        BadInputCase{"MissingHfConfig",
                     {"estimate", "--hf-config", "/nonexistent/config.json", "--seq", "8"},
                     "--hf-config /nonexistent/config.json: cannot open"},
        BadInputCase{
            "UnknownFlag", {"estimate", "--preset", "gpt2-small", "--frobnicate"}, "--frobnicate"},
        BadInputCase{"NoSubcommand", {}, "subcommand"}),
    [](const ::testing::TestParamInfo<BadInputCase>& info) { return info.param.name; });

// A Hugging Face config describing a preset's model estimates as the preset does, to the byte:
// the presets are names over the builders the configs use.
TEST(CliTest, HfConfigsEstimateAsTheirPresets) {
  auto estimate = [](std::vector<std::string> model) {
    std::vector<std::string> args = {"estimate",    "--local", "--batch", "2",
                                     "--precision", "bf16",    "--json",  "--no-advice"};
    args.insert(args.end(), model.begin(), model.end());
    const RunResult r = Memest(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const std::string dir = kSourceDir + "/tests/data/hf_configs/";
  EXPECT_EQ(estimate({"--hf-config", dir + "llama-2-7b.json", "--seq", "2048"}),
            estimate({"--preset", "llama-7b", "--seq", "2048"}));
  EXPECT_EQ(estimate({"--hf-config", dir + "gpt2.json", "--seq", "1024"}),
            estimate({"--preset", "gpt2-small", "--seq", "1024"}));
}

// Training Gemma 2 under SDPA (the default on CUDA, as in transformers 5) says that transformers
// recommends eager attention for it, and how to estimate that; eager or inference say nothing.
TEST(CliTest, Gemma2TrainingUnderSdpaSaysEagerIsRecommended) {
  const std::string config = kSourceDir + "/tests/data/hf_configs/gemma-2-2b.json";
  auto recommends_eager = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"estimate", "--local", "--hf-config", config,
                                     "--seq",    "64",      "--json",      "--no-advice"};
    args.insert(args.end(), extra.begin(), extra.end());
    const RunResult r = Memest(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    for (const auto& note : nlohmann::json::parse(r.out).value("notes", nlohmann::json::array())) {
      if (note.get<std::string>().find("recommends training with eager") != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  EXPECT_TRUE(recommends_eager({}));
  EXPECT_FALSE(recommends_eager({"--attention", "eager"}));
  EXPECT_FALSE(recommends_eager({"--mode", "inference"}));
}

// A model's directory is read through its config.json.
TEST(CliTest, HfConfigDirectoryReadsItsConfigJson) {
  const std::string dir = kSourceDir + "/tests/data/hf_configs";
  const std::string model_dir = ::testing::TempDir() + "/hf-model";
  std::filesystem::create_directories(model_dir);
  std::filesystem::copy_file(dir + "/gpt2.json", model_dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  const RunResult r = Memest(
      {"estimate", "--local", "--hf-config", model_dir, "--seq", "64", "--json", "--no-advice"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("parameterCount"), "124439808");
  const RunResult empty = Memest({"estimate", "--local", "--hf-config", dir, "--seq", "64"});
  EXPECT_EQ(empty.exit_code, 3);
  EXPECT_THAT(empty.err, HasSubstr("the directory has no config.json"));
}

TEST(CliTest, HfConfigThatIsNotJsonNamesTheFile) {
  const std::string path = WriteTempFile("config.json", "{\"model_type\": \"llama\",");
  const RunResult r = Memest({"estimate", "--local", "--hf-config", path, "--seq", "8"});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, HasSubstr("--hf-config " + path + ": not a JSON object"));
}

TEST(CliTest, BadModelFileNamesTheFile) {
  const std::string path =
      WriteTempFile("bad-model.json", "{\"layers\": {\"inputShape\": [8], \"layerz\": []}}");
  const RunResult r = Memest({"estimate", "--local", "--model", path});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, HasSubstr(path));
}

TEST(CliTest, HelpDocumentsExitCodes) {
  const RunResult r = Memest({"estimate", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("Exit codes"));
  EXPECT_THAT(r.out, HasSubstr("does not fit"));
  EXPECT_THAT(r.out, HasSubstr("--checkpoint"));
}

// Every binary says which build it is: the project's version and the commit (git describe,
// "-dirty" for a changed tree, "unknown" outside a checkout), and exits 0.
TEST(CliTest, EveryBinaryPrintsItsVersion) {
  const std::string worker = kServer.substr(0, kServer.rfind('/') + 1) + "memest-validate-worker";
  for (const auto& [binary, name] : std::vector<std::pair<std::string, std::string>>{
           {kMemest, "memest"}, {kServer, "memest-server"}, {worker, "memest-validate-worker"}}) {
    const RunResult r = memest::testing::Run({binary, "--version"});
    EXPECT_EQ(r.exit_code, 0) << binary << ": " << r.err;
    EXPECT_THAT(r.out, ::testing::MatchesRegex(name + " [0-9]+\\.[0-9]+\\.[0-9]+ \\(commit "
                                                      "([0-9a-f]+(-dirty)?|unknown)\\)\n"))
        << r.out;
  }
}

TEST(CliTest, PresetsAndDevicesLocally) {
  const RunResult presets = Memest({"presets", "--local"});
  ASSERT_EQ(presets.exit_code, 0) << presets.err;
  EXPECT_THAT(presets.out, HasSubstr("gpt2-small"));
  EXPECT_THAT(presets.out, HasSubstr("seq"));

  const RunResult devices = Memest({"devices", "--local", "--json"});
  ASSERT_EQ(devices.exit_code, 0) << devices.err;
  const nlohmann::json json = nlohmann::json::parse(devices.out);
  bool found = false;
  for (const auto& device : json["devices"]) {
    if (device["name"] == "a100-80gb") {
      found = true;
      EXPECT_GT(JsonInt(device["capacityBytes"]), int64_t{79} << 30);
    }
  }
  EXPECT_TRUE(found) << devices.out;
}

TEST(CliTest, UnreachableServerExitsFour) {
  // Port 1 (tcpmux) is not served here; the connection is refused at once.
  const RunResult r = Memest(
      {"estimate", "--preset", "gpt2-small", "--server", "127.0.0.1:1", "--deadline-ms", "3000"});
  EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("127.0.0.1:1"));
}

// The address a started memest-server listens on, once it says so ("" if it never does).
std::string ListeningAddress(Child& server) {
  EXPECT_TRUE(server.started());
  return server.WaitForLine("memest-server listening on ", std::chrono::seconds(20));
}

// A server with --auth-token-file answers the CLI that passes its token, refuses one that does
// not (UNAUTHENTICATED, exit 4), and an unreadable token file is bad input (exit 3).
TEST(CliTest, BearerTokenAgainstRealServer) {
  const std::string token = WriteTempFile("server-token", "cli-s3cret\n");
  Child server({kServer, "--address", "127.0.0.1:0", "--auth-token-file", token});
  const std::string address = ListeningAddress(server);
  ASSERT_THAT(address, HasSubstr("127.0.0.1:")) << server.Output();
  const RunResult ok = Memest({"devices", "--server", address, "--auth-token-file", token});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  const RunResult none = Memest({"devices", "--server", address});
  EXPECT_EQ(none.exit_code, 4) << none.err;
  EXPECT_THAT(none.err, HasSubstr("UNAUTHENTICATED"));
  const RunResult unreadable =
      Memest({"devices", "--server", address, "--auth-token-file", "/nonexistent/token"});
  EXPECT_EQ(unreadable.exit_code, 3) << unreadable.err;
  EXPECT_THAT(unreadable.err, HasSubstr("--auth-token-file"));
}

// --layer-rows N keeps the N layers that hold the most; 0 leaves the table out.
TEST(CliTest, LayerRowsCutsThePerLayerTable) {
  const auto rows = [](const std::string& n) {
    const RunResult r = Memest({"estimate", "--local", "--preset", "gpt2-small", "--batch", "2",
                                "--no-advice", "--json", "--layer-rows", n});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json out = nlohmann::json::parse(r.out);
    return out.contains("layers") ? out["layers"].size() : size_t{0};
  };
  EXPECT_EQ(rows("2"), 2u);
  EXPECT_EQ(rows("0"), 0u);
  const RunResult bad =
      Memest({"estimate", "--local", "--preset", "gpt2-small", "--layer-rows", "-3"});
  EXPECT_EQ(bad.exit_code, 3) << bad.err;
  EXPECT_THAT(bad.err, HasSubstr("max_layer_rows"));
}

// memest plan --brief: each plan on one line for scripts (deploy/slurm/job_submit.lua reads
// it), exit 0 when one fits and 2 with one line when none does.
TEST(CliTest, PlanBriefPrintsOneLineAPlan) {
  const std::vector<std::string> llama = {
      "plan",        "--local", "--preset", "llama-7b",  "--seq",       "2048", "--batch", "16",
      "--precision", "bf16",    "--device", "h100-80gb", "--max-plans", "1",    "--brief"};
  std::vector<std::string> eight = llama;
  eight.insert(eight.end(), {"--gpus", "8"});
  const RunResult fits = Memest(eight);
  EXPECT_EQ(fits.exit_code, 0) << fits.err;
  EXPECT_THAT(fits.out, ::testing::MatchesRegex(
                            "[0-9]+ x h100-80gb: dp x tp x pp [0-9]+ x [0-9]+ x [0-9]+[^\n]*, "
                            "micro-batch [0-9]+ x [0-9]+[^\n]*, needs [0-9.]+ GiB a GPU\n"));
  std::vector<std::string> one = llama;
  one.insert(one.end(), {"--gpus", "1"});
  const RunResult none = Memest(one);
  EXPECT_EQ(none.exit_code, 2) << none.err;
  EXPECT_EQ(none.out, "no plan fits within 1 GPUs\n");
}

// Mutual TLS: the CLI with the server's CA and its own certificate gets an answer; without its
// certificate, or trusting another CA, it cannot connect (UNAVAILABLE, exit 4); a flag's file
// that cannot be read is bad input naming the flag (exit 3).
TEST(CliTest, MutualTlsAgainstRealServer) {
  char pattern[] = "/tmp/memest-cli-tls.XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  testing::TestCa ca("cli test CA"), other("another CA");
  ca.WriteCertificate(dir + "/ca.pem");
  other.WriteCertificate(dir + "/other.pem");
  ca.Issue(dir + "/server.pem", dir + "/server.key", "memest-server");
  ca.Issue(dir + "/client.pem", dir + "/client.key", "trainer-1");
  Child server({kServer, "--address", "127.0.0.1:0", "--tls-cert", dir + "/server.pem", "--tls-key",
                dir + "/server.key", "--tls-client-ca", dir + "/ca.pem"});
  const std::string address = ListeningAddress(server);
  ASSERT_THAT(address, HasSubstr("127.0.0.1:")) << server.Output();
  const std::vector<std::string> devices = {"devices", "--server", address};
  const auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = devices;
    args.insert(args.end(), extra.begin(), extra.end());
    return Memest(args);
  };
  const RunResult ok = with({"--tls-ca", dir + "/ca.pem", "--tls-cert", dir + "/client.pem",
                             "--tls-key", dir + "/client.key"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("h100-80gb"));
  const RunResult plaintext = with({"--deadline-ms", "3000"});
  EXPECT_EQ(plaintext.exit_code, 4) << plaintext.err;
  const RunResult no_cert = with({"--tls-ca", dir + "/ca.pem", "--deadline-ms", "3000"});
  EXPECT_EQ(no_cert.exit_code, 4) << no_cert.err;
  const RunResult untrusted =
      with({"--tls-ca", dir + "/other.pem", "--tls-cert", dir + "/client.pem", "--tls-key",
            dir + "/client.key", "--deadline-ms", "3000"});
  EXPECT_EQ(untrusted.exit_code, 4) << untrusted.err;
  const RunResult missing = with({"--tls-ca", dir + "/missing.pem"});
  EXPECT_EQ(missing.exit_code, 3) << missing.err;
  EXPECT_THAT(missing.err, HasSubstr("--tls-ca: cannot read"));
  const RunResult half = with({"--tls-ca", dir + "/ca.pem", "--tls-cert", dir + "/client.pem"});
  EXPECT_EQ(half.exit_code, 3) << half.err;
  EXPECT_THAT(half.err, HasSubstr("--tls-key: mutual TLS needs both --tls-cert and --tls-key"));
  std::filesystem::remove_all(dir);
}

// The real server on port 0: the CLI's answers over gRPC equal the local ones, errors keep
// their field names and exit codes, and SIGTERM stops the server cleanly.
TEST(CliTest, AgainstRealServer) {
  Child server({kServer, "--address", "127.0.0.1:0"});
  const std::string address = ListeningAddress(server);
  ASSERT_THAT(address, HasSubstr("127.0.0.1:")) << server.Output();

  const RunResult remote = Memest(SmallGpt2({"--server", address, "--json"}));
  ASSERT_EQ(remote.exit_code, 0) << remote.err;
  const RunResult local = Memest(SmallGpt2({"--local", "--json"}));
  ASSERT_EQ(local.exit_code, 0) << local.err;
  EXPECT_EQ(nlohmann::json::parse(remote.out), nlohmann::json::parse(local.out));

  const RunResult table = Memest(SmallGpt2({"--server", address, "--capacity", "1GiB"}));
  EXPECT_EQ(table.exit_code, 2) << table.err;
  EXPECT_THAT(table.out, HasSubstr("DOES NOT FIT"));

  const RunResult bad =
      Memest({"estimate", "--server", address, "--preset", "gpt2-small", "--batch=-4"});
  EXPECT_EQ(bad.exit_code, 3);
  EXPECT_THAT(bad.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(bad.err, HasSubstr("batch_size"));

  const RunResult presets = Memest({"presets", "--server", address});
  EXPECT_EQ(presets.exit_code, 0) << presets.err;
  EXPECT_THAT(presets.out, HasSubstr("gpt2-small"));
  const RunResult devices = Memest({"devices", "--server", address});
  EXPECT_EQ(devices.exit_code, 0) << devices.err;
  EXPECT_THAT(devices.out, HasSubstr("h100-80gb"));

  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.Output();
}

// `memest validate` against a server whose worker runs a fake device: the table, the JSON
// mapping, progress on stderr; and the refusals (no --device, --local).
TEST(CliTest, ValidateAgainstAServerWithAFakeDevice) {
  Child server({kServer, "--address", "127.0.0.1:0", "--device", "0",
                "--validate-worker-arg=--fake-device-gib=16"});
  const std::string address = ListeningAddress(server);
  ASSERT_THAT(address, HasSubstr("127.0.0.1:")) << server.Output();

  const std::vector<std::string> model = {"--preset", "gpt2-small", "--seq", "128",      "--batch",
                                          "2",        "--repeats",  "1",     "--server", address};
  std::vector<std::string> args = {"validate"};
  args.insert(args.end(), model.begin(), model.end());
  const RunResult table = Memest(args);
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("validated on memest fake device"));
  EXPECT_THAT(table.out, HasSubstr("peak allocated"));
  EXPECT_THAT(table.out, HasSubstr("device total (nvidia-smi)"));
  EXPECT_THAT(table.out, HasSubstr("Kernel time of the step"));
  EXPECT_THAT(table.err, HasSubstr("replaying"));

  args.push_back("--json");
  args.push_back("--quiet");
  const RunResult json = Memest(args);
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_EQ(json.err, "");
  const nlohmann::json j = nlohmann::json::parse(json.out);
  EXPECT_EQ(JsonInt(j["peakAllocated"]["predictedBytes"]),
            JsonInt(j["peakAllocated"]["measuredBytes"]));
  EXPECT_GT(j["ops"].size(), 100u);

  const RunResult too_big =
      Memest({"validate", "--preset", "gpt2-large", "--batch", "16", "--server", address, "-q"});
  EXPECT_EQ(too_big.exit_code, 3) << too_big.err;  // FAILED_PRECONDITION: the request, as asked
  EXPECT_THAT(too_big.err, HasSubstr("short by"));
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.Output();

  const RunResult local = Memest({"validate", "--preset", "mlp", "--local"});
  EXPECT_EQ(local.exit_code, 4) << local.err;
  EXPECT_THAT(local.err, HasSubstr("--local cannot validate"));
}

TEST(CliTest, ValidateWithoutADeviceIsUnavailable) {
  Child server({kServer, "--address", "127.0.0.1:0"});
  const std::string address = ListeningAddress(server);
  const RunResult r = Memest({"validate", "--preset", "mlp", "--server", address});
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_THAT(r.err, HasSubstr("without --device"));
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.Output();
}

}  // namespace
}  // namespace memest
