// bitsandbytes' LLM.int8 (Linear8bitLt, load_in_8bit; engine/passes/quantize.h and
// engine/rules/quantized_int8.cc): the storage, the ops of one call and their scratch, the
// input MatMul8bitLt's node keeps until the graph is freed, and the requests refused. The facts
// are read in bitsandbytes 0.50 and PEFT (docs/qlora.md).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/estimator.h"
#include "engine/passes/checkpoint.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

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

const Tensor* Named(const Graph& g, const std::string& name) {
  for (const Tensor& t : g.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::vector<std::string> KindsIn(const Graph& g, const std::string& scope) {
  std::vector<std::string> kinds;
  for (const Op& op : g.ops) {
    if (op.scope == scope) kinds.push_back(op.kind);
  }
  return kinds;
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
    x = b.Add1("gelu", {b.Add1("int8_add_outliers", {y, sub_a, sub_b})});
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

// Without prepare_model_for_kbit_training or adapters the biases of the 8-bit layers would
// train; MatMul8bitLt cannot (its backward sums a batched grad_output over dim 0 only).
TEST(Int8Test, RefusesTrainingAnInt8Bias) {
  LayerModelSpec spec;
  spec.input_shape = {16, 64};
  spec.layers = {{"linear", "fc", {{"out_features", int64_t{64}}}},
                 {"linear", "head", {{"out_features", int64_t{8}}}}};
  RunConfig c;
  c.batch_size = 2;
  c.quantization.format = WeightFormat::kBnbInt8;
  c.quantization.prepare_for_kbit_training = false;
  StatusOr<Report> r = Estimate(ModelSpec{spec}, c, {.advice = false});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("the bias of the 8-bit 'fc'"), std::string::npos)
      << r.status().message();
  c.quantization.prepare_for_kbit_training = true;
  c.lora.rank = 4;
  c.lora.target_modules = {"fc"};
  r = Estimate(ModelSpec{spec}, c, {.advice = false});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
}

}  // namespace
}  // namespace memest
