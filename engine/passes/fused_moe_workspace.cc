#include "engine/passes/fused_moe_workspace.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "engine/ir/shape.h"
#include "engine/passes/passes.h"

namespace memest {
namespace {

bool IsExpertLinear(const Op& op) {
  return op.kind == "linear" || op.kind == "megatron_linear" || op.kind == "w8a8_linear" ||
         op.kind == "wna16_linear";
}

// One MoE block of the graph: its first expert op, and its workspace's sizes.
struct Block {
  int first_expert_op = -1;
  int64_t bytes = 0;
  DType dtype = DType::kBFloat16;
};

int64_t Align256(int64_t bytes) { return CeilDiv(bytes, 256) * 256; }

// The workspace of the block whose router is op `router` (see the header); first_expert_op -1
// when the router's scope has no experts.
StatusOr<Block> BlockOf(const Graph& g, int router) {
  const Op& topk = g.ops[router];
  const std::string experts = topk.scope + ".experts.";
  Block block;
  int gate = -1;
  for (size_t i = router + 1; i < g.ops.size() && gate < 0; ++i) {
    const Op& op = g.ops[i];
    if (op.scope.rfind(experts, 0) != 0) continue;
    if (block.first_expert_op < 0) block.first_expert_op = static_cast<int>(i);
    if (IsExpertLinear(op)) gate = static_cast<int>(i);
  }
  if (gate < 0 || topk.inputs.empty()) return Block{};
  const Tensor& x = g.tensors[g.ops[gate].inputs[0]];
  const Tensor& y = g.tensors[g.ops[gate].outputs[0]];
  const Shape& scores = g.tensors[topk.inputs[0]].shape;
  StatusOr<int64_t> k = IntAttr(topk.attrs, "k", 1, "");
  if (!k.ok() || scores.size() != 2 || x.shape.empty() || y.shape.empty()) return Block{};
  // N: an expert's first linear's rows twice (transformers' loop), or FusedMoE's stacked w13's
  // rows over its experts (the serving build's "experts.w13").
  int64_t n = 2 * y.shape.back();
  const std::string_view module = g.ops[gate].scope;
  if (module.size() >= 4 && module.substr(module.size() - 4) == ".w13") {
    int64_t experts = 0;
    for (size_t i = gate + 1; i < g.ops.size() && experts == 0; ++i) {
      if (g.ops[i].kind != "fused_experts") continue;
      StatusOr<int64_t> e = IntAttr(g.ops[i].attrs, "experts", 0, "");
      experts = e.ok() ? *e : 0;
    }
    if (experts <= 0) return Block{};
    n = y.shape.back() / experts;
  }
  const int64_t tokens = scores[0], hidden = x.shape.back();
  const int64_t size = DTypeSize(y.dtype);
  // max(M * top_k * max(N / 2, K), M * K) and M * top_k * max(N, K) values; bounded by the
  // graph's sizes all the same, checked.
  MEMEST_ASSIGN_OR_RETURN(int64_t chosen, CheckedMul(tokens, *k));
  MEMEST_ASSIGN_OR_RETURN(int64_t first, CheckedMul(chosen, std::max(n / 2, hidden)));
  MEMEST_ASSIGN_OR_RETURN(int64_t out, CheckedMul(tokens, hidden));
  MEMEST_ASSIGN_OR_RETURN(int64_t second, CheckedMul(chosen, std::max(n, hidden)));
  MEMEST_ASSIGN_OR_RETURN(int64_t a, CheckedMul(std::max(first, out), size));
  MEMEST_ASSIGN_OR_RETURN(int64_t b, CheckedMul(second, size));
  MEMEST_ASSIGN_OR_RETURN(block.bytes, CheckedAdd(Align256(a), Align256(b)));
  block.dtype = y.dtype;
  return block;
}

StatusOr<std::vector<Block>> Blocks(const Graph& g) {
  std::vector<Block> blocks;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    if (g.ops[i].kind != "topk") continue;
    MEMEST_ASSIGN_OR_RETURN(Block b, BlockOf(g, static_cast<int>(i)));
    if (b.first_expert_op >= 0) blocks.push_back(b);
  }
  return blocks;
}

}  // namespace

StatusOr<FusedMoeWorkspace> FindFusedMoeWorkspace(const Graph& rank) {
  MEMEST_ASSIGN_OR_RETURN(std::vector<Block> blocks, Blocks(rank));
  FusedMoeWorkspace w;
  if (blocks.empty()) return w;
  // The manager grows its buffer to the largest block's need; the blocks of one model are
  // alike, and the largest is taken at the first.
  w.first_expert_op = blocks.front().first_expert_op;
  w.dtype = blocks.front().dtype;
  for (const Block& b : blocks) w.bytes = std::max(w.bytes, b.bytes);
  return w;
}

StatusOr<Graph> AddFusedMoeWorkspace(const Graph& rank, const FusedMoeWorkspace& w,
                                     Budget* budget) {
  if (w.bytes <= 0 || w.first_expert_op < 0) return rank;
  const int64_t size = DTypeSize(w.dtype);
  int workspace = -1;
  auto emit = [&](int i, GraphBuilder& b, std::vector<int>& map) {
    if (i != w.first_expert_op) return false;
    workspace = b.Add1("full", {}, {{"shape", std::vector<int64_t>{CeilDiv(w.bytes, size)}},
                                    {"dtype", std::string(DTypeName(w.dtype))}});
    const Op& op = rank.ops[i];
    ReplayOp(rank, op, MappedInputs(op, map), op.attrs, b, map);
    return true;
  };
  MEMEST_ASSIGN_OR_RETURN(Graph out, ReplayGraph(rank, emit, std::nullopt, nullptr, budget));
  if (workspace >= 0 && !out.ops.empty()) {
    out.held.push_back({workspace, static_cast<int>(out.ops.size()) - 1});
  }
  return out;
}

}  // namespace memest
