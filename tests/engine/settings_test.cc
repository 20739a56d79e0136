// Settings that do not apply to the mode, runtime or model they come with are refused, naming
// the field (engine/ir/config.h ValidateSettingsApply, engine/passes/checkpoint_rules.h,
// BuildGraph's KV cache check); what does apply is accepted.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/estimator.h"
#include "engine/passes/checkpoint_rules.h"

namespace memest {
namespace {

RunConfig Inference() {
  RunConfig c;
  c.mode = Mode::kInference;
  return c;
}

RunConfig Cpu() {
  RunConfig c;
  c.runtime = Runtime::kCpuTorch113;
  return c;
}

ModelSpec Preset(const std::string& name, std::map<std::string, int64_t> params = {}) {
  return ModelSpec{PresetSpec{name, std::move(params)}};
}

// The first error's message starts with `field`.
void ExpectRefused(const Status& status, const std::string& field) {
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_EQ(status.message().rfind(field + ":", 0), 0u) << status.message();
}

TEST(SettingsTest, RefusesSettingsThatDoNotApply) {
  struct Case {
    const char* field;
    std::function<void(RunConfig&)> set;
    RunConfig base;
  };
  const std::vector<Case> cases = {
      {"config.generate_tokens", [](RunConfig& c) { c.generate_tokens = 8; }, RunConfig()},
      {"config.zero_grad_keep_grads", [](RunConfig& c) { c.zero_grad_set_to_none = false; },
       Inference()},
      {"config.step", [](RunConfig& c) { c.step = StepKind::kFirstStep; }, Inference()},
      {"config.checkpoint.scopes", [](RunConfig& c) { c.checkpoint.scopes = {"h.0"}; },
       RunConfig()},
      {"config.checkpoint.non_reentrant", [](RunConfig& c) { c.checkpoint.non_reentrant = true; },
       RunConfig()},
      {"config.expandable_segments", [](RunConfig& c) { c.expandable_segments = true; }, Cpu()},
      {"config.device_name", [](RunConfig& c) { c.device = "a100"; }, Cpu()},
      {"config.optimizer.impl", [](RunConfig& c) { c.optimizer.impl = OptimizerImpl::kFused; },
       Cpu()},
      {"config.precision", [](RunConfig& c) { c.precision = Precision::kFp16Amp; }, Cpu()},
      {"config.precision", [](RunConfig& c) { c.precision = Precision::kFp16Pure; }, Cpu()},
      {"config.cpu_l2_cache_bytes", [](RunConfig& c) { c.cpu_l2_bytes = 2 << 20; }, RunConfig()},
      {"config.cpu_l1_cache_bytes", [](RunConfig& c) { c.cpu_l1_bytes = -1; }, Cpu()},
      {"config.cpu_l2_cache_bytes", [](RunConfig& c) { c.cpu_l2_bytes = kMaxCpuCacheBytes + 1; },
       Cpu()},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    RunConfig config = c.base;
    ASSERT_TRUE(ValidateRunConfig(config).ok());
    c.set(config);
    ExpectRefused(ValidateRunConfig(config), c.field);
  }
}

TEST(SettingsTest, AcceptsWhatApplies) {
  RunConfig generate = Inference();
  generate.generate_tokens = kMaxGenerateTokens;
  EXPECT_TRUE(ValidateRunConfig(generate).ok());
  RunConfig keep = RunConfig();
  keep.zero_grad_set_to_none = false;
  keep.step = StepKind::kFirstStep;
  keep.checkpoint = {CheckpointPolicy::kScopes, 1, {"h.0"}, /*non_reentrant=*/true};
  keep.expandable_segments = true;
  keep.optimizer.impl = OptimizerImpl::kFused;
  EXPECT_TRUE(ValidateRunConfig(keep).ok());
  keep.precision = Precision::kFp16Amp;
  EXPECT_TRUE(ValidateRunConfig(keep).ok());
  RunConfig cpu = Cpu();
  cpu.device_capacity_bytes = int64_t{8} << 30;  // a host memory budget
  cpu.precision = Precision::kBf16Amp;
  EXPECT_TRUE(ValidateRunConfig(cpu).ok());
}

TEST(SettingsTest, GenerateTokensIsBounded) {
  RunConfig c = Inference();
  c.generate_tokens = kMaxGenerateTokens + 1;
  ExpectRefused(ValidateRunConfig(c), "config.generate_tokens");
  c.generate_tokens = INT64_MAX;  // seq + generate_tokens would overflow
  ExpectRefused(ValidateRunConfig(c), "config.generate_tokens");
  c.checkpoint.scopes = {""};
  c.checkpoint.policy = CheckpointPolicy::kScopes;
  c.generate_tokens = 0;
  c.mode = Mode::kTraining;
  ExpectRefused(ValidateRunConfig(c), "config.checkpoint.scopes[0]");
}

TEST(SettingsTest, GeneratedTokensNeedAKvCache) {
  RunConfig c = Inference();
  c.generate_tokens = 4;
  const EstimateOptions quick{EstimateOptions{}.max_ops, /*advice=*/false};
  EXPECT_TRUE(Estimate(Preset("gpt2-small", {{"layers", 1}, {"seq", 16}}), c, quick).ok());
  const std::vector<ModelSpec> without_cache = {
      Preset("mlp", {{"layers", 1}}), Preset("bert-base", {{"layers", 1}, {"seq", 16}}),
      Preset("resnet18", {{"image", 32}}), Preset("vit-b16", {{"layers", 1}, {"image", 32}}),
      ModelSpec{LayerModelSpec{
          {4, 8}, DType::kFloat32, {{"transformer_block", "", {{"heads", int64_t{2}}}}}}}};
  for (const ModelSpec& model : without_cache) {
    ExpectRefused(Estimate(model, c, quick).status(), "config.generate_tokens");
  }
}

TEST(SettingsTest, BlockPoliciesMustFitTheBlocks) {
  Graph g;
  CheckpointConfig every_block{CheckpointPolicy::kEveryBlock};
  ExpectRefused(CheckBlockPolicy(g, every_block), "config.checkpoint.policy");
  CheckpointConfig sqrt{CheckpointPolicy::kSqrtBlocks};
  ExpectRefused(CheckBlockPolicy(g, sqrt), "config.checkpoint.policy");
  EXPECT_TRUE(CheckBlockPolicy(g, CheckpointConfig{}).ok());  // no policy, nothing to fit

  g.blocks = {"h.0", "h.1", "h.2"};
  CheckpointConfig every_k{CheckpointPolicy::kEveryKBlocks, 3};
  EXPECT_TRUE(CheckBlockPolicy(g, every_k).ok());  // one region of all three
  every_k.every_k = 4;
  const Status too_many = CheckBlockPolicy(g, every_k);
  ExpectRefused(too_many, "config.checkpoint.every_k");
  EXPECT_EQ(too_many.message(), "config.checkpoint.every_k: 4 is more than the model's 3 blocks");
  every_k.every_k = INT64_MAX;
  ExpectRefused(CheckBlockPolicy(g, every_k), "config.checkpoint.every_k");
}

// A bare capacity with the CPU runtime is a host memory budget: the fit counts the step's
// tensors and no CUDA context.
TEST(SettingsTest, CpuCapacityCountsNoCudaContext) {
  RunConfig c = Cpu();
  c.device_capacity_bytes = int64_t{1} << 30;
  const EstimateOptions quick{EstimateOptions{}.max_ops, /*advice=*/false};
  StatusOr<Report> r = Estimate(Preset("mlp"), c, quick);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->fit.has_value());
  EXPECT_EQ(r->fit->required_bytes, r->peak_reserved_bytes);
  EXPECT_EQ(r->fit->headroom_bytes, c.device_capacity_bytes - r->peak_reserved_bytes);
  EXPECT_EQ(r->breakdown[static_cast<int>(Category::kCudaContext)], 0);
}

}  // namespace
}  // namespace memest
