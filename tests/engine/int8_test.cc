// bitsandbytes' LLM.int8 (Linear8bitLt, load_in_8bit; engine/passes/quantize.h and
// engine/rules/quantized_int8.cc): the storage, the ops of one call and their scratch, the
// input MatMul8bitLt's node keeps until the graph is freed, and the requests refused. The facts
// are read in bitsandbytes 0.50 and PEFT (docs/qlora.md).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/estimator.h"
#include "engine/passes/checkpoint.h"
#include "tests/engine/hf_json.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::AtEnd;
using enginetest::Cat;
using enginetest::KindsIn;
using enginetest::Named;
using enginetest::PhasePeak;
using enginetest::Walk;

ModelSpec Llama(int64_t layers, int64_t seq = 256) {
  return ModelSpec{PresetSpec{"llama-7b", {{"seq", seq}, {"layers", layers}}}};
}

// LoRA over an 8-bit Llama, as PEFT's int8 recipes run it (prepared: float32 activations).
RunConfig Int8Lora() {
  RunConfig c;
  c.batch_size = 1;
  c.precision = Precision::kBf16Pure;
  c.quantization.format = WeightFormat::kBnbInt8;
  c.lora.rank = 16;
  c.lora.target_modules = {"all-linear"};
  return c;
}

// Int8Params keeps CB, int8 [out, in], in place of the weight; the module's state its float32
// row scales (SCB) and the last call's outlier columns (state.idx, int64).
TEST(Int8Test, StorageIsCbAndARowScale) {
  StatusOr<Graph> g = BuildStepGraph(Llama(1), Int8Lora());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Tensor* cb = Named(*g, "model.layers.0.mlp.down_proj.weight");
  ASSERT_NE(cb, nullptr);
  EXPECT_EQ(cb->dtype, DType::kInt8);
  EXPECT_EQ(cb->shape, (Shape{4096, 11008}));
  EXPECT_FALSE(cb->requires_grad);
  const Tensor* scb = Named(*g, "model.layers.0.mlp.down_proj.SCB");
  ASSERT_NE(scb, nullptr);
  EXPECT_EQ(scb->dtype, DType::kFloat32);
  EXPECT_EQ(scb->shape, Shape{4096});
  const Tensor* idx = Named(*g, "model.layers.0.mlp.down_proj.state.idx");
  ASSERT_NE(idx, nullptr);
  EXPECT_EQ(idx->dtype, DType::kInt64);
  EXPECT_EQ(idx->shape, Shape{kDefaultInt8OutlierColumns});
  // The output layer stays dense; PEFT's adapters over an int8 base are float32.
  EXPECT_EQ(Named(*g, "lm_head.weight")->dtype, DType::kFloat32);
  EXPECT_EQ(Named(*g, "model.layers.0.mlp.down_proj.lora_A.default.weight")->dtype,
            DType::kFloat32);
  // One call: the input quantized by row, its outlier columns and the weight's, the int8
  // matmul, the outliers' addmm (a float32 input needs no cast of the weight's columns).
  EXPECT_EQ(
      KindsIn(*g, "model.layers.0.mlp.down_proj"),
      (std::vector<std::string>{"int8_quantize_rows", "int8_outlier_inputs", "int8_outlier_weight",
                                "linear_8bit", "int8_add_outliers", "mul", "add"}));
}

// Per call of down_proj (x float32 [256, 11008], out 4096, 7 outlier columns): quantizing x by
// row takes its float16 copy, |x| in float16, the bool mask and its any(0): 5 * 256 * 11008 +
// 11008 bytes, more than the int32 and float16 products (6 * 256 * 4096). The node keeps x and
// its outlier columns, float32 [256, 7].
TEST(Int8Test, ACallsScratchAndWhatItKeeps) {
  StatusOr<Report> r = Estimate(Llama(2), Int8Lora(), {.advice = false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  bool found = false;
  for (const LayerRow& row : r->layers) {
    if (row.scope != "model.layers.1.mlp.down_proj") continue;
    found = true;
    EXPECT_EQ(row.temporary_bytes, 5 * 256 * 11008 + 11008);
    EXPECT_EQ(row.saved_bytes, 4 * 256 * 11008 + 4 * 256 * 7);
  }
  EXPECT_TRUE(found);
  bool noted = false;
  for (const std::string& n : r->notes) {
    noted |= n.find("8-bit weights as bitsandbytes stores them (LLM.int8): 14 Linear modules") !=
             std::string::npos;
  }
  EXPECT_TRUE(noted);
}

// A stack of 8-bit linears and gelus over x * scale (so that every call's input needs grad):
// x [T, 1024], three blocks.
Graph Int8Stack(int64_t tokens, int64_t columns) {
  GraphBuilder b;
  int x = b.Add1("mul", {b.Input("x", {tokens, 1024}, DType::kFloat32),
                         b.Parameter("scale", {1024}, DType::kFloat32)});
  for (int i = 0; i < 3; ++i) {
    ScopeGuard s(b, "blocks." + std::to_string(i));
    b.MarkBlock();
    const int w = b.Parameter("weight", {1024, 1024}, DType::kInt8, false);
    const int scb = b.Buffer("SCB", {1024}, DType::kFloat32);
    const std::vector<int> q =
        b.Add("int8_quantize_rows", {x}, {{"threshold", 6.0}, {"outlier_columns", columns}});
    const int sub_a = b.Add1("int8_outlier_inputs", {x, q[2]});
    const int sub_b = b.Add1("int8_outlier_weight", {w, scb, q[2]});
    const int y = b.Add1("linear_8bit", {x, w, scb, q[0], q[1]});
    x = b.Add1("gelu", {b.Add1("int8_add_outliers", {y, sub_a, sub_b, q[0], q[1], x})});
  }
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {x}));
  return b.Finish().value();
}

// The activations alive when the last backward op runs (block 0's linear_8bit): walks the
// schedule's events.
int64_t ActivationsAtLastBackwardOp(const Schedule& s, const Graph& g) {
  std::vector<int64_t> bytes(s.num_buffers, 0);
  std::vector<Category> category(s.num_buffers, Category::kTemporaries);
  int64_t live = 0, at_last = -1;
  for (const Event& e : s.events) {
    if (e.kind == EventKind::kAlloc) {
      bytes[e.buffer] = e.bytes;
      category[e.buffer] = e.category;
      if (e.category == Category::kActivations) live += e.bytes;
    } else if (e.kind == EventKind::kFree) {
      if (category[e.buffer] == Category::kActivations) live -= bytes[e.buffer];
    } else if (e.kind == EventKind::kRetag) {
      if (category[e.buffer] == Category::kActivations) live -= bytes[e.buffer];
      category[e.buffer] = e.category;
      if (e.category == Category::kActivations) live += bytes[e.buffer];
    } else {
      const StepContext& c = s.contexts[e.buffer];
      if (c.phase == Phase::kBackward && c.op >= 0 && g.ops[c.op].kind == "linear_8bit" &&
          g.ops[c.op].scope == "blocks.0") {
        at_last = live;
      }
    }
  }
  return at_last;
}

// MatMul8bitLt keeps A and subA as attributes of its node (ctx.tensors): its backward does not
// free them, the graph's end does. Without checkpointing every block's input is still there
// when block 0's backward runs; with reentrant checkpointing the recomputed graph, and what its
// nodes kept, dies with each region's backward; a non-reentrant region's first forward runs with
// grad and its hooks do not see ctx.tensors: kept to the graph's end again.
TEST(Int8Test, TheNodeKeepsItsInputUntilTheGraphIsFreed) {
  const int64_t T = 512, act = T * 1024 * 4, sub = T * 5 * 4;
  const Graph g = Int8Stack(T, 5);
  RunConfig c = enginetest::PlainTraining();
  const Schedule none = BuildSchedule(g, c, {}, {}).value();
  // x0..x2 and three subA; block 0's gelu input is gone (its backward ran).
  EXPECT_EQ(ActivationsAtLastBackwardOp(none, g), 3 * act + 3 * sub);

  c.checkpoint.policy = CheckpointPolicy::kEveryBlock;
  const CheckpointRegions regions = PlanCheckpoints(g, c.checkpoint).value();
  ASSERT_EQ(regions.size(), 3u);
  const Schedule reentrant = BuildSchedule(g, c, regions, {}).value();
  // Block 0's own recomputed subA and its input (the region's input, x0).
  EXPECT_EQ(ActivationsAtLastBackwardOp(reentrant, g), act + sub);

  c.checkpoint.non_reentrant = true;
  const Schedule non_reentrant = BuildSchedule(g, c, regions, {}).value();
  EXPECT_EQ(ActivationsAtLastBackwardOp(non_reentrant, g), 3 * act + 3 * sub);
}

// A loop that keeps its outputs (`outputs = model(...); loss = outputs.loss`, memest's default)
// keeps the graph with them, and so what its nodes hold as attributes: a steady-state step
// starts with the previous step's three inputs and their outlier columns, which its forward lets
// go, and ends with its own.
TEST(Int8Test, ALoopKeepingItsOutputsKeepsTheInputsIntoTheNextStep) {
  const int64_t T = 512, act = T * 1024 * 4, sub = T * 5 * 4;
  const Graph g = Int8Stack(T, 5);
  RunConfig c = enginetest::PlainTraining();
  const Liveness dropped = Walk(g, c);
  c.hold_outputs = true;
  const Liveness held = Walk(g, c);
  EXPECT_EQ(Cat(PhasePeak(held, Phase::kData), Category::kActivations), 3 * act + 3 * sub);
  EXPECT_EQ(Cat(PhasePeak(dropped, Phase::kData), Category::kActivations), 0);
  EXPECT_EQ(AtEnd(held, Category::kActivations), 3 * act + 3 * sub);
  EXPECT_EQ(AtEnd(dropped, Category::kActivations), 0);
  // Reentrant checkpointing: the step's graph holds no node of a region.
  c.checkpoint.policy = CheckpointPolicy::kEveryBlock;
  const CheckpointRegions regions = PlanCheckpoints(g, c.checkpoint).value();
  EXPECT_EQ(AtEnd(Walk(g, c, regions), Category::kActivations), 0);
}

// transformers transposes a Conv1D's weight for the 8-bit layer: GPT-2's c_attn is CB int8
// [2304, 768].
TEST(Int8Test, AConv1DWeightIsStoredOutByIn) {
  RunConfig c = Int8Lora();
  c.lora.target_modules = {"c_attn"};
  StatusOr<Graph> g =
      BuildStepGraph(ModelSpec{PresetSpec{"gpt2-small", {{"seq", 128}, {"layers", 1}}}}, c);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Tensor* cb = Named(*g, "transformer.h.0.attn.c_attn.weight");
  ASSERT_NE(cb, nullptr);
  EXPECT_EQ(cb->shape, (Shape{2304, 768}));
  EXPECT_EQ(cb->dtype, DType::kInt8);
}

// meta-llama/llama-recipes' quickstart_peft_finetuning.ipynb (8145b36c; again at 6730aa10 for
// Llama 3.1): Meta-Llama-3-8B loaded in 8 bits (float16 elsewhere), prepare_model_for_kbit_
// training (reentrant checkpointing, float32 non-8-bit parameters), LoRA r 8, alpha 32, dropout
// 0.05 on q_proj and v_proj, packed [1, 2048] micro-batches, 4 accumulated, torch.autocast
// float16 with a GradScaler, torch's AdamW; the loop keeps only `loss`. It printed "Max CUDA
// memory allocated was 15 GB / Max CUDA memory reserved was 16 GB", each int(bytes / 2^30): in
// [15, 16) and [16, 17) GiB. The GPU is "e.g. A10 with 24GB" (docs/qlora.md).
TEST(Int8Test, AgreesWithLlamaRecipesInt8Lora) {
  ModelSpec model;
  model.source = HfConfigSpec{enginetest::FromJson(enginetest::ReadConfig("llama-3-8b")), 2048};
  RunConfig c;
  c.batch_size = 4;
  c.grad_accum_steps = 4;
  c.precision = Precision::kFp16Amp;
  c.quantization.format = WeightFormat::kBnbInt8;
  c.lora.rank = 8;
  c.lora.alpha = 32;
  c.lora.dropout = 0.05;
  c.lora.target_modules = {"q_proj", "v_proj"};
  c.checkpoint.policy = CheckpointPolicy::kEveryBlock;
  c.hold_outputs = false;
  c.device = "a10g";
  StatusOr<Report> r = Estimate(model, c, {.advice = false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const int64_t gib = int64_t{1} << 30;
  EXPECT_EQ(r->peak.allocated_bytes / gib, 15) << r->peak.allocated_bytes;
  EXPECT_EQ(r->peak_reserved_bytes / gib, 16) << r->peak_reserved_bytes;
}

// The advice names what frees the 8-bit layers' inputs sooner, with the saving measured.
TEST(Int8Test, AdviceFreesTheGraphSooner) {
  RunConfig c = Int8Lora();
  c.checkpoint.policy = CheckpointPolicy::kEveryBlock;
  c.checkpoint.non_reentrant = true;
  StatusOr<Report> r = Estimate(Llama(2, 512), c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  bool reentrant = false, free_graph = false;
  for (const Advice& a : r->advice) {
    reentrant |= a.kind == "reentrant_checkpoint" && a.saving_bytes > 0;
    free_graph |= a.kind == "free_graph" && a.saving_bytes > 0;
  }
  EXPECT_TRUE(reentrant);
  EXPECT_TRUE(free_graph);
}

// Inference keeps nothing: no node.
TEST(Int8Test, InferenceKeepsNothing) {
  RunConfig c = Int8Lora();
  c.lora = {};
  c.mode = Mode::kInference;
  StatusOr<Report> r = Estimate(Llama(1), c, {.advice = false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->saved_for_backward_bytes, 0);
}

TEST(Int8Test, RefusesWhatMakesNoSense) {
  struct Case {
    void (*set)(RunConfig*);
    const char* field;
  };
  const Case cases[] = {
      {[](RunConfig* c) { c->quantization.int8_threshold = -1; }, "int8_threshold"},
      {[](RunConfig* c) { c->quantization.int8_outlier_columns = -3; }, "int8_outlier_columns"},
      {[](RunConfig* c) {
         c->quantization.int8_threshold = 0;
         c->quantization.int8_outlier_columns = 4;
       },
       "int8_outlier_columns"},
      {[](RunConfig* c) { c->quantization.double_quant = true; }, "double_quant"},
      {[](RunConfig* c) { c->quantization.compute_dtype = DType::kBFloat16; }, "compute_dtype"},
      {[](RunConfig* c) {
         c->quantization.format = WeightFormat::kBnbNf4;
         c->quantization.int8_threshold = 4;
       },
       "int8_threshold"},
      {[](RunConfig* c) { c->runtime = Runtime::kCpuTorch113; }, "config.quantization"},
      {[](RunConfig* c) { c->lora.use_dora = true; }, "use_dora"},
  };
  for (const Case& k : cases) {
    RunConfig c = Int8Lora();
    k.set(&c);
    StatusOr<Report> r = Estimate(Llama(1), c, {.advice = false});
    ASSERT_FALSE(r.ok()) << k.field;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << k.field;
    EXPECT_NE(r.status().message().find(k.field), std::string::npos) << r.status().message();
  }
}

// Without prepare_model_for_kbit_training or adapters the biases of the 8-bit layers train:
// MatMul8bitLt's backward sums a 3-D grad_output over dim 0 only, [16, 64] in the bias's dtype,
// which autograd sums to [64]. The input needs no gradient, so nothing is kept of it.
TEST(Int8Test, AnInt8BiasTrainsThroughASequenceSum) {
  LayerModelSpec spec;
  spec.input_shape = {16, 64};
  spec.layers = {{"linear", "fc", {{"out_features", int64_t{64}}}},
                 {"linear", "head", {{"out_features", int64_t{8}}}}};
  RunConfig c;
  c.batch_size = 2;
  c.quantization.format = WeightFormat::kBnbInt8;
  c.quantization.prepare_for_kbit_training = false;
  StatusOr<Report> r = Estimate(ModelSpec{spec}, c, {.advice = false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->trainable_parameter_count, 64 + 8 * 64 + 8);
  bool found = false;
  for (const LayerRow& row : r->layers) {
    if (row.scope != "fc") continue;
    found = true;
    EXPECT_EQ(row.saved_bytes, 0);
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace memest
