// Megatron-LM's mixture-of-experts layer (layers.h, SparseMoe with c.megatron): MoELayer with
// the TopKRouter, the all-to-all token dispatcher and SequentialMLP experts, as
// megatron/core/transformer/moe/{moe_layer,router,token_dispatcher,moe_utils,experts,
// shared_experts}.py and transformer/mlp.py run them at d98e8a64 with Megatron's defaults for
// the rest: no fused permutation (moe_permute_fusion off), no capacity factor, the router in the
// model's dtype, the SwiGLU fused with the routing weights (bias_activation_fusion). Built for
// one expert-parallel rank holding every expert, the all-to-alls a view each (Megatron returns
// the input when the group has one rank); the expert-parallel pass keeps a rank's experts and
// sizes what it receives (engine/passes/expert_parallel.h). docs/moe.md says what each op holds.
#include <string>
#include <vector>

#include "engine/models/layers.h"
#include "engine/models/layers_internal.h"

namespace memest {
namespace {

using namespace layers_internal;  // NOLINT

// MLP.forward with per_token_scale: linear_fc1 to both gated halves, the fused weighted SwiGLU
// (weighted_bias_swiglu_impl; SwiGLUFunction without weights), linear_fc2.
int MegatronMlp(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
                int64_t ffn, int weights) {
  const int64_t d = LastDim(b, x);
  ModuleScope scope(b, name);
  const int fc1 = Linear(b, c, "linear_fc1", x, 2 * ffn, /*bias=*/false);
  std::vector<int> inputs = {fc1};
  if (weights >= 0) inputs.push_back(b.Add1("unsqueeze", {weights}, {{"dim", Int(-1)}}));
  const int act = b.Add1("megatron_swiglu", inputs);
  return Linear(b, c, "linear_fc2", act, d, /*bias=*/false);
}

// sort_chunks_by_idxs: torch.split into chunks, torch.cat in the new order (a copy).
int SortChunks(GraphBuilder& b, int x, const std::vector<int64_t>& sizes) {
  std::vector<int> chunks =
      b.Add("split", {x},
            {{"dim", Int(0)}, {"sizes", Ints(sizes)}, {"moe", std::string("chunks")}});
  if (!b.ok()) return -1;
  return b.Add1("cat", chunks, {{"dim", Int(0)}, {"moe", std::string("chunks")}});
}

// topk_routing_with_score_function(score_function="softmax"): the top-k weights in the logits'
// dtype and the choices. Qwen2-MoE's un-normalised weights are Megatron's pre-softmax routing
// (softmax over every expert, then top-k); the normalised ones (Mixtral, Qwen3) its default
// (top-k of the logits, softmax over them).
std::vector<int> Route(GraphBuilder& b, int logits, const MoeOptions& o, DType dtype) {
  std::vector<int> top;
  if (o.norm_topk_prob) {
    top = b.Add("topk", {logits}, {{"k", Int(o.top_k)}, {"dim", Int(-1)}});
    if (top.size() != 2) return {};
    top[0] = SoftmaxFloat32(b, top[0], -1);
  } else {
    top = b.Add("topk", {SoftmaxFloat32(b, logits, -1)}, {{"k", Int(o.top_k)}, {"dim", Int(-1)}});
    if (top.size() != 2) return {};
  }
  top[0] = b.Add1("to", {top[0]}, {{"dtype", DTypeAttr(dtype)}});  // probs.type_as(logits)
  return top;
}

// zeros_like(logits).int().scatter(1, top_indices, 1).bool()
int RoutingMap(GraphBuilder& b, int top, const Shape& shape, DType dtype) {
  int map = b.Add1("full", {}, {{"shape", Ints(shape)}, {"dtype", DTypeAttr(dtype)}});
  map = b.Add1("to", {map}, {{"dtype", std::string("int32")}});
  map = b.Add1("scatter", {map, top}, {{"dim", Int(1)}, {"value", Float(1)}});
  return b.Add1("to", {map}, {{"dtype", std::string("bool")}});
}

// With the load-balancing loss (moe_aux_loss_coeff > 0): compute_routing_scores_for_aux_loss
// (softmax over every expert in float32, kept for its backward; top-k; the routing map) and
// switch_load_balancing_loss_func, attached to the weights by MoEAuxLossAutoScaler, whose
// backward starts the loss's when it reaches them. Counted as an add of the 0-dim loss: one
// more [tokens, top_k] tensor than Megatron's identity.
int AttachAuxLoss(GraphBuilder& b, int logits, int probs, const MoeOptions& o, DType dtype) {
  const int scores = SoftmaxFloat32(b, logits, -1);
  std::vector<int> top = b.Add("topk", {scores}, {{"k", Int(o.top_k)}, {"dim", Int(-1)}});
  if (top.size() != 2) return -1;
  const int map = RoutingMap(b, top[1], b.shape(logits), dtype);
  const int tokens = b.Add1("sum", {map}, {{"dim", Ints({0})}});
  const int per_expert = b.Add1("sum", {scores}, {{"dim", Ints({0})}});
  const int counts = b.Add1("to", {tokens}, {{"dtype", std::string("float32")}});
  int aux = b.Add1("sum", {b.Add1("mul", {per_expert, counts})});
  aux = b.Add1("to", {aux}, {{"dtype", DTypeAttr(dtype)}});
  // Marked: the token counts are all-reduced over the tensor x context group (NCCL's groups).
  return b.Add1("add", {probs, aux}, {{"moe", std::string("aux_loss")}});
}

}  // namespace

int MegatronMoe(GraphBuilder& b, const LayerContext& c, int x, const MoeOptions& o) {
  if (!ExpectRank(b, x, 3, "megatron_moe")) return -1;
  if (o.activation != Activation::kSilu) {
    b.Fail(InvalidArgument("model: Megatron-LM's experts fuse the routing weights into SwiGLU "
                           "only (mlp.py: \"Only support fusion of swiglu and quick_gelu with "
                           "per_token_scale\"); this model's experts use another activation"));
    return -1;
  }
  const Shape in = b.shape(x);
  const int64_t d = in[2];
  const int64_t tokens = in[0] * in[1];
  StatusOr<int64_t> choices = CheckedMul(tokens, o.top_k);
  if (!choices.ok()) {
    b.Fail(InvalidArgument("model: " + std::to_string(tokens) + " tokens x top_k " +
                           std::to_string(o.top_k) + " choices overflow 64 bits"));
    return -1;
  }
  const int64_t routed = *choices;
  const DType dtype = b.tensor(x).dtype;

  // shared_experts_compute runs first, on the layer's input.
  int shared = -1;
  if (o.shared_expert_ffn > 0) {
    shared = MegatronMlp(b, c, "shared_experts", x, o.shared_expert_ffn, -1);
    ModuleScope scope(b, "shared_experts");
    const int gate = b.Add1("sigmoid", {Linear(b, c, "gate", x, 1, /*bias=*/false)});
    shared = b.Add1("mul", {shared, gate});
  }

  // TopKRouter: RouterGatingLinearFunction keeps (input, weight) as a linear does.
  const int flat = b.Add1("view", {x}, {{"shape", Ints({-1, d})}});
  const int logits = Linear(b, c, "router", flat, o.experts, /*bias=*/false);
  std::vector<int> top = Route(b, logits, o, dtype);
  if (top.size() != 2) return -1;
  int probs = top[0];
  if (o.router_aux_loss) probs = AttachAuxLoss(b, logits, probs, o, dtype);
  int routing_probs = b.Add1("full", {}, {{"shape", Ints({tokens, o.experts})},
                                           {"dtype", DTypeAttr(dtype)}});
  routing_probs = b.Add1("scatter", {routing_probs, top[1], probs}, {{"dim", Int(1)}});
  const int routing_map = RoutingMap(b, top[1], {tokens, o.experts}, dtype);

  // permute (the argsort path): the routing map's nonzeros in expert-major order.
  int by_expert = b.Add1("transpose", {routing_map}, {{"dim0", Int(0)}, {"dim1", Int(1)}});
  by_expert = b.Add1("view", {b.Add1("contiguous", {by_expert})}, {{"shape", Ints({-1})}});
  std::vector<int> sorted = b.Add("sort", {by_expert}, {{"dim", Int(0)}, {"descending", Int(1)}});
  if (sorted.size() != 2) return -1;
  const int flat_sorted =
      b.Add1("slice", {sorted[1]}, {{"dim", Int(0)}, {"start", Int(0)}, {"end", Int(routed)}});
  const int sorted_indices = b.Add1("remainder", {flat_sorted}, {{"other", Float(tokens)}});
  int probs_t = b.Add1("transpose", {routing_probs}, {{"dim0", Int(0)}, {"dim1", Int(1)}});
  probs_t = b.Add1("view", {b.Add1("contiguous", {probs_t})}, {{"shape", Ints({-1})}});
  const int permuted_probs = b.Add1("index", {probs_t, flat_sorted});
  const int permuted = b.Add1("index_select", {flat, sorted_indices}, {{"dim", Int(0)}});

  // token_dispatch: the tokens and their weights to the ranks of their experts.
  const std::vector<int64_t> counts = ExpertTokens(tokens, o.experts, o.top_k, o.load);
  const Attrs dispatch = {{"ep", Int(1)},         {"rows", Int(routed)},
                          {"experts", Int(o.experts)}, {"top_k", Int(o.top_k)},
                          {"role", std::string("dispatch")}};
  int received = b.Add1("ep_all_to_all", {permuted}, dispatch);
  int received_probs = b.Add1("ep_all_to_all", {permuted_probs}, dispatch);
  const int dispatched = received, dispatched_probs = received_probs;  // custom_forward's
  // dispatch_postprocess: sorted by local expert (a copy, with more than one local expert).
  if (o.experts > 1) {
    received = SortChunks(b, received, counts);
    received_probs = SortChunks(b, received_probs, counts);
  }

  // SequentialMLP: each local expert on its tokens, the outputs concatenated.
  int out = -1;
  {
    ModuleScope experts(b, "experts");
    if (o.experts == 1) {
      ModuleScope local(b, "local_experts");
      out = MegatronMlp(b, c, "0", received, o.expert_ffn, received_probs);
    } else {
      const Attrs split = {
          {"dim", Int(0)}, {"sizes", Ints(counts)}, {"moe", std::string("experts")}};
      std::vector<int> pieces = b.Add("split", {received}, split);
      std::vector<int> weights = b.Add("split", {received_probs}, split);
      if (!b.ok()) return -1;
      std::vector<int> outs;
      ModuleScope local(b, "local_experts");
      for (int64_t e = 0; e < o.experts && b.ok(); ++e) {
        outs.push_back(MegatronMlp(b, c, std::to_string(e), pieces[e], o.expert_ffn, weights[e]));
      }
      if (!b.ok()) return -1;
      out = b.Add1("cat", outs, {{"dim", Int(0)}, {"moe", std::string("experts")}});
    }
  }

  // combine: back in the order the rank sent (combine_preprocess, before routed_experts_compute
  // returns: its dispatched_input, permuted_probs and expert_output held until then), back to
  // the senders, unpermuted into place.
  const int experts_out = out;
  if (o.experts > 1) out = SortChunks(b, out, counts);
  for (int local : {received, received_probs, experts_out}) b.HoldUntilLastOp(local);
  Attrs combine = dispatch;
  combine["role"] = std::string("combine");
  out = b.Add1("ep_all_to_all", {out}, combine);
  int restored = b.Add1("full", {}, {{"shape", Ints({tokens, d})}, {"dtype", DTypeAttr(dtype)}});
  int where = b.Add1("unsqueeze", {sorted_indices}, {{"dim", Int(1)}});
  where = b.Add1("expand", {where}, {{"shape", Ints({routed, d})}});
  restored = b.Add1("scatter_add_", {restored, where, out}, {{"dim", Int(0)}});
  out = b.Add1("view", {restored}, {{"shape", Ints(in)}});
  if (shared >= 0) out = b.Add1("add", {out, shared});
  // The dispatcher keeps its last routing (self.probs, self.routing_map) as attributes until the
  // layer's next forward; held here to the forward's end (docs/moe.md: not counted in backward).
  // MoELayer's custom_forward holds the permuted tokens (hidden_states) and what the all-to-all
  // returned (dispatched_input, probs) until it returns.
  for (int local : {routing_probs, routing_map, permuted, dispatched, dispatched_probs}) {
    b.HoldUntilLastOp(local);
  }
  return out;
}

}  // namespace memest
