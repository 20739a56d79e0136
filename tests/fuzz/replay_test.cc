// Replays every committed fuzz input (fuzz/corpus: the seeds; fuzz/regressions: what fuzzing
// found, once it passes) through the Estimate target with the ordinary compiler, one test per
// file; and checks the target's checks. fuzz/findings holds inputs that still fail: they are
// not replayed here until the engine is fixed and they move to fuzz/regressions.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/estimate_target.h"
#include "memest/v1/memest.pb.h"

namespace memest::fuzz {
namespace {

namespace fs = std::filesystem;

const fs::path kFuzzDir = MEMEST_FUZZ_DIR;

// The input files of one directory of fuzz/, sorted; READMEs are not inputs.
std::vector<fs::path> InputsIn(const std::string& directory) {
  std::vector<fs::path> inputs;
  if (!fs::is_directory(kFuzzDir / directory)) return inputs;
  for (const auto& entry : fs::directory_iterator(kFuzzDir / directory)) {
    if (entry.is_regular_file() && entry.path().extension() != ".md") {
      inputs.push_back(entry.path());
    }
  }
  std::sort(inputs.begin(), inputs.end());
  return inputs;
}

std::vector<fs::path> ReplayedInputs() {
  std::vector<fs::path> inputs = InputsIn("corpus");
  for (fs::path& p : InputsIn("regressions")) inputs.push_back(std::move(p));
  return inputs;
}

std::string ReadBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class ReplayTest : public testing::TestWithParam<fs::path> {};

TEST_P(ReplayTest, PassesTheTargetsChecks) {
  const std::string bytes = ReadBytes(GetParam());
  const std::string broken =
      FuzzEstimateOnce(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  EXPECT_EQ(broken, "") << GetParam();
}

// "corpus_gpt2_bf16_amp_pb": a test name from a file's directory and name.
std::string TestName(const testing::TestParamInfo<fs::path>& info) {
  std::string name =
      info.param.parent_path().filename().string() + "_" + info.param.filename().string();
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name + "_" + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(Inputs, ReplayTest, testing::ValuesIn(ReplayedInputs()), TestName);

TEST(ReplayCorpusTest, SeedsCoverEveryModelSource) {
  int sources[4] = {0, 0, 0, 0};
  const std::vector<fs::path> seeds = InputsIn("corpus");
  for (const fs::path& path : seeds) {
    v1::EstimateRequest request;
    ASSERT_TRUE(request.ParseFromString(ReadBytes(path))) << path;
    ++sources[request.model().source_case()];
  }
  EXPECT_GE(seeds.size(), 30u);
  EXPECT_GT(sources[v1::Model::kPreset], 0);
  EXPECT_GT(sources[v1::Model::kLayers], 0);
  EXPECT_GT(sources[v1::Model::kOps], 0);
}

// A plausible answer for a training request of batch 8 on a named device.
void PlausibleAnswer(v1::EstimateRequest* request, v1::EstimateResponse* response) {
  request->mutable_model()->mutable_preset()->set_name("gpt2-small");
  request->mutable_config()->set_batch_size(8);
  request->mutable_config()->set_device_name("a100-80gb");
  v1::Peak* peak = response->mutable_peak();
  peak->set_allocated_bytes(300);
  peak->set_reserved_bytes(400);
  peak->mutable_by_category()->set_parameters(100);
  peak->mutable_by_category()->set_activations(200);
  *response->add_phases() = *peak;
  response->set_peak_reserved_bytes(500);
  response->mutable_breakdown()->set_cuda_context(50);
  response->set_micro_batch(8);
  v1::DeviceFit* fit = response->mutable_fit();
  fit->set_capacity_bytes(1000);
  fit->set_required_bytes(550);
  fit->set_headroom_bytes(450);
  fit->set_fits(true);
}

TEST(CheckEstimateTest, PassesAPlausibleAnswer) {
  v1::EstimateRequest request;
  v1::EstimateResponse response;
  PlausibleAnswer(&request, &response);
  EXPECT_EQ(CheckEstimate(request, Status::Ok(), response), "");
}

TEST(CheckEstimateTest, NamesWhatIsWrongWithAnAnswer) {
  struct Case {
    const char* broken;
    void (*change)(v1::EstimateRequest*, v1::EstimateResponse*);
  };
  const Case cases[] = {
      {"peak: categories add up to 300, allocated_bytes is 299",
       [](auto*, auto* r) { r->mutable_peak()->set_allocated_bytes(299); }},
      {"peak: categories add up to 300, allocated_bytes is 301",
       [](auto* q, auto* r) {
         q->mutable_config()->set_runtime(v1::RUNTIME_CPU_TORCH_1_13);
         r->mutable_peak()->set_allocated_bytes(301);
         r->mutable_peak()->set_reserved_bytes(301);
       }},
      {"peak.reserved_bytes 600 > peak_reserved_bytes 500",
       [](auto*, auto* r) { r->mutable_peak()->set_reserved_bytes(600); }},
      {"phases[0].allocated_bytes 400 > peak.allocated_bytes 300",
       [](auto*, auto* r) {
         r->mutable_phases(0)->set_allocated_bytes(400);
         r->mutable_phases(0)->mutable_by_category()->set_inputs(100);
       }},
      {"micro_batch 8 * 2 steps is not batch 8",
       [](auto* q, auto*) { q->mutable_config()->set_grad_accum_steps(2); }},
      {"a fit although no device was named",
       [](auto* q, auto*) { q->mutable_config()->clear_device_name(); }},
      {"fit.required_bytes 550 is not peak_reserved_bytes 500 + cuda_context 60 + nccl 0",
       [](auto*, auto* r) { r->mutable_breakdown()->set_cuda_context(60); }},
      {"fit.required_bytes 550 is not peak_reserved_bytes 500 + cuda_context 50 + nccl 10",
       [](auto*, auto* r) { r->mutable_breakdown()->set_nccl(10); }},
      {"fit: capacity 1000, required 550, headroom 450, fits false",
       [](auto*, auto* r) { r->mutable_fit()->set_fits(false); }},
      {"advice[2] saves more than advice[1]",
       [](auto*, auto* r) {
         r->add_advice()->set_kind("peak");
         r->add_advice()->set_saving_bytes(10);
         r->add_advice()->set_saving_bytes(20);
       }},
  };
  for (const Case& c : cases) {
    v1::EstimateRequest request;
    v1::EstimateResponse response;
    PlausibleAnswer(&request, &response);
    c.change(&request, &response);
    EXPECT_EQ(CheckEstimate(request, Status::Ok(), response), c.broken);
  }
}

TEST(CheckEstimateTest, ARefusalNeedsAMessageAndIsNotInternal) {
  const v1::EstimateRequest request;
  const v1::EstimateResponse response;
  EXPECT_EQ(
      CheckEstimate(request, InvalidArgument("config.batch_size: must be positive"), response), "");
  EXPECT_EQ(CheckEstimate(request, InvalidArgument(""), response),
            "a refusal without a message (INVALID_ARGUMENT)");
  EXPECT_EQ(CheckEstimate(request, Internal("replay: op 3 reads a dropped tensor"), response),
            "INTERNAL: replay: op 3 reads a dropped tensor");
}

TEST(FuzzEstimateOnceTest, BytesThatDoNotParsePassAndAGoodRequestIsAnswered) {
  const std::string garbage = "\xff\xff\xff\xff";
  EXPECT_EQ(FuzzEstimateOnce(reinterpret_cast<const uint8_t*>(garbage.data()), garbage.size()), "");
  v1::EstimateRequest request;
  request.mutable_model()->mutable_preset()->set_name("mlp");
  request.mutable_config()->set_batch_size(4);
  request.mutable_config()->set_device_name("l4");
  const std::string bytes = request.SerializeAsString();
  EXPECT_EQ(FuzzEstimateOnce(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), "");
}

TEST(EstimateDictionaryTest, HoldsTheEnginesNames) {
  const std::vector<std::string> words = EstimateDictionary();
  for (const char* word : {"gpt2-small", "layers", "linear", "conv2d", "a100-80gb", "bfloat16",
                           "cross_entropy", "transformer_block"}) {
    EXPECT_NE(std::find(words.begin(), words.end(), word), words.end()) << word;
  }
}

}  // namespace
}  // namespace memest::fuzz
