// Tensor parallelism (engine/passes/tensor_parallel.h, engine/rules/parallel.cc,
// engine/step/tensor_parallel.cc): the plan, the rank's shapes and ops, sequence parallelism's
// buffers, composition with the other strategies, and the refusals. The measured truth for
// whole steps is tests/parallel (tp.py; run.py --memest).
#include "engine/passes/tensor_parallel.h"

#include <gtest/gtest.h>

#include <string>

#include "engine/estimator.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::PlainTraining;

// x [s=32, b=4, h=64] -> LayerNorm -> fc1 (h -> 256) -> GELU -> fc2 (256 -> h) -> + x -> mean.
Graph Mlp(int64_t h = 64) {
  GraphBuilder b;
  const int x = b.Input("x", {32, 4, h}, DType::kFloat32, /*batch_dim=*/1);
  const int a = b.Add1("layer_norm", {x, b.Parameter("ln.weight", {h}, DType::kFloat32),
                                      b.Parameter("ln.bias", {h}, DType::kFloat32)});
  int u = b.Add1("linear", {a, b.Parameter("fc1.weight", {256, h}, DType::kFloat32),
                            b.Parameter("fc1.bias", {256}, DType::kFloat32)});
  u = b.Add1("gelu", {u});
  const int y = b.Add1("linear", {u, b.Parameter("fc2.weight", {h, 256}, DType::kFloat32),
                                  b.Parameter("fc2.bias", {h}, DType::kFloat32)});
  b.BeginLoss();
  b.SetLoss(b.Add1("mean", {b.Add1("add", {x, y})}));
  return b.Finish().value();
}

ParallelismConfig TensorRanks(int64_t t, bool sp = false) {
  ParallelismConfig p;
  p.tensor = t;
  p.sequence_parallel = sp;
  p.tensor_plan = {{"fc1", TensorShardStyle::kColwise}, {"fc2", TensorShardStyle::kRowwise}};
  return p;
}

const Tensor& Named(const Graph& g, const std::string& name) {
  for (const Tensor& t : g.tensors) {
    if (t.name == name) return t;
  }
  static const Tensor kNone;
  ADD_FAILURE() << "no tensor " << name;
  return kNone;
}

std::string Kinds(const Graph& g) {
  std::string s;
  for (const Op& op : g.ops) s += op.kind + " ";
  return s;
}

TEST(TensorParallelTest, PlanPatternsMatchWholePathsOrDottedSuffixes) {
  EXPECT_TRUE(PlanMatches("attn.c_proj", "h.3.attn.c_proj"));
  EXPECT_FALSE(PlanMatches("attn.c_proj", "h.3.mlp.c_proj"));
  EXPECT_TRUE(PlanMatches("q_proj", "model.layers.0.self_attn.q_proj"));
  EXPECT_FALSE(PlanMatches("q_proj", "model.layers.0.self_attn.xq_proj"));
  EXPECT_TRUE(PlanMatches("h.*.mlp.c_fc", "h.11.mlp.c_fc"));
  EXPECT_TRUE(PlanMatches("*", "anything.at.all"));
  EXPECT_FALSE(PlanMatches("fc", "fc1"));
}

TEST(TensorParallelTest, ColumnThenRowSplitsWeightsAndAllReducesTheOutput) {
  StatusOr<TensorParallelView> v = ShardTensorParallel(Mlp(), TensorRanks(4));
  ASSERT_TRUE(v.ok()) << v.status().message();
  const Graph& g = v->graph;
  EXPECT_EQ(Named(g, "fc1.weight").shape, (Shape{64, 64}));  // output features / 4
  EXPECT_EQ(Named(g, "fc1.bias").shape, (Shape{64}));
  EXPECT_EQ(Named(g, "fc2.weight").shape, (Shape{64, 64}));  // input features / 4
  EXPECT_EQ(Named(g, "fc2.bias").shape, (Shape{64}));        // replicated
  EXPECT_EQ(Named(g, "ln.weight").shape, (Shape{64}));
  EXPECT_EQ(Kinds(g), "layer_norm megatron_linear gelu megatron_linear tp_all_reduce add add mean ");
  EXPECT_EQ(v->sharded_params, 3);
  EXPECT_EQ(v->global_buffer_bytes, 0);
  EXPECT_TRUE(v->sequence_parallel_params.empty());
  // The column-parallel output [32, 4, 256/4]; the row-parallel one whole again.
  EXPECT_EQ(g.tensors[g.ops[1].outputs[0]].shape, (Shape{32, 4, 64}));
  EXPECT_EQ(g.tensors[g.ops[4].outputs[0]].shape, (Shape{32, 4, 64}));
  // Each rank sends 2(t-1)/t of the row output's all-reduce and of the column's input gradient.
  const int64_t act = 32 * 4 * 64 * 4;
  EXPECT_EQ(v->communicated_bytes, 2 * (act / 4 * 3) * 2);
}

TEST(TensorParallelTest, SequenceParallelSplitsTheInputsAndGathersIntoTheGlobalBuffer) {
  StatusOr<TensorParallelView> v = ShardTensorParallel(Mlp(), TensorRanks(4, true));
  ASSERT_TRUE(v.ok()) << v.status().message();
  const Graph& g = v->graph;
  EXPECT_EQ(Named(g, "x").shape, (Shape{8, 4, 64}));  // [s/4, b, h]: the batch is dim 1
  EXPECT_EQ(Kinds(g), "layer_norm megatron_linear gelu megatron_linear tp_reduce_scatter add add mean ");
  EXPECT_EQ(g.tensors[g.ops[1].outputs[0]].shape, (Shape{32, 4, 64}));  // gathered: whole s
  EXPECT_EQ(g.tensors[g.ops[4].outputs[0]].shape, (Shape{8, 4, 64}));   // scattered again
  EXPECT_EQ(v->global_buffer_bytes, 32 * 4 * 64 * 4);  // the whole [s, b, h] input
  EXPECT_EQ(v->first_gather_op, 1);
  // ln.weight, ln.bias and fc2.bias meet sequence-split activations.
  EXPECT_EQ(v->sequence_parallel_params.size(), 3u);
}

TEST(TensorParallelTest, EstimateShrinksTheRankAndKeepsTheGlobalBuffer) {
  const Graph whole = Mlp();
  RunConfig one = PlainTraining();
  one.runtime = Runtime::kCpuTorch113;  // tensors at their own size
  RunConfig four = one;
  four.parallelism = TensorRanks(4, true);
  StatusOr<Report> a = EstimateGraph(whole, one, {});
  StatusOr<Report> b = EstimateGraph(whole, four, {});
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  const auto at_end = [](const Report& r, Category c) { return r.end_of_step[static_cast<int>(c)]; };
  // fc1 and fc2 hold 1/4 of their weights; the norm and fc2's bias stay whole.
  const int64_t split = (256 * 64 + 256 + 64 * 256) * 4, whole_rest = (64 + 64 + 64) * 4;
  EXPECT_EQ(at_end(*a, Category::kParameters), split + whole_rest);
  EXPECT_EQ(at_end(*b, Category::kParameters), split / 4 + whole_rest);
  EXPECT_EQ(at_end(*b, Category::kCommunication), 32 * 4 * 64 * 4);  // the global buffer stays
  EXPECT_LT(b->peak.allocated_bytes, a->peak.allocated_bytes);
  EXPECT_LT(b->saved_for_backward_bytes, a->saved_for_backward_bytes / 2);
  EXPECT_GT(b->communicated_bytes_per_step, 0);
}

TEST(TensorParallelTest, TheFirstStepMakesTheBufferAtItsFirstGather) {
  RunConfig c = PlainTraining();
  c.parallelism = TensorRanks(4, true);
  c.step = StepKind::kFirstStep;
  StatusOr<Report> first = EstimateGraph(Mlp(), c, {});
  c.step = StepKind::kSteadyState;
  StatusOr<Report> steady = EstimateGraph(Mlp(), c, {});
  ASSERT_TRUE(first.ok() && steady.ok());
  const int64_t buffer = 32 * 4 * 64 * 4;
  const auto data = [](const Report& r) { return r.phases[static_cast<int>(Phase::kData)]; };
  EXPECT_EQ(data(*first).by_category[static_cast<int>(Category::kCommunication)], 0);
  EXPECT_EQ(data(*steady).by_category[static_cast<int>(Category::kCommunication)], buffer);
}

TEST(TensorParallelTest, RefusesWhatWouldMixTheRanksValues) {
  ParallelismConfig only_row = TensorRanks(4);
  only_row.tensor_plan = {{"fc2", TensorShardStyle::kRowwise}};
  StatusOr<TensorParallelView> v = ShardTensorParallel(Mlp(), only_row);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("row-parallel linear reads input features that no "
                                      "column-parallel linear split"), std::string::npos)
      << v.status().message();

  ParallelismConfig only_column = TensorRanks(4);
  only_column.tensor_plan = {{"fc1", TensorShardStyle::kColwise}};
  v = ShardTensorParallel(Mlp(), only_column);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("op 3 (linear)"), std::string::npos) << v.status().message();

  ParallelismConfig typo = TensorRanks(4);
  typo.tensor_plan.push_back({"fc3", TensorShardStyle::kColwise});
  v = ShardTensorParallel(Mlp(), typo);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().message(),
            "config.parallelism.tensor_plan[2].module: 'fc3' matches no module with parameters");

  v = ShardTensorParallel(Mlp(), TensorRanks(3));
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("3 ranks do not split dim 0 of 'fc1.weight' [256, 64]"),
            std::string::npos)
      << v.status().message();
}

TEST(TensorParallelTest, RefusesASoftmaxOverSplitFeatures) {
  GraphBuilder b;
  const int x = b.Input("x", {4, 16}, DType::kFloat32);
  const int u = b.Add1("linear", {x, b.Parameter("fc.weight", {32, 16}, DType::kFloat32)});
  b.BeginLoss();
  b.SetLoss(b.Add1("mean", {b.Add1("softmax", {u}, {{"dim", int64_t{-1}}})}));
  ParallelismConfig p;
  p.tensor = 2;
  p.tensor_plan = {{"fc", TensorShardStyle::kColwise}};
  StatusOr<TensorParallelView> v = ShardTensorParallel(b.Finish().value(), p);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("op 1 (softmax): works across dim 1"), std::string::npos)
      << v.status().message();
}

TEST(TensorParallelTest, ConfigRefusesTensorSettingsWithoutTensorRanks) {
  RunConfig c = PlainTraining();
  c.parallelism.sequence_parallel = true;
  EXPECT_NE(ValidateRunConfig(c).message().find("config.parallelism.sequence_parallel"),
            std::string::npos);
  c.parallelism.sequence_parallel = false;
  c.parallelism.tensor = 0;
  EXPECT_NE(ValidateRunConfig(c).message().find("config.parallelism.tensor: must be in [1, 1024]"),
            std::string::npos);
  c.parallelism.tensor = 2;
  c.parallelism.tensor_plan = {{"", TensorShardStyle::kColwise}};
  EXPECT_NE(ValidateRunConfig(c).message().find("config.parallelism.tensor_plan[0].module"),
            std::string::npos);
}

RunConfig Llama(int64_t tensor, bool sp) {
  RunConfig c;
  c.precision = Precision::kBf16Amp;
  c.parallelism.tensor = tensor;
  c.parallelism.sequence_parallel = sp;
  return c;
}

ModelSpec SmallLlama() {
  return ModelSpec{PresetSpec{"llama-7b", {{"layers", 2}, {"seq", 256}}}};
}

int64_t TrainableBytes(const Graph& g) {
  int64_t n = 0;
  for (const Tensor& t : g.tensors) {
    if (t.role == TensorRole::kParameter && t.requires_grad) n += Bytes(t.shape, t.dtype);
  }
  return n;
}

TEST(TensorParallelTest, DefaultPlanSplitsALlamaPresetByMegatronsRecipe) {
  StatusOr<Graph> whole = BuildStepGraph(SmallLlama(), Llama(8, true), 1'000'000, nullptr);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  StatusOr<TensorParallelView> v = ShardTensorParallel(*whole, Llama(8, true).parallelism);
  ASSERT_TRUE(v.ok()) << v.status().message();
  int split = 0, kept = 0;
  for (const Tensor& t : whole->tensors) {
    if (t.role != TensorRole::kParameter) continue;
    const Shape& rank = Named(v->graph, t.name).shape;
    const bool norm = t.name.find("norm") != std::string::npos;
    if (norm) {
      EXPECT_EQ(rank, t.shape) << t.name;
      ++kept;
      continue;
    }
    // q, k, v, gate, up and lm_head by output features, o and down by input features, the
    // embedding by vocabulary.
    const bool by_input = t.name.find("o_proj") != std::string::npos ||
                          t.name.find("down_proj") != std::string::npos;
    Shape want = t.shape;
    want[by_input ? 1 : 0] /= 8;
    EXPECT_EQ(rank, want) << t.name;
    ++split;
  }
  EXPECT_EQ(split, 2 * 7 + 2);  // 7 linears per block, the embedding and the head
  EXPECT_EQ(kept, 2 * 2 + 1);
  // Sequence parallelism: every norm meets the scattered hidden state.
  EXPECT_EQ(v->sequence_parallel_params.size(), 5u);

  StatusOr<Report> one = Estimate(SmallLlama(), Llama(1, false), {});
  StatusOr<Report> eight = Estimate(SmallLlama(), Llama(8, true), {});
  ASSERT_TRUE(one.ok()) << one.status().message();
  ASSERT_TRUE(eight.ok()) << eight.status().message();
  EXPECT_EQ(one->parameter_count, eight->parameter_count);  // the whole model's count
  EXPECT_LT(eight->peak.allocated_bytes, one->peak.allocated_bytes / 4);
}

TEST(TensorParallelTest, ComposesWithDataParallelAndPipelineStages) {
  RunConfig c = Llama(2, true);
  c.parallelism.data = 4;
  c.parallelism.sharding = DataSharding::kDdp;
  StatusOr<Report> ddp = Estimate(SmallLlama(), c, {});
  ASSERT_TRUE(ddp.ok()) << ddp.status().message();
  int64_t buckets = 0;
  for (int64_t b : ddp->data_parallel->bucket_bytes) buckets += b;
  // DDP's buckets hold the rank's gradients: its shares.
  StatusOr<Graph> whole = BuildStepGraph(SmallLlama(), c, 1'000'000, nullptr);
  ASSERT_TRUE(whole.ok());
  StatusOr<TensorParallelView> v = ShardTensorParallel(*whole, c.parallelism);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(buckets, TrainableBytes(v->graph));
  EXPECT_EQ(buckets * 2, TrainableBytes(*whole) + 5 * 4096 * 4);  // norms are whole on both

  RunConfig piped = Llama(2, true);
  piped.parallelism.pipeline = 2;
  piped.grad_accum_steps = 4;
  piped.batch_size = 4;
  StatusOr<Report> pp = Estimate(SmallLlama(), piped, {});
  ASSERT_TRUE(pp.ok()) << pp.status().message();
  EXPECT_EQ(pp->pipeline->per_stage.size(), 2u);
  // The stage's graph is rebuilt by the pass after the stage was planned: its backward still
  // reaches every parameter (a stale op range once left gradients out).
  RunConfig four = Llama(2, false);
  four.precision = Precision::kBf16Pure;
  four.parallelism.pipeline = 4;
  four.grad_accum_steps = 8;
  four.batch_size = 8;
  const Report stage = Estimate(ModelSpec{PresetSpec{"llama-7b", {{"layers", 8}, {"seq", 512}}}},
                                four, {}).value();
  const auto at_end = [&](Category c) { return stage.end_of_step[static_cast<int>(c)]; };
  EXPECT_GT(at_end(Category::kGradients), 0);
  EXPECT_LE(at_end(Category::kParameters) - at_end(Category::kGradients), 512 * 1024);  // buffers
}

// Interleaved stages under tensor and sequence parallelism: the passes rebuild the stage's
// graph, its chunks' op ranges move with it, and every chunk's received hidden state is split
// along the sequence: a micro-batch saves what it saves without interleaving.
TEST(TensorParallelTest, InterleavedStagesKeepTheirChunksThroughThePass) {
  RunConfig c = Llama(2, true);
  c.precision = Precision::kBf16Pure;
  c.parallelism.pipeline = 2;
  c.grad_accum_steps = 4;
  c.batch_size = 4;
  const ModelSpec model{PresetSpec{"llama-7b", {{"layers", 8}, {"seq", 512}}}};
  const Report plain = Estimate(model, c, {}).value();
  c.parallelism.pipeline_virtual_stages = 2;
  const Report inter = Estimate(model, c, {}).value();
  EXPECT_EQ(inter.saved_for_backward_bytes, plain.saved_for_backward_bytes);
  EXPECT_EQ(inter.end_of_step[static_cast<int>(Category::kGradients)],
            plain.end_of_step[static_cast<int>(Category::kGradients)]);
  EXPECT_GT(inter.pipeline->per_stage[0].peak_allocated_bytes,
            plain.pipeline->per_stage[0].peak_allocated_bytes);
}

TEST(TensorParallelTest, InferenceKeepsTheRanksKeyValueHeads) {
  RunConfig c;
  c.mode = Mode::kInference;
  c.precision = Precision::kBf16Pure;
  c.generate_tokens = 16;
  c.parallelism.tensor = 4;
  StatusOr<Graph> whole = BuildStepGraph(SmallLlama(), c, 1'000'000, nullptr);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  StatusOr<TensorParallelView> v = ShardTensorParallel(*whole, c.parallelism);
  ASSERT_TRUE(v.ok()) << v.status().message();
  int caches = 0;
  for (const Tensor& t : v->graph.tensors) {
    if (!t.kv_cache) continue;
    EXPECT_EQ(t.shape, (Shape{1, 32 / 4, 16, 128})) << t.name;  // 32 heads, 4 ranks
    ++caches;
  }
  EXPECT_EQ(caches, 4);  // k and v of 2 layers: the generated tokens' room
  ASSERT_EQ(v->graph.cache.size(), 4u);  // and the prompt's, which the forward returns
  EXPECT_EQ(v->graph.tensors[v->graph.cache[0]].shape, (Shape{1, 32 / 4, 256, 128}));
  c.parallelism.tensor = 64;  // more ranks than heads: refused where the heads split
  EXPECT_FALSE(ShardTensorParallel(*whole, c.parallelism).ok());
}

TEST(TensorParallelTest, VocabularyThatDoesNotSplitNamesMegatronsPadding) {
  StatusOr<Report> r = Estimate(ModelSpec{PresetSpec{"gpt2-small", {{"layers", 1}}}}, Llama(2, false), {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Megatron pads the vocabulary"), std::string::npos)
      << r.status().message();
  r = Estimate(ModelSpec{PresetSpec{"gpt2-small", {{"layers", 1}, {"vocab", 50304}}}},
               Llama(2, false), {});
  EXPECT_TRUE(r.ok()) << r.status().message();
}

}  // namespace
}  // namespace memest
