// FP8 training with TransformerEngine as accelerate runs it (engine/passes/fp8_te.h): which
// Linears become te.Linear, what each keeps and makes, its state, and the requests refused. The
// facts are read in TransformerEngine 2.20 and accelerate (docs/fp8.md).
#include <gtest/gtest.h>

#include <string>

#include "engine/estimator.h"
#include "tests/engine/test_graphs.h"
#include "engine/passes/fp8_te.h"
#include "tests/engine/hf_json.h"

namespace memest {
namespace {

using enginetest::Named;

// x [2, 64, 256] -> fc1 (512) -> gelu -> fc2 (256) -> head (10): fc1 and fc2 convert, the head
// (10 outputs, not a multiple of 16) stays an nn.Linear.
ModelSpec Mlp() {
  LayerModelSpec spec;
  spec.input_shape = {64, 256};
  spec.layers = {{"linear", "fc1", {{"out_features", int64_t{512}}}},
                 {"gelu", "act", {}},
                 {"linear", "fc2", {{"out_features", int64_t{256}}}},
                 {"linear", "head", {{"out_features", int64_t{10}}}}};
  return ModelSpec{spec};
}

RunConfig Fp8(Fp8Recipe recipe = Fp8Recipe::kDelayed) {
  RunConfig c;
  c.batch_size = 2;
  c.precision = Precision::kBf16Amp;  // float32 master weights, autocast bfloat16
  c.fp8.recipe = recipe;
  return c;
}

TEST(Fp8Test, ConvertsTheLinearsWhoseDimsAreMultiplesOf16) {
  StatusOr<Graph> g = BuildStepGraph(Mlp(), Fp8());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  int te = 0, plain = 0;
  for (const Op& op : g->ops) {
    te += op.kind == "te_linear";
    plain += op.kind == "linear";
  }
  EXPECT_EQ(te, 2);
  EXPECT_EQ(plain, 1);  // the head
  // DelayedScaling's fp8_meta per module, and TE's workspace once.
  const Tensor* fwd = Named(*g, "fc1.fp8_meta.amax_history_fwd");
  ASSERT_NE(fwd, nullptr);
  EXPECT_EQ(fwd->shape, (Shape{1024, 3}));
  EXPECT_EQ(Named(*g, "fc2.fp8_meta.amax_history_bwd")->shape, (Shape{1024, 2}));
  EXPECT_EQ(Named(*g, "transformer_engine.cublas_workspace")->shape,
            Shape{(int64_t{32} << 20) + 1024});
  StatusOr<Graph> current = BuildStepGraph(Mlp(), Fp8(Fp8Recipe::kCurrent));
  ASSERT_TRUE(current.ok());
  EXPECT_EQ(Named(*current, "fc1.fp8_meta.amax_history_fwd"), nullptr);
}

// fc1 reads the data batch (no grad): its fp8 rowwise copy while the GEMM runs (32768 B); kept,
// the fp8 data wgrad reads (32768 + 4) and the weight in fp8, rowwise only (131072 + 4). fc2 reads
// gelu's bfloat16 output [2, 64, 512] (grad): its rowwise copy (65536); kept, the transpose
// (65536 + 4) and the weight with its transpose (2 * 131072 + 4). No cast of x: TE quantizes it
// in its own dtype.
TEST(Fp8Test, KeepsTheInputsFp8TransposeAndTheFp8Weight) {
  StatusOr<Report> r = Estimate(Mlp(), Fp8(), {.advice = false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  int found = 0;
  for (const LayerRow& row : r->layers) {
    if (row.scope == "fc1") {
      ++found;
      EXPECT_EQ(row.temporary_bytes, 32768);
      EXPECT_EQ(row.saved_bytes, 32772 + 131076);
    } else if (row.scope == "fc2") {
      ++found;
      EXPECT_EQ(row.temporary_bytes, 65536);
      EXPECT_EQ(row.saved_bytes, 65540 + 262148);
    }
  }
  EXPECT_EQ(found, 2);
  bool noted = false;
  for (const std::string& n : r->notes) {
    noted |= n.find("2 nn.Linear modules as te.Linear") != std::string::npos;
  }
  EXPECT_TRUE(noted);
}

// On a B200 (sm_100) fp8 GEMMs take other layouts: no transposes. fc2 keeps its input's fp8 data
// (65536 + 4) and the weight's (131072 + 4), and makes no other copy. TE's workspace: 32 MiB + 1
// KiB from sm_90, 4 MiB on an L4 (sm_89).
TEST(Fp8Test, BlackwellMakesNoTransposes) {
  RunConfig c = Fp8();
  c.device = "b200";
  StatusOr<Report> r = Estimate(Mlp(), c, {.advice = false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  bool found = false;
  for (const LayerRow& row : r->layers) {
    if (row.scope != "fc2") continue;
    found = true;
    EXPECT_EQ(row.temporary_bytes, 0);
    EXPECT_EQ(row.saved_bytes, 65540 + 131076);
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(TeWorkspaceBytes(100), (int64_t{32} << 20) + 1024);
  EXPECT_EQ(TeWorkspaceBytes(89), int64_t{4} << 20);
  c.device = "l4";
  StatusOr<Graph> g = BuildStepGraph(Mlp(), c);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(Named(*g, "transformer_engine.cublas_workspace")->shape, Shape{int64_t{4} << 20});
}

// Against the bf16 step: each converted linear keeps a byte a value of its input, not two.
TEST(Fp8Test, SavesLessThanBf16OnALlama) {
  const ModelSpec llama{PresetSpec{"llama-7b", {{"seq", 512}, {"layers", 2}}}};
  RunConfig bf16 = Fp8();
  bf16.batch_size = 1;
  bf16.fp8 = {};
  RunConfig fp8 = bf16;
  fp8.fp8.recipe = Fp8Recipe::kDelayed;
  StatusOr<Report> a = Estimate(llama, bf16, {.advice = false});
  StatusOr<Report> b = Estimate(llama, fp8, {.advice = false});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_LT(b->saved_for_backward_bytes, a->saved_for_backward_bytes);
}

TEST(Fp8Test, RefusesWhatMakesNoSense) {
  struct Case {
    void (*set)(RunConfig*);
    const char* field;
  };
  const Case cases[] = {
      {[](RunConfig* c) { c->mode = Mode::kInference; }, "config.fp8"},
      {[](RunConfig* c) { c->runtime = Runtime::kCpuTorch113; }, "config.fp8"},
      {[](RunConfig* c) { c->device = "a100-80gb"; }, "compute capability 8.9"},
      {[](RunConfig* c) { c->fp8.amax_history_len = 0; }, "config.fp8.amax_history_len"},
      {[](RunConfig* c) {
         c->fp8.recipe = Fp8Recipe::kCurrent;
         c->fp8.amax_history_len = 16;
       },
       "config.fp8.amax_history_len"},
      {[](RunConfig* c) {
         c->fp8.recipe = Fp8Recipe::kNone;
         c->fp8.amax_history_len = 16;
       },
       "config.fp8.amax_history_len"},
      {[](RunConfig* c) {
         c->lora.rank = 4;
         c->lora.target_modules = {"fc1"};
       },
       "config.fp8"},
      {[](RunConfig* c) { c->parallelism.sharding = DataSharding::kFsdp2; }, "config.fp8"},
      {[](RunConfig* c) { c->precision = Precision::kFp32; }, "config.precision"},
      {[](RunConfig* c) { c->precision = Precision::kFp16Amp; }, "config.precision"},
      {[](RunConfig* c) { c->device = "mi300x"; }, "compute capability 8.9"},
  };
  for (const Case& k : cases) {
    RunConfig c = Fp8();
    k.set(&c);
    StatusOr<Report> r = Estimate(Mlp(), c, {.advice = false});
    ASSERT_FALSE(r.ok()) << k.field;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << k.field;
    EXPECT_NE(r.status().message().find(k.field), std::string::npos) << r.status().message();
  }
}

// TransformerEngine takes batch x sequence in multiples of 8: one sequence of 63 tokens is not.
TEST(Fp8Test, RefusesTokensNotInMultiplesOf8) {
  LayerModelSpec spec;
  spec.input_shape = {63, 256};
  spec.layers = {{"linear", "fc1", {{"out_features", int64_t{512}}}},
                 {"linear", "head", {{"out_features", int64_t{10}}}}};
  RunConfig c = Fp8();
  c.batch_size = 1;
  StatusOr<Report> r = Estimate(ModelSpec{spec}, c, {.advice = false});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("multiple of 8 tokens, got 63"), std::string::npos)
      << r.status().message();
}

// accelerate makes an nn.LayerNorm a te.LayerNorm (bfloat16, a bfloat16 copy of its input
// kept) and unties a tied output layer from the optimizer: both refused.
TEST(Fp8Test, RefusesLayerNormAndTiedOutputLayers) {
  StatusOr<Report> ln =
      Estimate(ModelSpec{PresetSpec{"gpt2-small", {{"layers", 1}}}}, Fp8(), {.advice = false});
  ASSERT_FALSE(ln.ok());
  EXPECT_NE(ln.status().message().find("LayerNorm"), std::string::npos) << ln.status().message();
  ModelSpec tied;
  tied.source = HfConfigSpec{enginetest::FromJson(enginetest::ReadConfig("llama-3.2-1b")), 64};
  StatusOr<Report> r = Estimate(tied, Fp8(), {.advice = false});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("(tied)"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace memest
