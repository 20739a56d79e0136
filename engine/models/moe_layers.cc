// Sparse mixture-of-experts MLPs as Hugging Face runs them (engine/models/layers.h, SparseMoe):
// MixtralSparseMoeBlock and Qwen2MoeSparseMoeBlock of transformers 4.47 (Qwen3MoeSparseMoeBlock
// is Qwen2's without the shared expert). docs/moe.md says what each op holds.
#include <string>
#include <utility>
#include <vector>

#include "engine/models/layers.h"
#include "engine/models/layers_internal.h"

namespace memest {

using namespace layers_internal;  // NOLINT

int layers_internal::ExpertMlp(GraphBuilder& b, const LayerContext& c, std::string_view name, int x, int64_t ffn,
              const MoeOptions& o) {
  if (o.names.size() != 3) {
    b.Fail(Internal("SparseMoe: an expert MLP names three Linear modules"));
    return -1;
  }
  const int64_t d = LastDim(b, x);
  ModuleScope scope(b, name);
  int gate = Linear(b, c, o.names[0], x, ffn, /*bias=*/false);
  {
    ModuleScope act(b, "act_fn");
    gate = Activate(b, gate, o.activation);
  }
  const int up = Linear(b, c, o.names[1], x, ffn, /*bias=*/false);
  return Linear(b, c, o.names[2], b.Add1("mul", {gate, up}), d, /*bias=*/false);
}

namespace {

}  // namespace

void layers_internal::FusedMoeWeights(GraphBuilder& b, const LayerContext& c, int flat,
                                      const MoeOptions& o) {
  ModuleScope experts(b, "experts");
  const int64_t d = LastDim(b, flat);
  const int none = b.Add1("slice", {flat}, {{"dim", Int(0)}, {"start", Int(0)}, {"end", Int(0)}});
  const int w13 = Linear(b, c, "w13", none, o.experts * 2 * o.expert_ffn, /*bias=*/false);
  // w2 reads what would be the activation's product: half w13's width (split as w13 is).
  const int half = b.Add1("slice", {w13}, {{"dim", Int(1)}, {"start", Int(0)},
                                          {"end", Int(o.experts * o.expert_ffn)}});
  Linear(b, c, "w2", half, d, /*bias=*/false);
}

namespace {

// vLLM's FusedMoE (model_executor/layers/fused_moe/layer.py, 0.17-0.19): the router's logits,
// fused_topk's weights and choices (here a float32 softmax and topk, a little more than its
// kernel keeps), one fused_experts over every token; the shared expert as a plain MLP.
int VllmFusedMoe(GraphBuilder& b, const LayerContext& c, int x, const Shape& in,
                 const MoeOptions& o) {
  const int64_t d = in[2];
  const int flat = b.Add1("view", {x}, {{"shape", Ints({-1, d})}});
  const int logits = Linear(b, c, "gate", flat, o.experts, /*bias=*/false);
  std::vector<int> top =
      b.Add("topk", {SoftmaxFloat32(b, logits, 1)}, {{"k", Int(o.top_k)}, {"dim", Int(-1)}});
  if (top.size() != 2) return -1;
  FusedMoeWeights(b, c, flat, o);
  int out = b.Add1("fused_experts", {flat, top[0], top[1]}, {{"experts", Int(o.experts)}});
  if (o.shared_expert_ffn > 0) {
    int y = ExpertMlp(b, c, "shared_expert", flat, o.shared_expert_ffn, o);
    const int g = b.Add1("sigmoid", {Linear(b, c, "shared_expert_gate", flat, 1, false)});
    out = b.Add1("add", {out, b.Add1("mul", {g, y})});
  }
  return b.Add1("reshape", {out}, {{"shape", Ints({in[0], in[1], d})}});
}

}  // namespace

ExpertWhere layers_internal::WhereExpert(GraphBuilder& b, int mask, int64_t e, int64_t count) {
  int row = b.Add1("slice", {mask}, {{"dim", Int(0)}, {"start", Int(e)}, {"end", Int(e + 1)}});
  row = b.Add1("squeeze", {row}, {{"dim", Int(0)}});
  ExpertWhere w;
  const int found = b.Add1("nonzero", {row}, {{"count", Int(count)}});
  std::vector<int> columns = b.Add("split", {found}, {{"dim", Int(1)}, {"sizes", Ints({1, 1})}});
  if (columns.size() != 2) return w;
  w.found = found;
  w.first = b.Add1("squeeze", {columns[0]}, {{"dim", Int(1)}});
  w.second = b.Add1("squeeze", {columns[1]}, {{"dim", Int(1)}});
  return w;
}

int SparseMoe(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
              const MoeOptions& o, int* router_logits) {
  if (!ExpectRank(b, x, 3, "sparse_moe")) return -1;
  const Shape in = b.shape(x);
  const int64_t d = in[2];
  const int64_t tokens = in[0] * in[1];
  if (o.experts <= 0 || o.top_k <= 0 || o.top_k > o.experts || o.expert_ffn <= 0) {
    b.Fail(Internal("SparseMoe: experts, top_k and expert_ffn must be positive, top_k at most "
                    "experts"));
    return -1;
  }
  ModuleScope scope(b, name);
  if (o.deepseek) return DeepseekMoe(b, c, x, o);
  if (c.megatron) return MegatronMoe(b, c, x, o);
  if (c.vllm && !c.training()) return VllmFusedMoe(b, c, x, in, o);
  const DType dtype = b.tensor(x).dtype;
  const int flat = b.Add1("view", {x}, {{"shape", Ints({-1, d})}});
  const int logits = Linear(b, c, "gate", flat, o.experts, /*bias=*/false);
  int weights = SoftmaxFloat32(b, logits, 1);
  std::vector<int> top = b.Add("topk", {weights}, {{"k", Int(o.top_k)}, {"dim", Int(-1)}});
  if (top.size() != 2) return -1;
  weights = top[0];
  const int selected = top[1];
  if (o.norm_topk_prob) {  // routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
    const int sum = b.Add1("sum", {weights}, {{"dim", Ints({-1})}, {"keepdim", Int(1)}});
    weights = b.Add1("div_", {weights, sum});
  }
  weights = b.Add1("to", {weights}, {{"dtype", DTypeAttr(dtype)}});
  int out = b.Add1("full", {}, {{"shape", Ints({tokens, d})}, {"dtype", DTypeAttr(dtype)}});
  int mask = b.Add1("one_hot", {selected}, {{"num_classes", Int(o.experts)}});
  mask = b.Add1("permute", {mask}, {{"dims", Ints({2, 1, 0})}});

  // The loop's locals (idx, top_x, current_state, current_hidden_states) live until the next
  // iteration assigns them again, the last ones until the block returns.
  LoopLocals locals(b, 3);
  if (!b.ok()) return -1;
  const std::vector<int64_t> counts = ExpertTokens(tokens, o.experts, o.top_k, o.load);
  for (int64_t e = 0; e < o.experts && b.ok(); ++e) {
    // An expert no token chose still runs, on empty tensors: they allocate nothing, but its
    // weights get gradients (full-size zeros) all the same.
    ModuleScope experts(b, "experts");
    // idx, top_x = torch.where(expert_mask[expert_idx]): nonzero, then its two columns.
    const ExpertWhere where = WhereExpert(b, mask, e, counts[e]);
    if (where.found < 0) return -1;
    const int idx = where.first;
    const int top_x = where.second;
    locals.Assign(0, where.found);
    // current_state = hidden_states[None, top_x].reshape(-1, hidden_dim): aten indexes the
    // [1, N*T, d] view along dim 1; its rows are hidden_states[top_x]'s, the same bytes, saved
    // and gradient alike.
    const int state = b.Add1("index", {flat, top_x});
    locals.Assign(1, state);
    int y = ExpertMlp(b, c, std::to_string(e), state, o.expert_ffn, o);
    // * routing_weights[top_x, idx, None]: the None first, then the two index tensors
    int w = b.Add1("unsqueeze", {weights}, {{"dim", Int(2)}});
    w = b.Add1("index", {w, top_x, idx});
    y = b.Add1("mul", {y, w});
    locals.Assign(2, y);
    if (b.ok() && b.tensor(y).dtype != dtype) y = b.Add1("to", {y}, {{"dtype", DTypeAttr(dtype)}});
    out = b.Add1("index_add_", {out, top_x, y}, {{"dim", Int(0)}});
  }
  if (o.shared_expert_ffn > 0) {
    // shared_expert(x) * sigmoid(shared_expert_gate(x))
    int y = ExpertMlp(b, c, "shared_expert", flat, o.shared_expert_ffn, o);
    const int g = b.Add1("sigmoid", {Linear(b, c, "shared_expert_gate", flat, 1, false)});
    y = b.Add1("mul", {g, y});
    out = b.Add1("add", {out, y});
  }
  out = b.Add1("reshape", {out}, {{"shape", Ints({in[0], in[1], d})}});
  // The block's locals until it returns: the routing weights, the choices, the expert mask and
  // the last iteration's.
  for (int local : {weights, selected, mask}) b.HoldUntilLastOp(local);
  locals.HoldToLastOp();
  if (router_logits != nullptr) *router_logits = logits;
  return out;
}

int RouterAuxLoss(GraphBuilder& b, const std::vector<int>& router_logits, const MoeOptions& o,
                  double coef, int loss) {
  if (!b.ok() || loss < 0 || router_logits.empty()) return loss;
  // load_balancing_loss_func(outputs.router_logits, num_experts, top_k), no attention mask.
  const int all = b.Add1("cat", router_logits, {{"dim", Int(0)}});
  const int weights = b.Add1("softmax", {all}, {{"dim", Int(-1)}});
  std::vector<int> top = b.Add("topk", {weights}, {{"k", Int(o.top_k)}, {"dim", Int(-1)}});
  if (top.size() != 2) return -1;
  const int mask = b.Add1("one_hot", {top[1]}, {{"num_classes", Int(o.experts)}});
  // tokens_per_expert = mean(expert_mask.float(), dim=0); router_prob_per_expert likewise
  const int tokens = b.Add1("mean", {b.Add1("to", {mask}, {{"dtype", DTypeAttr(DType::kFloat32)}})},
                            {{"dim", Ints({0})}});
  int probs = b.Add1("mean", {weights}, {{"dim", Ints({0})}});
  probs = b.Add1("unsqueeze", {probs}, {{"dim", Int(0)}});
  int aux = b.Add1("sum", {b.Add1("mul", {tokens, probs})});
  aux = b.Add1("mul", {aux}, {{"scalar", Float(static_cast<double>(o.experts))}});
  // The function's locals until it returns (`_` is topk's values).
  for (int local : {all, weights, top[0], top[1], mask, tokens}) b.HoldUntilLastOp(local);
  // loss += router_aux_loss_coef * aux_loss
  return b.Add1("add_", {loss, b.Add1("mul", {aux}, {{"scalar", Float(coef)}})});
}

}  // namespace memest
