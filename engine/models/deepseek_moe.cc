// DeepSeek-V3's mixture-of-experts block as transformers 4.57 runs it (DeepseekV3MoE,
// DeepseekV3TopkRouter; engine/models/layers.h, MoeOptions::deepseek). docs/moe.md says what
// each op holds.
#include <string>
#include <vector>

#include "engine/models/layers.h"
#include "engine/models/layers_internal.h"

namespace memest {

using namespace layers_internal;  // NOLINT: the helpers every layer uses

namespace {

// DeepseekV3TopkRouter.get_topk_indices (under no_grad: its ops read a detached `scores`):
// the choices [tokens, top_k] among the topk_groups best groups, each group scored by the sum
// of its two best biased scores.
int GroupedTopK(GraphBuilder& b, const LayerContext& c, int scores, const MoeOptions& o) {
  const int64_t e = o.experts, g = o.groups, per = o.experts / o.groups;
  const int bias = b.Buffer("e_score_correction_bias", {e}, c.param_dtype);
  scores = b.Add1("detach", {scores});
  const int biased = b.Add1("add", {scores, b.Add1("unsqueeze", {bias}, {{"dim", Int(0)}})});
  std::vector<int> best2 =
      b.Add("topk", {b.Add1("view", {biased}, {{"shape", Ints({-1, g, per})}})},
            {{"k", Int(2)}, {"dim", Int(-1)}});
  if (best2.size() != 2) return -1;
  const int group_scores = b.Add1("sum", {best2[0]}, {{"dim", Ints({-1})}});
  std::vector<int> groups =
      b.Add("topk", {group_scores}, {{"k", Int(o.topk_groups)}, {"dim", Int(-1)}});
  if (groups.size() != 2) return -1;
  if (!b.ok()) return -1;
  const int64_t tokens = b.shape(group_scores)[0];
  int group_mask =
      b.Add1("full", {},
             {{"shape", Ints({tokens, g})}, {"dtype", DTypeAttr(b.tensor(group_scores).dtype)}});
  group_mask = b.Add1("scatter_", {group_mask, groups[1]}, {{"dim", Int(1)}, {"value", Float(1)}});
  int score_mask = b.Add1("unsqueeze", {group_mask}, {{"dim", Int(-1)}});
  score_mask = b.Add1("expand", {score_mask}, {{"shape", Ints({tokens, g, per})}});
  score_mask = b.Add1("reshape", {score_mask}, {{"shape", Ints({tokens, e})}});
  int keep = b.Add1("to", {score_mask}, {{"dtype", DTypeAttr(DType::kBool)}});
  keep = b.Add1("bitwise_not", {keep});
  const int chosen = b.Add1("masked_fill", {biased, keep}, {{"value", Float(0)}});
  std::vector<int> top = b.Add("topk", {chosen}, {{"k", Int(o.top_k)}, {"dim", Int(-1)}});
  if (top.size() != 2) return -1;
  // The function's locals until it returns: scores_for_choice (masked now), group_scores,
  // group_idx, group_mask, score_mask; topk's values and the first scores_for_choice are gone.
  for (int local : {chosen, group_scores, groups[1], group_mask, score_mask}) {
    b.HoldUntilLastOp(local);
  }
  return top[1];
}

// DeepseekV3TopkRouter.forward on the tokens [tokens, d]: the choices and their weights.
bool Route(GraphBuilder& b, const LayerContext& c, int flat, const MoeOptions& o, int* chosen,
           int* weights) {
  ModuleScope scope(b, "gate");
  const int64_t d = LastDim(b, flat);
  const int weight = b.Parameter("weight", {o.experts, d}, c.param_dtype);
  // F.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32))
  const std::string f32(DTypeName(DType::kFloat32));
  const int logits = b.Add1(
      "linear", {b.Add1("to", {flat}, {{"dtype", f32}}), b.Add1("to", {weight}, {{"dtype", f32}})});
  const int scores = b.Add1("sigmoid", {logits});
  *chosen = GroupedTopK(b, c, scores, o);
  int w = b.Add1("gather", {scores, *chosen}, {{"dim", Int(1)}});
  if (o.norm_topk_prob) {
    int denominator = b.Add1("sum", {w}, {{"dim", Ints({-1})}, {"keepdim", Int(1)}});
    denominator = b.Add1("add", {denominator}, {{"scalar", Float(1e-20)}});
    w = b.Add1("div_", {w, denominator});
  }
  *weights = b.Add1("mul", {w}, {{"scalar", Float(o.routed_scaling)}});
  b.HoldUntilLastOp(logits);  // router_logits, until the router returns
  return b.ok();
}

// vLLM's DeepseekV2MoE (0.19, model_executor/models/deepseek_v2.py; SharedFusedMoE's runner,
// fused_moe/runner/default_moe_runner.py) in the profile run: the router GateLinear (the
// model's dtype whatever the weights' format) with its float32 e_score_correction_bias; past
// 256 tokens the shared experts then, their output kept through the routed ones; the grouped
// top-k (here a float32 sigmoid and topk, [tokens, experts] more than vLLM's fused kernel
// keeps); fused_experts over every token with FusedMoE's stacked weights; the scaling and the
// shared output added in place.
int VllmDeepseekMoe(GraphBuilder& b, const LayerContext& c, int x, const MoeOptions& o) {
  const Shape in = b.shape(x);
  const int64_t d = in[2];
  const int flat = b.Add1("view", {x}, {{"shape", Ints({-1, d})}});
  const int logits = Linear(b, c, "gate", flat, o.experts, /*bias=*/false);
  int bias = -1;
  {
    ModuleScope gate(b, "gate");
    bias = b.Buffer("e_score_correction_bias", {o.experts}, DType::kFloat32);
  }
  const int shared = o.shared_expert_ffn > 0
                         ? ExpertMlp(b, c, "shared_experts", flat, o.shared_expert_ffn, o)
                         : -1;
  const std::string f32(DTypeName(DType::kFloat32));
  const int scores = b.Add1("sigmoid", {b.Add1("to", {logits}, {{"dtype", f32}})});
  std::vector<int> top =
      b.Add("topk", {b.Add1("add", {scores, b.Add1("unsqueeze", {bias}, {{"dim", Int(0)}})})},
            {{"k", Int(o.top_k)}, {"dim", Int(-1)}});
  if (top.size() != 2) return -1;
  FusedMoeWeights(b, c, flat, o);
  int out = b.Add1("fused_experts", {flat, top[0], top[1]}, {{"experts", Int(o.experts)}});
  out = b.Add1("mul_", {out}, {{"scalar", Float(o.routed_scaling)}});
  if (shared >= 0) out = b.Add1("add_", {out, shared});
  return b.Add1("view", {out}, {{"shape", Ints({in[0], in[1], d})}});
}

}  // namespace

int layers_internal::DeepseekMoe(GraphBuilder& b, const LayerContext& c, int x,
                                 const MoeOptions& o) {
  const Shape in = b.shape(x);
  const int64_t d = in[2], tokens = in[0] * in[1];
  if (o.groups <= 0 || o.experts % o.groups != 0 || o.experts / o.groups < 2 ||
      o.topk_groups <= 0 || o.topk_groups > o.groups) {
    b.Fail(
        Internal("DeepseekMoe: the experts must split into groups of at least two, and "
                 "topk_groups be from 1 to the groups"));
    return -1;
  }
  if (c.vllm && !c.training()) return VllmDeepseekMoe(b, c, x, o);
  const int flat = b.Add1("view", {x}, {{"shape", Ints({-1, d})}});
  int chosen = -1, weights = -1;
  if (!Route(b, c, flat, o, &chosen, &weights)) return -1;
  // moe(): the sum in the weights' dtype, the experts' masks [experts, tokens, top_k].
  const DType sum_dtype = b.tensor(weights).dtype;
  int out = b.Add1("full", {}, {{"shape", Ints({tokens, d})}, {"dtype", DTypeAttr(sum_dtype)}});
  int mask = b.Add1("one_hot", {chosen}, {{"num_classes", Int(o.experts)}});
  mask = b.Add1("permute", {mask}, {{"dims", Ints({2, 0, 1})}});
  // The loop's locals (the where's indices, expert_weights, expert_input, expert_output,
  // weighted_output) live until the next iteration assigns them, the last ones until moe()
  // returns. transformers skips an expert no token chose; memest runs it on no tokens, which
  // allocates nothing but gives its weights a gradient (every expert is chosen in a step of
  // many tokens).
  LoopLocals locals(b, 5);
  const std::vector<int64_t> counts = ExpertTokens(tokens, o.experts, o.top_k, o.load);
  for (int64_t e = 0; e < o.experts && b.ok(); ++e) {
    ModuleScope experts(b, "experts");
    // token_indices, weight_indices = torch.where(expert_mask[expert_idx])
    const ExpertWhere where = WhereExpert(b, mask, e, counts[e]);
    if (where.found < 0) return -1;
    const int token_indices = where.first;
    const int weight_indices = where.second;
    locals.Assign(0, where.found);
    const int expert_weights = b.Add1("index", {weights, token_indices, weight_indices});
    locals.Assign(1, expert_weights);
    const int expert_input = b.Add1("index", {flat, token_indices});
    locals.Assign(2, expert_input);
    const int y = ExpertMlp(b, c, std::to_string(e), expert_input, o.expert_ffn, o);
    locals.Assign(3, y);
    const int w = b.Add1("unsqueeze", {expert_weights}, {{"dim", Int(-1)}});
    const int weighted = b.Add1("mul", {y, w});
    locals.Assign(4, weighted);
    out = b.Add1("index_add_", {out, token_indices, weighted}, {{"dim", Int(0)}});
  }
  const int summed = out;
  out = b.Add1("to", {out}, {{"dtype", DTypeAttr(b.tensor(x).dtype)}});
  for (int local : {summed, mask}) b.HoldUntilLastOp(local);
  locals.HoldToLastOp();
  out = b.Add1("view", {out}, {{"shape", Ints({in[0], in[1], d})}});
  if (o.shared_expert_ffn > 0) {
    out = b.Add1("add", {out, ExpertMlp(b, c, "shared_experts", x, o.shared_expert_ffn, o)});
  }
  // forward's locals until it returns: the choices and their weights.
  for (int local : {chosen, weights}) b.HoldUntilLastOp(local);
  return out;
}

}  // namespace memest
