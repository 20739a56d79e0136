// Repeated blocks stamped rather than built (GraphBuilder::StampBlock, RepeatBlocks): the graph
// is the same as the one built block by block, for every preset and test config, and a copy is
// refused wherever building would make something else.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/estimator.h"
#include "engine/ir/graph.h"
#include "engine/models/model.h"
#include "engine/models/presets.h"
#include "engine/passes/passes.h"
#include "engine/rules/op_rules.h"
#include "tests/engine/hf_json.h"

namespace memest {
namespace {

using enginetest::HfModel;

std::string Ids(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += std::to_string(x) + ",";
  return s;
}

// The first field in which `a` and `b` differ, or "" when they are the same graph.
std::string FirstDifference(const Graph& a, const Graph& b) {
  if (a.tensors.size() != b.tensors.size()) return "the number of tensors";
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const Tensor &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.shape != y.shape || x.strides != y.strides || x.dtype != y.dtype ||
        x.role != y.role || x.requires_grad != y.requires_grad || x.producer != y.producer ||
        x.alias_of != y.alias_of || x.batch_dim != y.batch_dim || x.kv_cache != y.kv_cache ||
        x.values_per_element != y.values_per_element) {
      return "tensor " + std::to_string(i) + " (" + x.name + " / " + y.name + ")";
    }
  }
  if (a.ops.size() != b.ops.size()) return "the number of ops";
  for (size_t i = 0; i < a.ops.size(); ++i) {
    const Op &x = a.ops[i], &y = b.ops[i];
    if (x.kind != y.kind || x.inputs != y.inputs || x.outputs != y.outputs || x.attrs != y.attrs ||
        x.scope != y.scope) {
      return "op " + std::to_string(i) + " (" + x.kind + " in " + x.scope + " / " + y.kind +
             " in " + y.scope + ", inputs " + Ids(x.inputs) + " / " + Ids(y.inputs) + ")";
    }
  }
  if (a.held.size() != b.held.size()) return "the number of held tensors";
  for (size_t i = 0; i < a.held.size(); ++i) {
    if (a.held[i].tensor != b.held[i].tensor || a.held[i].until_op != b.held[i].until_op) {
      return "held " + std::to_string(i);
    }
  }
  if (a.loss != b.loss || a.loss_begin != b.loss_begin) return "the loss";
  if (a.blocks != b.blocks) return "the blocks";
  if (a.checkpoints != b.checkpoints || a.checkpoint_non_reentrant != b.checkpoint_non_reentrant) {
    return "the checkpoints";
  }
  if (a.outputs != b.outputs) return "the outputs";
  if (a.cache != b.cache) return "the cache";
  if (a.autocast != b.autocast || a.runtime != b.runtime) return "autocast or the runtime";
  return "";
}

// The contexts a model is built in: training with and without autocast, inference with a KV
// cache, vLLM's profile run, Megatron-LM, the CPU runtime.
std::vector<std::pair<std::string, BuildContext>> Contexts() {
  std::vector<std::pair<std::string, BuildContext>> out;
  BuildContext fp32;
  fp32.micro_batch = 2;
  out.emplace_back("training fp32 eager", fp32);
  BuildContext amp = fp32;
  amp.autocast = DType::kBFloat16;
  amp.attention = AttentionImpl::kSdpa;
  amp.use_cache = true;
  out.emplace_back("training bf16 autocast sdpa use_cache", amp);
  BuildContext infer;
  infer.mode = Mode::kInference;
  infer.param_dtype = DType::kBFloat16;
  infer.generate_tokens = 16;
  infer.attention = AttentionImpl::kSdpa;
  infer.use_cache = true;
  out.emplace_back("inference bf16 kv cache", infer);
  BuildContext served = infer;
  served.generate_tokens = 0;
  served.serving = true;
  served.rotary_positions = 4096;
  served.rotary_local_positions = 4096;
  served.attention = AttentionImpl::kFlash;
  out.emplace_back("vllm profile run", served);
  BuildContext megatron = amp;
  megatron.megatron = true;
  out.emplace_back("megatron", megatron);
  BuildContext cpu = fp32;
  cpu.runtime = Runtime::kCpuTorch113;
  out.emplace_back("cpu", cpu);
  return out;
}

// Returns how many of the contexts built the model (the others refused it alike).
int ExpectStampedAsBuilt(const ModelSpec& model, const std::string& name) {
  int built_ok = 0;
  for (const auto& [what, context] : Contexts()) {
    BuildContext built = context;
    built.stamp_blocks = false;
    const StatusOr<Graph> a = BuildGraph(model, context);
    const StatusOr<Graph> b = BuildGraph(model, built);
    EXPECT_EQ(a.ok(), b.ok()) << name << ", " << what;
    if (a.ok() != b.ok()) continue;
    if (!a.ok()) {
      EXPECT_EQ(a.status().message(), b.status().message()) << name << ", " << what;
      continue;
    }
    EXPECT_EQ(FirstDifference(*a, *b), "") << name << ", " << what;
    ++built_ok;
  }
  return built_ok;
}

TEST(BlockStampTest, EveryPresetIsTheGraphBuiltBlockByBlock) {
  int built = 0;
  for (const PresetInfo& p : ListPresets()) {
    PresetSpec spec{p.name, {}};
    for (const PresetParam& param : p.params) {
      if (param.name == "seq") spec.params["seq"] = 64;  // short, for a fast test
    }
    ModelSpec model;
    model.source = spec;
    built += ExpectStampedAsBuilt(model, p.name);
  }
  EXPECT_GE(built, 74);  // of 13 presets in 6 contexts
}

TEST(BlockStampTest, EveryTestConfigIsTheGraphBuiltBlockByBlock) {
  const std::filesystem::path dir = std::string(MEMEST_SOURCE_DIR) + "/tests/data/hf_configs";
  int configs = 0, built = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    const std::string name = entry.path().stem().string();
    // A ViT's sequence is its patches: left to the config.
    built +=
        ExpectStampedAsBuilt(HfModel(name, name.find("vit") == std::string::npos ? 64 : 0), name);
    ++configs;
  }
  EXPECT_GE(built, 211);  // of 39 configs in 6 contexts
  EXPECT_GE(configs, 39);
}

TEST(BlockStampTest, CopiesNameTheOpTheyWereCopiedFrom) {
  ModelSpec model;
  model.source = PresetSpec{"gpt2-small", {{"seq", 64}}};
  BuildContext context;
  context.autocast = DType::kBFloat16;
  StatusOr<Graph> g = BuildGraph(model, context);
  ASSERT_TRUE(g.ok()) << g.status().message();
  ASSERT_EQ(g->copy_of.size(), g->ops.size());
  int copies = 0;
  for (size_t i = 0; i < g->ops.size(); ++i) {
    const int from = g->copy_of[i];
    if (from < 0) continue;
    ++copies;
    EXPECT_LT(from, static_cast<int>(i));
    EXPECT_EQ(g->copy_of[from], -1);  // the op built, not a copy of it
    EXPECT_TRUE(OpsAlikeToRules(*g, static_cast<int>(i), from)) << i;
  }
  // Blocks 0 and 1 are built; 2 to 11 are copies of block 1.
  const int per_block = copies / 10;
  EXPECT_EQ(copies, 10 * per_block);
  EXPECT_GT(per_block, 20);
  BuildContext built = context;
  built.stamp_blocks = false;
  EXPECT_TRUE(BuildGraph(model, built)->copy_of.empty());
}

// A pass that replays the graph keeps the hints, for the ops that replaced a copy and its
// original: under autocast each op of a block becomes its casts and itself, alike block to block.
TEST(BlockStampTest, AReplayedGraphKeepsItsCopyHints) {
  ModelSpec model;
  model.source = PresetSpec{"gpt2-small", {{"seq", 64}}};
  StatusOr<Graph> g = BuildGraph(model, BuildContext{});
  ASSERT_TRUE(g.ok()) << g.status().message();
  StatusOr<Graph> amp = ApplyAutocast(*g, DType::kBFloat16);
  ASSERT_TRUE(amp.ok()) << amp.status().message();
  ASSERT_EQ(amp->copy_of.size(), amp->ops.size());
  int hints = 0, before = 0;
  for (int from : g->copy_of) before += from >= 0;
  for (size_t i = 0; i < amp->ops.size(); ++i) {
    if (amp->copy_of[i] < 0) continue;
    ++hints;
    EXPECT_TRUE(OpsAlikeToRules(*amp, static_cast<int>(i), amp->copy_of[i])) << i;
  }
  EXPECT_GT(hints, before);  // the casts of the copies' weights too
}

// A pass may change a copy and not its original: the simulator then shares nothing between
// them, and the estimate is the one of the graph without hints.
TEST(BlockStampTest, AStaleCopyHintChangesNoAnswer) {
  ModelSpec model;
  model.source = PresetSpec{"gpt2-small", {{"seq", 64}}};
  BuildContext context;
  context.micro_batch = 4;
  StatusOr<Graph> g = BuildGraph(model, context);
  ASSERT_TRUE(g.ok()) << g.status().message();
  int changed = 0;
  for (size_t i = 0; i < g->ops.size(); ++i) {
    Op& op = g->ops[i];
    if (g->copy_of[i] < 0 || op.kind != "dropout") continue;
    op.attrs["p"] = 0.0;  // no mask kept
    ++changed;
  }
  ASSERT_GT(changed, 0);
  EXPECT_FALSE(OpsAlikeToRules(*g, static_cast<int>(g->ops.size()) - 1, 0));
  Graph plain = *g;
  plain.copy_of.clear();
  RunConfig config;
  config.batch_size = 4;
  EstimateOptions quiet;
  quiet.advice = false;
  StatusOr<Report> hinted = EstimateGraph(*g, config, quiet);
  StatusOr<Report> unhinted = EstimateGraph(plain, config, quiet);
  ASSERT_TRUE(hinted.ok() && unhinted.ok());
  EXPECT_EQ(hinted->peak.allocated_bytes, unhinted->peak.allocated_bytes);
  EXPECT_EQ(hinted->peak_reserved_bytes, unhinted->peak_reserved_bytes);
  EXPECT_EQ(hinted->saved_for_backward_bytes, unhinted->saved_for_backward_bytes);
  // And the change is one the estimate sees: the unchanged graph keeps more.
  StatusOr<Graph> original = BuildGraph(model, context);
  StatusOr<Report> before = EstimateGraph(*original, config, quiet);
  ASSERT_TRUE(before.ok());
  EXPECT_GT(before->saved_for_backward_bytes, hinted->saved_for_backward_bytes);
}

// A block on [2, 8]: its own weight, linear, gelu (held until it ran; `inner` is set to it),
// and the residual add of `extra` (-1: its input).
int OneBlock(GraphBuilder& b, int x, int extra, int* inner = nullptr) {
  const int w = b.Parameter("weight", {8, 8}, DType::kFloat32);
  int y = b.Add1("linear", {x, w});
  y = b.Add1("gelu", {y});
  b.HoldUntilLastOp(y);
  if (inner != nullptr) *inner = y;
  return b.Add1("add", {y, extra >= 0 ? extra : x});
}

TEST(BlockStampTest, ACopyReadsItsOwnInputAndRenamesItsScope) {
  GraphBuilder b;
  int h = b.Input("x", {2, 8}, DType::kFloat32);
  const int loop_start = b.num_tensors();
  GraphBuilder::BlockMark mark;
  for (int i = 0; i < 2; ++i) {
    ScopeGuard s(b, "h." + std::to_string(i));
    mark = b.BeginBlock(h);
    h = OneBlock(b, h, -1);
    b.EndBlock(h, &mark);
  }
  ASSERT_TRUE(mark.stampable);
  const int ops = b.num_ops();
  int copy = -1;
  {
    ScopeGuard s(b, "h.2");
    copy = b.StampBlock(mark, h, loop_start);
  }
  ASSERT_GE(copy, 0);
  StatusOr<Graph> g = b.Finish();
  ASSERT_TRUE(g.ok()) << g.status().message();
  ASSERT_EQ(g->ops.size(), static_cast<size_t>(ops) + 3);
  const Op& linear = g->ops[ops];
  EXPECT_EQ(linear.kind, "linear");
  EXPECT_EQ(linear.scope, "h.2");
  EXPECT_EQ(linear.inputs[0], h);  // the previous block's output, not the copied block's input
  EXPECT_EQ(g->tensors[linear.inputs[1]].name, "h.2.weight");
  EXPECT_EQ(g->ops.back().outputs[0], copy);
  EXPECT_EQ(g->held.back().until_op, ops + 1);
  EXPECT_EQ(g->held.back().tensor, g->ops[ops + 1].outputs[0]);
}

TEST(BlockStampTest, RefusesWhatBuildingWouldMakeOtherwise) {
  GraphBuilder b;
  int h = b.Input("x", {2, 8}, DType::kFloat32);
  const int loop_start = b.num_tensors();
  int inner0 = -1;
  {
    ScopeGuard s(b, "h.0");
    h = OneBlock(b, h, -1, &inner0);
  }
  GraphBuilder::BlockMark clean, reaching;
  {
    ScopeGuard s(b, "h.1");
    clean = b.BeginBlock(h);
    h = OneBlock(b, h, -1);
    b.EndBlock(h, &clean);
  }
  {
    ScopeGuard s(b, "h.2");
    reaching = b.BeginBlock(h);
    h = OneBlock(b, h, inner0);  // reads block 0's gelu beside its own input
    b.EndBlock(h, &reaching);
  }
  ASSERT_TRUE(clean.stampable && reaching.stampable);
  const int before = b.num_ops();
  ScopeGuard s(b, "h.3");
  // A block that reads a tensor of the loop other than its input.
  EXPECT_EQ(b.StampBlock(reaching, h, loop_start), -1);
  // An input the block's ops would see differently: another shape, dtype, role.
  const int wide = b.Add1("cat", {h, h}, {{"dim", int64_t{1}}});
  EXPECT_EQ(b.StampBlock(clean, wide, loop_start), -1);
  const int half = b.Add1("to", {h}, {{"dtype", std::string("float16")}});
  EXPECT_EQ(b.StampBlock(clean, half, loop_start), -1);
  const int leaf = b.Input("y", {2, 8}, DType::kFloat32);
  EXPECT_EQ(b.StampBlock(clean, leaf, loop_start), -1);
  // Past the op limit: building it makes the error.
  b.SetMaxOps(b.num_ops() + 1);
  EXPECT_EQ(b.StampBlock(clean, h, loop_start), -1);
  b.SetMaxOps(1'000'000);
  // Not while stamping is off.
  b.SetStamping(false);
  EXPECT_EQ(b.StampBlock(clean, h, loop_start), -1);
  b.SetStamping(true);
  EXPECT_EQ(b.num_ops(), before + 2);  // only the cat and the cast were added
  EXPECT_GE(b.StampBlock(clean, h, loop_start), 0);
  EXPECT_EQ(b.num_ops(), before + 5);
  EXPECT_TRUE(b.ok());
}

}  // namespace
}  // namespace memest
