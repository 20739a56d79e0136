// DTensor's tensor-parallel layers (config.parallelism.tensor_layers = dtensor;
// engine/passes/tensor_parallel_dtensor.cc, engine/rules/dtensor.cc): the rank's ops, what they
// save and keep against Megatron's layers on the same graph, and the refusals. The measured
// truth is tests/parallel/dtensor_compare.py (PyTorch 2.15, docs/parallelism-truth.md 10.9).
#include <gtest/gtest.h>

#include <string>

#include "engine/estimator.h"
#include "engine/passes/tensor_parallel.h"
#include "engine/rules/op_rules.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::PlainTraining;

constexpr int64_t kS = 32, kB = 4, kH = 64;

// x [b, s, h] (torchtitan's batch-first layout, or [s, b, h]) -> LayerNorm -> fc1 (h -> 256)
// -> GELU -> fc2 (256 -> h) -> + x -> mean.
Graph Mlp(bool batch_first) {
  GraphBuilder b;
  const int x = batch_first ? b.Input("x", {kB, kS, kH}, DType::kFloat32, /*batch_dim=*/0)
                            : b.Input("x", {kS, kB, kH}, DType::kFloat32, /*batch_dim=*/1);
  const int a = b.Add1("layer_norm", {x, b.Parameter("ln.weight", {kH}, DType::kFloat32),
                                      b.Parameter("ln.bias", {kH}, DType::kFloat32)});
  int u = b.Add1("linear", {a, b.Parameter("fc1.weight", {256, kH}, DType::kFloat32),
                            b.Parameter("fc1.bias", {256}, DType::kFloat32)});
  u = b.Add1("gelu", {u});
  const int y = b.Add1("linear", {u, b.Parameter("fc2.weight", {kH, 256}, DType::kFloat32),
                                  b.Parameter("fc2.bias", {kH}, DType::kFloat32)});
  b.BeginLoss();
  b.SetLoss(b.Add1("mean", {b.Add1("add", {x, y})}));
  return b.Finish().value();
}

RunConfig Ranks(int64_t t, bool sp, TensorParallelLayers layers) {
  RunConfig c = PlainTraining();
  c.runtime = Runtime::kCpuTorch113;  // tensors at their own size
  c.parallelism.tensor = t;
  c.parallelism.sequence_parallel = sp;
  c.parallelism.tensor_plan = {{"fc1", TensorShardStyle::kColwise}, {"fc2", TensorShardStyle::kRowwise}};
  c.parallelism.tensor_layers = layers;
  return c;
}

std::string Kinds(const Graph& g) {
  std::string s;
  for (const Op& op : g.ops) s += op.kind + " ";
  return s;
}

const Op& OpOf(const Graph& g, const std::string& kind) {
  for (const Op& op : g.ops) {
    if (op.kind == kind) return op;
  }
  ADD_FAILURE() << "no " << kind << " in " << Kinds(g);
  return g.ops[0];
}

int64_t Flag(const Op& op, const char* name) {
  StatusOr<int64_t> v = IntAttr(op.attrs, name, 0, "");
  return v.ok() ? *v : -1;
}

TEST(DTensorTest, PlainLayersReadFromLocalAndReduceIntoANewTensor) {
  StatusOr<TensorParallelView> v =
      ShardTensorParallel(Mlp(false), Ranks(4, false, TensorParallelLayers::kDTensor).parallelism);
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(Kinds(v->graph), "layer_norm tp_from_local linear gelu linear tp_all_reduce add mean ");
  const Op& reduce = OpOf(v->graph, "tp_all_reduce");
  EXPECT_EQ(Flag(reduce, "out_of_place"), 1);
  EXPECT_EQ(v->global_buffer_bytes, 0);
  EXPECT_TRUE(v->whole_grads.empty());
}

TEST(DTensorTest, SequenceParallelGathersTheModuleInputOnceWithFuncolsCopies) {
  for (bool batch_first : {false, true}) {
    StatusOr<TensorParallelView> v =
        ShardTensorParallel(Mlp(batch_first), Ranks(4, true, TensorParallelLayers::kDTensor).parallelism);
    ASSERT_TRUE(v.ok()) << v.status().message();
    EXPECT_EQ(Kinds(v->graph), "layer_norm tp_all_gather linear gelu linear tp_reduce_scatter add mean ");
    const Op& gather = OpOf(v->graph, "tp_all_gather");
    const Op& scatter = OpOf(v->graph, "tp_reduce_scatter");
    // [b, s, h] gathers along dim 1 through a dim-0 result and a cat, and reduce-scatters a
    // copy in chunk order; Megatron's [s, b, h] needs neither.
    EXPECT_EQ(Flag(gather, "gather_copy"), batch_first ? 1 : 0) << batch_first;
    EXPECT_EQ(Flag(scatter, "scatter_copy"), batch_first ? 1 : 0) << batch_first;
    EXPECT_EQ(v->graph.tensors[gather.outputs[0]].shape,
              batch_first ? (Shape{kB, kS, kH}) : (Shape{kS, kB, kH}));
    // No global buffer and no finalize_model_grads copy; the norm's Partial gradients are
    // all-reduced by the optimizer's ops instead (two at once).
    EXPECT_EQ(v->global_buffer_bytes, 0);
    EXPECT_TRUE(v->sequence_parallel_params.empty());
    ASSERT_EQ(v->optimizer_scratch.size(), 2u);
    EXPECT_EQ(v->optimizer_scratch[0].bytes, 2 * kH * 4);
  }
}

TEST(DTensorTest, ColwiseSavesTheGatheredSequenceWhereMegatronSavesTheShard) {
  const Graph whole = Mlp(false);
  StatusOr<Report> megatron = EstimateGraph(whole, Ranks(4, true, TensorParallelLayers::kMegatron), {});
  StatusOr<Report> dtensor = EstimateGraph(whole, Ranks(4, true, TensorParallelLayers::kDTensor), {});
  ASSERT_TRUE(megatron.ok()) << megatron.status().message();
  ASSERT_TRUE(dtensor.ok()) << dtensor.status().message();
  const int64_t shard = kS / 4 * kB * kH * 4, gathered = kS * kB * kH * 4;
  EXPECT_EQ(dtensor->saved_for_backward_bytes - megatron->saved_for_backward_bytes, gathered - shard);
  const auto at_end = [](const Report& r, Category c) { return r.end_of_step[static_cast<int>(c)]; };
  EXPECT_EQ(at_end(*megatron, Category::kCommunication), gathered);  // Megatron's global buffer
  EXPECT_EQ(at_end(*dtensor, Category::kCommunication), 0);
  EXPECT_EQ(at_end(*dtensor, Category::kParameters), at_end(*megatron, Category::kParameters));
}

TEST(DTensorTest, TheRowSplitEmbeddingsGradientIsTheWholeTable) {
  GraphBuilder b;
  const int ids = b.Input("ids", {2, 32}, DType::kInt64, 0);
  const int w = b.Parameter("tok_embeddings.weight", {256, 64}, DType::kFloat32);
  const int e = b.Add1("embedding", {w, ids});
  const int n = b.Add1("layer_norm", {e, b.Parameter("norm.weight", {64}, DType::kFloat32),
                                      b.Parameter("norm.bias", {64}, DType::kFloat32)});
  const int v = b.Add1("view", {n}, {{"shape", std::vector<int64_t>{-1, 64}}});
  const int logits = b.Add1("linear", {v, b.Parameter("output.weight", {256, 64}, DType::kFloat32)});
  b.BeginLoss();
  const int y = b.Target("y", {2, 32}, DType::kInt64, 0);
  b.SetLoss(b.Add1("cross_entropy", {logits, b.Add1("view", {y}, {{"shape", std::vector<int64_t>{-1}}})}));
  const Graph whole = b.Finish().value();
  RunConfig c = Ranks(2, true, TensorParallelLayers::kDTensor);
  c.parallelism.tensor_plan = {{"tok_embeddings", TensorShardStyle::kRowwise},
                               {"output", TensorShardStyle::kColwise}};
  StatusOr<TensorParallelView> view = ShardTensorParallel(whole, c.parallelism);
  ASSERT_TRUE(view.ok()) << view.status().message();
  // The shard's view stays (unread, no bytes); the gathered module input is viewed again.
  EXPECT_EQ(Kinds(view->graph), "dtensor_embedding layer_norm view tp_all_gather view linear view "
                                "loss_parallel_cross_entropy mean ");
  ASSERT_EQ(view->whole_grads.size(), 1u);
  EXPECT_EQ(view->whole_grads[0].bytes, 256 * 64 * 4);
  StatusOr<Report> dtensor = EstimateGraph(whole, c, {});
  c.parallelism.tensor_layers = TensorParallelLayers::kMegatron;
  StatusOr<Report> megatron = EstimateGraph(whole, c, {});
  ASSERT_TRUE(dtensor.ok()) << dtensor.status().message();
  ASSERT_TRUE(megatron.ok()) << megatron.status().message();
  const auto grads = [](const Report& r) { return r.end_of_step[static_cast<int>(Category::kGradients)]; };
  // [V, h] where Megatron's rank holds [V/2, h]; the optimizer state stays the rank's.
  EXPECT_EQ(grads(*dtensor) - grads(*megatron), 128 * 64 * 4);
  const auto state = [](const Report& r) { return r.end_of_step[static_cast<int>(Category::kOptimizerState)]; };
  EXPECT_EQ(state(*dtensor), state(*megatron));
}

// The loss_parallel op on [N, V/t] logits of `dtype` (a parameter, so that it needs grad).
OpMemory LossParallel(DType dtype, bool nll_float32, Graph* keep) {
  GraphBuilder b;
  const int x = b.Parameter("logits", {64, 128}, dtype);
  const int y = b.Input("y", {64}, DType::kInt64, 0);
  Attrs attrs{{"tp", int64_t{2}}};
  if (nll_float32) attrs["nll_float32"] = int64_t{1};
  b.BeginLoss();
  b.SetLoss(b.Add1("mean", {b.Add1("loss_parallel_cross_entropy", {x, y}, std::move(attrs))}));
  *keep = b.Finish().value();
  const Op& op = keep->ops[0];
  OpCall call{op, {&keep->tensors[op.inputs[0]], &keep->tensors[op.inputs[1]]},
              {&keep->tensors[op.outputs[0]]}, "", true, Runtime::kCuda};
  return OpMemoryOf(call);
}

int64_t Sum(const std::vector<Alloc>& a) {
  int64_t n = 0;
  for (const Alloc& x : a) n += x.bytes;
  return n;
}

TEST(DTensorTest, LossParallelComputesInFloat32) {
  const int64_t l = 64 * 128, columns = 3 * 64 * 4;
  Graph g;
  // float32 logits: shifted beside the saved log-probabilities.
  OpMemory f32 = LossParallel(DType::kFloat32, false, &g);
  EXPECT_EQ(Sum(f32.forward_temps), 4 * l + columns);
  EXPECT_EQ(Sum(f32.saved_extras), 4 * l + 4);
  // bf16 logits: _log_softmax's float32 copy, shifted and result, then the bf16 result saved
  // (14 bytes an element beside the logits at its last moment).
  OpMemory bf16 = LossParallel(DType::kBFloat16, false, &g);
  EXPECT_EQ(Sum(bf16.forward_temps), 12 * l + columns);
  EXPECT_EQ(Sum(bf16.saved_extras), 2 * l + 4);
  EXPECT_EQ(Sum(bf16.backward_temps), 4 * l + 8 * 64);  // zeros and exp in bf16
  // Autocast: nll_loss saves a float32 copy of the bf16 log-probabilities and back-propagates in
  // float32, cast to bf16 at the end.
  OpMemory amp = LossParallel(DType::kBFloat16, true, &g);
  EXPECT_EQ(Sum(amp.saved_extras), 2 * l + 4 * l + 4);
  EXPECT_EQ(Sum(amp.backward_temps), 12 * l + 8 * 64);
}

TEST(DTensorTest, AutocastCastsAfterTheGatherWhichTheModuleHolds) {
  // attention_norm -> attention.wq / wk / wv each reading the norm output, under bf16 autocast:
  // one gather of the float32 module input, cast for each linear, held until the module returns.
  GraphBuilder b;
  const int x = b.Input("x", {kB, kS, kH}, DType::kFloat32, 0);
  b.PushScope("attention_norm");
  const int a = b.Add1("layer_norm", {x, b.Parameter("w", {kH}, DType::kFloat32),
                                      b.Parameter("b", {kH}, DType::kFloat32)});
  b.PopScope();
  b.PushScope("attention");
  int sum = -1;
  for (const char* m : {"wq", "wk", "wv"}) {
    b.PushScope(m);
    const int y = b.Add1("linear", {a, b.Parameter(std::string("attention.") + m + ".weight", {kH, kH},
                                                   DType::kFloat32)});
    b.PopScope();
    sum = sum < 0 ? y : b.Add1("add", {sum, y});
  }
  b.PushScope("wo");
  sum = b.Add1("linear", {sum, b.Parameter("attention.wo.weight", {kH, kH}, DType::kFloat32)});
  b.PopScope();
  b.PopScope();
  b.BeginLoss();
  b.SetLoss(b.Add1("mean", {b.Add1("add", {x, sum})}));
  const Graph whole = b.Finish().value();
  RunConfig c = PlainTraining();
  c.precision = Precision::kBf16Amp;
  c.parallelism.tensor = 2;
  c.parallelism.sequence_parallel = true;
  c.parallelism.tensor_layers = TensorParallelLayers::kDTensor;
  c.parallelism.tensor_plan = {{"attention.wq", TensorShardStyle::kColwise},
                               {"attention.wk", TensorShardStyle::kColwise},
                               {"attention.wv", TensorShardStyle::kColwise},
                               {"attention.wo", TensorShardStyle::kRowwise}};
  StatusOr<Report> r = EstimateGraph(whole, c, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  bool one_gather = false;
  // The gather and wo's reduce-scatter.
  for (const std::string& n : r->notes) one_gather |= n.find("2 collectives per forward") != std::string::npos;
  EXPECT_TRUE(one_gather);
}

TEST(DTensorTest, RefusesWhatItDoesNotModel) {
  RunConfig c = Ranks(1, false, TensorParallelLayers::kDTensor);
  c.parallelism.tensor_plan.clear();
  StatusOr<Report> r = EstimateGraph(Mlp(false), c, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("config.parallelism.tensor_layers"), std::string::npos)
      << r.status().message();

  RunConfig megatron_ddp = Ranks(2, false, TensorParallelLayers::kDTensor);
  megatron_ddp.runtime = Runtime::kCuda;
  megatron_ddp.parallelism.data = 2;
  megatron_ddp.parallelism.sharding = DataSharding::kMegatronDdp;
  r = EstimateGraph(Mlp(false), megatron_ddp, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("config.parallelism.tensor_layers"), std::string::npos)
      << r.status().message();

  RunConfig ddp = Ranks(2, false, TensorParallelLayers::kDTensor);
  ddp.parallelism.data = 2;
  ddp.parallelism.sharding = DataSharding::kDdp;
  r = EstimateGraph(Mlp(false), ddp, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("FSDP2"), std::string::npos) << r.status().message();

  // A table of 2^40 ranks' rows is no tensor (the dtensor_embedding op in a model file).
  GraphBuilder big;
  const int ids = big.Input("ids", {2, 8}, DType::kInt64, 0);
  big.Add1("dtensor_embedding", {big.Parameter("t", {1 << 20, 4096}, DType::kFloat32), ids},
           {{"tp", int64_t{1} << 40}});
  StatusOr<Graph> refused = big.Finish();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("attrs.tp"), std::string::npos) << refused.status().message();

  // GPT-2's lm_head reads the embedding's table: a whole-table gradient meeting a sharded one.
  RunConfig gpt2;
  gpt2.parallelism.tensor = 2;
  gpt2.parallelism.tensor_layers = TensorParallelLayers::kDTensor;
  r = Estimate(ModelSpec{PresetSpec{"gpt2-small", {{"layers", 1}, {"seq", 64}, {"vocab", 50304}}}}, gpt2, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tied"), std::string::npos) << r.status().message();
}

TEST(DTensorTest, ALlamaPresetWithTheDefaultPlan) {
  RunConfig c;
  c.precision = Precision::kBf16Amp;
  c.parallelism.tensor = 8;
  c.parallelism.sequence_parallel = true;
  const ModelSpec llama{PresetSpec{"llama-7b", {{"layers", 2}, {"seq", 256}}}};
  StatusOr<Report> megatron = Estimate(llama, c, {});
  c.parallelism.tensor_layers = TensorParallelLayers::kDTensor;
  StatusOr<Report> dtensor = Estimate(llama, c, {});
  ASSERT_TRUE(megatron.ok()) << megatron.status().message();
  ASSERT_TRUE(dtensor.ok()) << dtensor.status().message();
  // Every attention and MLP saves the whole sequence it gathered.
  EXPECT_GT(dtensor->saved_for_backward_bytes, megatron->saved_for_backward_bytes);
  const auto grads = [](const Report& r) { return r.end_of_step[static_cast<int>(Category::kGradients)]; };
  EXPECT_EQ(grads(*dtensor) - grads(*megatron), int64_t{32000} * 4096 * 4 * 7 / 8);
}

}  // namespace
}  // namespace memest
