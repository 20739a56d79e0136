// torchao's weight-only formats as transformers loads them (engine/passes/quantize_torchao.h):
// the storage to the byte, each call's ops and scratch, and the requests refused. The facts
// are read in torchao 0.19 and transformers' quantizer_torchao.py (docs/qlora.md).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/estimator.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::KindsIn;
using enginetest::Named;

ModelSpec Llama(int64_t layers, int64_t seq = 256) {
  return ModelSpec{PresetSpec{"llama-7b", {{"seq", seq}, {"layers", layers}}}};
}

RunConfig Torchao(WeightFormat format) {
  RunConfig c;
  c.batch_size = 1;
  c.mode = Mode::kInference;
  c.precision = Precision::kBf16Pure;
  c.quantization.format = format;
  return c;
}

// Int4Tensor: qdata int8 [out, in / 2], a bfloat16 scale and zero point per group of 128 input
// features and output; the output layer stays dense, the parameter count the model's.
TEST(TorchaoTest, Int4StoresTwoValuesAByteAndAScaleAndZeroPerGroup) {
  StatusOr<Graph> g = BuildStepGraph(Llama(1), Torchao(WeightFormat::kTorchaoInt4));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Tensor* q = Named(*g, "model.layers.0.mlp.down_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, DType::kInt8);
  EXPECT_EQ(q->shape, (Shape{4096, 11008 / 2}));
  for (const char* part : {".weight.scale", ".weight.zero_point"}) {
    const Tensor* t = Named(*g, std::string("model.layers.0.mlp.down_proj") + part);
    ASSERT_NE(t, nullptr) << part;
    EXPECT_EQ(t->dtype, DType::kBFloat16);
    EXPECT_EQ(t->shape, (Shape{11008 / 128, 4096}));
  }
  EXPECT_EQ(Named(*g, "lm_head.weight")->dtype, DType::kBFloat16);
  StatusOr<Graph> dense = BuildStepGraph(Llama(1), Torchao(WeightFormat::kDense));
  ASSERT_TRUE(dense.ok());
  EXPECT_EQ(g->ParameterCount(), dense->ParameterCount());
  EXPECT_EQ(KindsIn(*g, "model.layers.0.mlp.down_proj"),
            std::vector<std::string>{"torchao_int4_mm"});
}

// Int8Tensor per row: qdata int8 [out, in], a float32 scale and an int8 zero point per row.
// Each call casts the whole weight to bfloat16 for torch.mm: down_proj's [4096, 11008] is
// 2 * 4096 * 11008 bytes of scratch, beside the [256, 4096] product.
TEST(TorchaoTest, Int8CastsTheWholeWeightPerCall) {
  const RunConfig c = Torchao(WeightFormat::kTorchaoInt8);
  StatusOr<Graph> g = BuildStepGraph(Llama(1), c);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(Named(*g, "model.layers.0.mlp.down_proj.weight")->shape, (Shape{4096, 11008}));
  EXPECT_EQ(Named(*g, "model.layers.0.mlp.down_proj.weight.scale")->shape, (Shape{4096, 1}));
  EXPECT_EQ(Named(*g, "model.layers.0.mlp.down_proj.weight.zero_point")->dtype, DType::kInt8);
  EXPECT_EQ(KindsIn(*g, "model.layers.0.mlp.down_proj"),
            (std::vector<std::string>{"torchao_int8_mm", "torchao_int8_scale"}));
  StatusOr<Report> r = Estimate(Llama(1), c, {.advice = false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  bool found = false;
  for (const LayerRow& row : r->layers) {
    if (row.scope != "model.layers.0.mlp.down_proj") continue;
    found = true;
    EXPECT_EQ(row.temporary_bytes, 2 * 4096 * 11008);
  }
  EXPECT_TRUE(found);
}

// Int4 skips a weight whose input features group_size does not divide (torchao logs and leaves
// it dense).
TEST(TorchaoTest, Int4LeavesWhatItsGroupDoesNotDivide) {
  LayerModelSpec spec;
  spec.input_shape = {16, 96};
  spec.layers = {{"linear", "a", {{"out_features", int64_t{64}}}},
                 {"linear", "b", {{"out_features", int64_t{64}}}},
                 {"linear", "head", {{"out_features", int64_t{8}}}}};
  RunConfig c = Torchao(WeightFormat::kTorchaoInt4);
  c.quantization.group_size = 32;  // divides 96 and 64
  StatusOr<Graph> g = BuildStepGraph(ModelSpec{spec}, c);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(Named(*g, "a.weight")->dtype, DType::kInt8);
  c.quantization.group_size = 64;  // not 96: "a" stays dense, "b" is quantized
  g = BuildStepGraph(ModelSpec{spec}, c);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(Named(*g, "a.weight")->dtype, DType::kBFloat16);
  EXPECT_EQ(Named(*g, "b.weight")->dtype, DType::kInt8);
}

TEST(TorchaoTest, RefusesWhatMakesNoSense) {
  struct Case {
    void (*set)(RunConfig*);
    const char* field;
  };
  const Case cases[] = {
      {[](RunConfig* c) { c->mode = Mode::kTraining; }, "config.quantization.format"},
      {[](RunConfig* c) { c->precision = Precision::kFp16Pure; }, "config.precision"},
      {[](RunConfig* c) { c->precision = Precision::kBf16Amp; }, "config.precision"},
      {[](RunConfig* c) { c->quantization.group_size = 100; }, "group_size"},
      {[](RunConfig* c) { c->quantization.double_quant = true; }, "double_quant"},
      {[](RunConfig* c) { c->quantization.prepare_for_kbit_training = true; },
       "prepare_model_for_kbit_training"},
      {[](RunConfig* c) { c->runtime = Runtime::kCpuTorch113; }, "config.quantization"},
      {[](RunConfig* c) {
         c->quantization.format = WeightFormat::kTorchaoInt8;
         c->quantization.group_size = 64;
       },
       "config.quantization"},
      {[](RunConfig* c) { c->device = "a100-80gb"; }, "runs on sm_90"},
      {[](RunConfig* c) { c->device = "b200"; }, "runs on sm_90"},
  };
  for (const Case& k : cases) {
    RunConfig c = Torchao(WeightFormat::kTorchaoInt4);
    k.set(&c);
    StatusOr<Report> r = Estimate(Llama(1), c, {.advice = false});
    ASSERT_FALSE(r.ok()) << k.field;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << k.field;
    EXPECT_NE(r.status().message().find(k.field), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace memest
