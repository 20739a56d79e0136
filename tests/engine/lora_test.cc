// LoRA as PEFT adds it (engine/passes/lora.h): what trains and what it costs, the adapters'
// dtype, the modules matched as PEFT matches them, and the requests it refuses. The bytes
// against real PEFT are in tests/python/test_lora.py.
#include "engine/passes/lora.h"

#include <gtest/gtest.h>

#include <string>

#include "engine/estimator.h"

namespace memest {
namespace {

ModelSpec Preset(const std::string& name, std::map<std::string, int64_t> params = {}) {
  return ModelSpec{PresetSpec{name, std::move(params)}};
}

RunConfig Lora(int64_t rank, std::vector<std::string> targets, Precision precision = Precision::kFp32) {
  RunConfig c;
  c.batch_size = 1;
  c.precision = precision;
  c.lora.rank = rank;
  c.lora.target_modules = std::move(targets);
  return c;
}

int64_t TrainableOf(const ModelSpec& model, const RunConfig& config) {
  StatusOr<Graph> g = BuildStepGraph(model, config);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? g->TrainableParameterCount() : -1;
}

const Tensor* Named(const Graph& g, const std::string& name) {
  for (const Tensor& t : g.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// PEFT's print_trainable_parameters for Llama-2-7B: r=16 on q_proj and v_proj, 8,388,608;
// r=16 on all-linear, 39,976,960. The base stays in the count, frozen.
TEST(LoraTest, TrainableParametersAreTheAdaptersAsPeftCountsThem) {
  const ModelSpec llama = Preset("llama-7b", {{"seq", 128}});
  RunConfig base;
  StatusOr<Graph> plain = BuildStepGraph(llama, base);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(TrainableOf(llama, Lora(16, {"q_proj", "v_proj"})), 8'388'608);
  EXPECT_EQ(TrainableOf(llama, Lora(16, {"all-linear"})), 39'976'960);
  StatusOr<Graph> adapted = BuildStepGraph(llama, Lora(16, {"all-linear"}));
  ASSERT_TRUE(adapted.ok());
  EXPECT_EQ(adapted->ParameterCount(), plain->ParameterCount() + 39'976'960);
  // all-linear leaves the output layer alone.
  EXPECT_EQ(Named(*adapted, "lm_head.lora_A.default.weight"), nullptr);
  EXPECT_NE(Named(*adapted, "model.layers.31.mlp.down_proj.lora_B.default.weight"), nullptr);
}

// DoRA (use_dora) trains a magnitude per output feature of each adapted Linear beside its
// adapters (PEFT's print_trainable_parameters: 8,388,608 + 32 x 2 x 4,096), of the adapters'
// dtype; its forward recomputes the base linear, and keeps x_eye's product to its end.
TEST(LoraTest, DoraTrainsAMagnitudePerOutputFeature) {
  const ModelSpec llama = Preset("llama-7b", {{"seq", 128}});
  RunConfig c = Lora(16, {"q_proj", "v_proj"}, Precision::kBf16Pure);
  c.lora.use_dora = true;
  StatusOr<Graph> g = BuildStepGraph(llama, c);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->TrainableParameterCount(), 8'388'608 + 32 * 2 * 4096);
  const Tensor* magnitude =
      Named(*g, "model.layers.0.self_attn.q_proj.lora_magnitude_vector.default.weight");
  ASSERT_NE(magnitude, nullptr);
  EXPECT_EQ(magnitude->shape, (Shape{4096}));
  EXPECT_EQ(magnitude->dtype, DType::kFloat32);
  StatusOr<Report> dora = Estimate(llama, c);
  c.lora.use_dora = false;
  StatusOr<Report> plain = Estimate(llama, c);
  ASSERT_TRUE(dora.ok() && plain.ok());
  // Each adapted module saves the recomputed base output and lora_B's output beside the plain
  // adapters' tensors: 2 x [1, 128, 4096] in float32, 64 modules.
  EXPECT_GE(dora->saved_for_backward_bytes - plain->saved_for_backward_bytes,
            64 * 2 * 128 * 4096 * 4);
  // GPT-2's Conv1D: refused (docs/lora.md says why).
  RunConfig gpt2 = Lora(8, {"c_attn"});
  gpt2.lora.use_dora = true;
  StatusOr<Report> conv1d = Estimate(Preset("gpt2-small", {{"seq", 64}}), gpt2);
  ASSERT_FALSE(conv1d.ok());
  EXPECT_NE(conv1d.status().message().find("is a Conv1D"), std::string::npos);
}

// Only the adapters have gradients and optimizer state: AdamW's two float32 moments.
TEST(LoraTest, OnlyTheAdaptersHaveGradientsAndOptimizerState) {
  RunConfig c = Lora(8, {"c_attn"});
  c.optimizer.kind = OptimizerKind::kAdamW;
  StatusOr<Report> r = Estimate(Preset("gpt2-small", {{"seq", 64}}), c, {.advice = false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // c_attn: 768 -> 2304, rank 8, 12 blocks.
  const int64_t adapter = 12 * 8 * (768 + 2304);
  EXPECT_EQ(r->trainable_parameter_count, adapter);
  const auto& end = r->end_of_step;
  EXPECT_EQ(end[static_cast<int>(Category::kGradients)], 4 * adapter);
  EXPECT_GE(end[static_cast<int>(Category::kOptimizerState)], 2 * 4 * adapter);
  EXPECT_LT(end[static_cast<int>(Category::kOptimizerState)], 2 * 4 * adapter + 64 * 1024);
  bool noted = false;
  for (const std::string& n : r->notes) noted |= n.find("LoRA as PEFT") != std::string::npos;
  EXPECT_TRUE(noted);
}

// A frozen base keeps nothing for its weight's gradient: full fine-tuning saves more than the
// base with adapters, whose saved tensors are their inputs and low-rank intermediates.
TEST(LoraTest, AFrozenBaseSavesLessThanFullFineTuning) {
  const ModelSpec llama = Preset("llama-7b", {{"seq", 256}, {"layers", 2}});
  RunConfig full;
  StatusOr<Report> a = Estimate(llama, full, {.advice = false});
  StatusOr<Report> b = Estimate(llama, Lora(8, {"q_proj", "v_proj"}), {.advice = false});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_LT(b->saved_for_backward_bytes, a->saved_for_backward_bytes);
  EXPECT_LT(b->peak.allocated_bytes, a->peak.allocated_bytes);
}

// PEFT's autocast_adapter_dtype: a bf16 model's adapters are float32, and each adapted module's
// input is cast to float32 for them; the sum comes back to bf16. Off, they are bf16, no cast.
TEST(LoraTest, ABf16ModelsAdaptersAreFloat32UnlessKept) {
  const ModelSpec llama = Preset("llama-7b", {{"seq", 64}, {"layers", 1}});
  RunConfig c = Lora(8, {"o_proj"}, Precision::kBf16Pure);
  StatusOr<Graph> g = BuildStepGraph(llama, c);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Tensor* a = Named(*g, "model.layers.0.self_attn.o_proj.lora_A.default.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kFloat32);
  int casts = 0;
  for (const Op& op : g->ops) {
    if (op.scope == "model.layers.0.self_attn.o_proj" && op.kind == "to") ++casts;
  }
  EXPECT_EQ(casts, 2);  // the input up to float32, the sum back to bf16

  c.lora.autocast_adapter_dtype = false;
  g = BuildStepGraph(llama, c);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(Named(*g, "model.layers.0.self_attn.o_proj.lora_A.default.weight")->dtype,
            DType::kBFloat16);
  for (const Op& op : g->ops) {
    EXPECT_FALSE(op.scope == "model.layers.0.self_attn.o_proj" && op.kind == "to");
  }
}

// Under autocast a frozen weight is cast anew for each use (autocast caches only the casts of
// leaves that require grad); the adapters' weights are cached as before.
TEST(LoraTest, AutocastCachesOnlyTheAdaptersCasts) {
  StatusOr<Graph> g = BuildStepGraph(Preset("llama-7b", {{"seq", 64}, {"layers", 1}}),
                                     Lora(8, {"q_proj"}, Precision::kBf16Amp));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  int cached = 0;
  for (const Op& op : g->ops) {
    if (op.kind != "to" || !HasAttr(op.attrs, "autocast_weight")) continue;
    EXPECT_TRUE(g->tensors[op.inputs[0]].requires_grad) << g->tensors[op.inputs[0]].name;
    ++cached;
  }
  EXPECT_EQ(cached, 2);  // lora_A and lora_B of the one q_proj
}

// Every cast of a frozen weight has one reader: each op casts it anew.
TEST(LoraTest, EachReaderOfAFrozenWeightCastsItAnew) {
  StatusOr<Graph> g = BuildStepGraph(Preset("gpt2-small", {{"seq", 64}, {"layers", 2}}),
                                     Lora(8, {"c_attn"}, Precision::kFp16Amp));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  std::vector<int> readers(g->tensors.size(), 0);
  for (const Op& op : g->ops) {
    for (int t : op.inputs) ++readers[t];
  }
  int frozen_casts = 0;
  for (const Op& op : g->ops) {
    if (op.kind != "to" || g->tensors[op.inputs[0]].role != TensorRole::kParameter ||
        g->tensors[op.inputs[0]].requires_grad) {
      continue;
    }
    ++frozen_casts;
    EXPECT_EQ(readers[op.outputs[0]], 1) << g->tensors[op.inputs[0]].name;
  }
  EXPECT_GT(frozen_casts, 0);
}

// HF Conv1D under autocast reads its weight through autocast's cast: still a module LoRA adapts.
TEST(LoraTest, AdaptsConv1DUnderAutocast) {
  const ModelSpec gpt2 = Preset("gpt2-small", {{"seq", 64}, {"layers", 2}});
  for (Precision p : {Precision::kBf16Amp, Precision::kFp16Amp}) {
    EXPECT_EQ(TrainableOf(gpt2, Lora(8, {"c_attn"}, p)), 2 * 8 * (768 + 2304));
    EXPECT_EQ(TrainableOf(gpt2, Lora(8, {"all-linear"}, p)),
              2 * 8 * ((768 + 2304) + (768 + 768) + (768 + 3072) + (3072 + 768)));
  }
}

// PEFT's inject_adapter wraps a module of modules_to_save instead of adapting it, and fails on a
// target inside one.
TEST(LoraTest, AModuleToSaveIsNotAdapted) {
  const ModelSpec gpt2 = Preset("gpt2-small", {{"seq", 64}, {"layers", 1}});
  RunConfig c = Lora(8, {"c_attn", "c_proj"});
  c.lora.modules_to_save = {"c_attn"};
  StatusOr<Graph> g = BuildStepGraph(gpt2, c);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(Named(*g, "transformer.h.0.attn.c_attn.lora_A.default.weight"), nullptr);
  EXPECT_NE(Named(*g, "transformer.h.0.attn.c_attn.modules_to_save.default.weight"), nullptr);
  EXPECT_NE(Named(*g, "transformer.h.0.attn.c_proj.lora_A.default.weight"), nullptr);
  c.lora.modules_to_save = {"attn"};
  g = BuildStepGraph(gpt2, c);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("inside 'transformer.h.0.attn', which modules_to_save"),
            std::string::npos)
      << g.status().message();
}

// DeepSpeed casts the whole module to bf16, PEFT's float32 adapters too.
TEST(LoraTest, DeepSpeedCastsTheAdaptersToItsDtype) {
  RunConfig c = Lora(8, {"q_proj"}, Precision::kBf16Pure);
  c.parallelism.data = 2;
  c.parallelism.sharding = DataSharding::kDeepSpeedZero2;
  StatusOr<Graph> g = BuildStepGraph(Preset("llama-7b", {{"seq", 64}, {"layers", 1}}), c);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(Named(*g, "model.layers.0.self_attn.q_proj.lora_A.default.weight")->dtype,
            DType::kBFloat16);
}

// modules_to_save: a trainable copy beside the frozen original; GPT-2's tied lm_head gets a
// weight of its own, as PEFT's deepcopy makes.
TEST(LoraTest, ModulesToSaveTrainACopy) {
  const ModelSpec gpt2 = Preset("gpt2-small", {{"seq", 64}, {"layers", 1}});
  RunConfig c = Lora(4, {"c_attn"});
  const int64_t adapters = TrainableOf(gpt2, c);
  c.lora.modules_to_save = {"lm_head"};
  StatusOr<Graph> g = BuildStepGraph(gpt2, c);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->TrainableParameterCount(), adapters + 50257 * 768);
  const Tensor* copy = Named(*g, "lm_head.modules_to_save.default.weight");
  ASSERT_NE(copy, nullptr);
  EXPECT_TRUE(copy->requires_grad);
}

// Dropout on the adapters' input: lora_A keeps the dropped copy instead of the input, and
// autograd the mask (bool on CUDA) where the input requires grad. Block 0's input does not
// (the embedding is frozen, and no adapter runs before it), block 1's does.
TEST(LoraTest, DropoutKeepsItsMaskAndCopy) {
  const ModelSpec llama = Preset("llama-7b", {{"seq", 256}, {"layers", 2}});
  RunConfig c = Lora(8, {"v_proj"});
  StatusOr<Report> none = Estimate(llama, c, {.advice = false});
  c.lora.dropout = 0.1;
  StatusOr<Report> some = Estimate(llama, c, {.advice = false});
  ASSERT_TRUE(none.ok() && some.ok());
  EXPECT_EQ(some->saved_for_backward_bytes - none->saved_for_backward_bytes, 256 * 4096);
}

TEST(LoraTest, RunsWithCheckpointingPipelinesAndDataParallelism) {
  const ModelSpec llama = Preset("llama-7b", {{"seq", 128}, {"layers", 4}});
  RunConfig c = Lora(8, {"q_proj", "v_proj"});
  c.checkpoint.policy = CheckpointPolicy::kEveryBlock;
  EXPECT_TRUE(Estimate(llama, c, {.advice = false}).ok());
  c.checkpoint.policy = CheckpointPolicy::kNone;
  c.parallelism.data = 4;
  c.parallelism.sharding = DataSharding::kDdp;
  StatusOr<Report> ddp = Estimate(llama, c, {.advice = false});
  ASSERT_TRUE(ddp.ok()) << ddp.status().ToString();
  c.parallelism = {};
  c.parallelism.pipeline = 2;
  c.batch_size = c.grad_accum_steps = 4;
  StatusOr<Report> pp = Estimate(llama, c, {.advice = false});
  ASSERT_TRUE(pp.ok()) << pp.status().ToString();
  EXPECT_EQ(pp->trainable_parameter_count, 4 * 8 * (4096 + 4096 + 4096 + 4096));
}

TEST(LoraTest, RefusesTargetsItCannotAdapt) {
  const ModelSpec llama = Preset("llama-7b", {{"seq", 64}, {"layers", 1}});
  struct Case {
    std::vector<std::string> targets, save;
    std::string message;
  } cases[] = {
      {{"q_proj", "qkv"}, {}, "config.lora.target_modules[1]: 'qkv' matches no module"},
      {{"wq"}, {}, "config.lora.target_modules: no module of the model matches 'wq'"},
      {{"mlp"}, {}, "config.lora.target_modules[0]: 'mlp' matches the module "
                    "'model.layers.0.mlp', which is not a Linear"},
      {{"q_proj"}, {"score"}, "config.lora.modules_to_save[0]: 'score' matches no module"},
  };
  for (const Case& k : cases) {
    RunConfig c = Lora(8, k.targets);
    c.lora.modules_to_save = k.save;
    StatusOr<Graph> g = BuildStepGraph(llama, c);
    ASSERT_FALSE(g.ok()) << k.message;
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(k.message), std::string::npos) << g.status().message();
  }
}

TEST(LoraTest, RefusesSettingsThatMakeNoSense) {
  struct Case {
    RunConfig config;
    std::string message;
  };
  std::vector<Case> cases;
  RunConfig c = Lora(-1, {"q_proj"});
  cases.push_back({c, "config.lora.rank: must be in [1, 1048576], got -1"});
  c = Lora(0, {"q_proj"});
  cases.push_back({c, "config.lora.target_modules: a LoRA setting, and config.lora.rank is not set"});
  c = Lora(8, {});
  cases.push_back({c, "config.lora.target_modules: name the modules to adapt"});
  c = Lora(8, {"q_proj", "all-linear"});
  cases.push_back({c, "config.lora.target_modules[1]: \"all-linear\" stands alone"});
  c = Lora(8, {"q_proj"});
  c.lora.dropout = 1.5;
  cases.push_back({c, "config.lora.dropout: must be in [0, 1], got 1.5"});
  c = Lora(8, {""});
  cases.push_back({c, "config.lora.target_modules[0]: must name a module, got an empty name"});
  c = Lora(8, {"q_proj"});
  c.parallelism.tensor = 2;
  cases.push_back({c, "config.lora: LoRA under tensor parallelism is not modelled"});
  c = Lora(8, {"q_proj"});
  c.parallelism.data = 2;
  c.parallelism.sharding = DataSharding::kFsdp1;
  cases.push_back({c, "config.lora: LoRA under FSDP1 is not modelled"});
  c = Lora(8, {std::string(2000, 'q')});
  cases.push_back({c, "config.lora.target_modules[0]: 2000 bytes"});
  for (const Case& k : cases) {
    Status s = ValidateRunConfig(k.config);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << k.message;
    EXPECT_NE(s.message().find(k.message), std::string::npos) << s.message();
  }
}

TEST(LoraTest, AdaptersCountAgainstTheOpLimit) {
  StatusOr<Graph> g = BuildStepGraph(Preset("llama-7b", {{"seq", 64}, {"layers", 2}}), RunConfig{});
  ASSERT_TRUE(g.ok());
  LoraConfig lora;
  lora.rank = 4;
  lora.target_modules = {"all-linear"};
  StatusOr<Graph> too_many = ApplyLora(*g, lora, static_cast<int64_t>(g->ops.size()));
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), StatusCode::kResourceExhausted);
  StatusOr<Graph> fits = ApplyLora(*g, lora, 1'000'000);
  ASSERT_TRUE(fits.ok());
  int adapted = 0;
  for (const Tensor& t : fits->tensors) adapted += t.name.find(".lora_A.") != std::string::npos;
  EXPECT_EQ(adapted, 2 * 7);
}

}  // namespace
}  // namespace memest
