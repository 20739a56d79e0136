// Helpers the layer files share (layers.cc, attention_layers.cc): attribute values by type,
// the last dim of a tensor, and a rank check that fails the builder.
#ifndef MEMEST_ENGINE_MODELS_LAYERS_INTERNAL_H_
#define MEMEST_ENGINE_MODELS_LAYERS_INTERNAL_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/models/layers.h"

namespace memest {
namespace layers_internal {


inline constexpr double kPi = 3.14159265358979323846;

using ModuleScope = ScopeGuard;  // an empty name adds nothing to the scope
inline AttrValue Int(int64_t v) { return AttrInt(v); }
inline AttrValue Float(double v) { return AttrFloat(v); }
inline AttrValue Ints(std::vector<int64_t> v) { return AttrInts(std::move(v)); }
inline AttrValue DTypeAttr(DType d) { return AttrValue(std::string(DTypeName(d))); }

inline int64_t LastDim(const GraphBuilder& b, int x) {
  if (x < 0 || b.shape(x).empty()) return 0;
  return b.shape(x).back();
}

// Fails the builder (and returns false) unless x has rank `rank`.
inline bool ExpectRank(GraphBuilder& b, int x, size_t rank, std::string_view what) {
  if (!b.ok() || x < 0) return false;
  if (b.shape(x).size() != rank) {
    b.Fail(InvalidArgument(std::string(what) + ": expects an input of rank " +
                           std::to_string(rank) + ", got shape " + ShapeToString(b.shape(x))));
    return false;
  }
  return true;
}


// An attention's sizes: batch, tokens, model width, query and key-value heads, the query's
// head dim; keep_dim > 0: the core's output sliced to its first keep_dim dims (values padded
// to the query's width, as Hugging Face pads MLA's for flash-attn).
struct AttentionDims {
  int64_t n, t, d, heads, kv_heads, head_dim;
  int64_t keep_dim = 0;
};

// Attention's tail (and MlaAttention's): the core on q, k, v [N, H, T, hd] (v's hd its own)
// as c.attention runs it, the heads merged and the output projection, the locals held with
// o.hold_locals; `weights_out` (optional) receives eager's probabilities.
int AttendAndProject(GraphBuilder& b, const LayerContext& c, int x, int q, int k, int v,
                     const AttentionDims& dims, const AttentionOptions& o, int* weights_out);

// DeepSeek's latent attention (AttentionOptions::mla; engine/models/mla_attention.cc).
int MlaAttention(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
                 const AttentionOptions& o, int* weights_out);

// An expert's MLP (MixtralBlockSparseTop2MLP, Qwen2MoeMLP, DeepseekV3MLP): out(act(first(x)) *
// second(x)), the Linear modules MoeOptions::names, without bias.
int ExpertMlp(GraphBuilder& b, const LayerContext& c, std::string_view name, int x, int64_t ffn,
              const MoeOptions& o);

// vLLM's FusedMoE weights, stacked as its w13_weight [experts, 2 * ffn, d] (each expert's first
// and second projections) and w2_weight [experts, d, ffn] are, one allocation each: the modules
// "experts.w13" (out experts * 2 * ffn) and "experts.w2" (in experts * ffn) over no token, for
// the passes that split (by rows and by columns, each expert's ffn by t) and quantize them.
void FusedMoeWeights(GraphBuilder& b, const LayerContext& c, int flat, const MoeOptions& o);

// A Python loop's locals: each slot keeps its tensor until the next iteration assigns the slot
// again, the last ones until HoldToLastOp (the function's return).
class LoopLocals {
 public:
  LoopLocals(GraphBuilder& b, size_t slots) : b_(b), held_(slots, -1) {}
  void Assign(size_t slot, int now) {
    b_.HoldUntilLastOp(held_[slot]);  // nothing for the first iteration's -1
    held_[slot] = now;
  }
  void HoldToLastOp() {
    for (int t : held_) b_.HoldUntilLastOp(t);
  }

 private:
  GraphBuilder& b_;
  std::vector<int> held_;
};

// torch.where(expert_mask[e]) in an expert loop: the mask's row e (slice, squeeze), nonzero of
// it (`count` rows: the tokens the data gives the expert) and its two columns, squeezed views
// that keep it.
struct ExpertWhere {
  int found = -1, first = -1, second = -1;
};
ExpertWhere WhereExpert(GraphBuilder& b, int mask, int64_t e, int64_t count);

// DeepSeek-V3's MoE block (MoeOptions::deepseek; engine/models/deepseek_moe.cc) on x
// [N, T, d], under the block's scope.
int DeepseekMoe(GraphBuilder& b, const LayerContext& c, int x, const MoeOptions& o);

// F.softmax(x, dim, dtype=torch.float32) as ATen runs it: _softmax(half_to_float=true) for
// float16, otherwise a cast first (a float32 copy of bfloat16, a no-op view of float32).
inline int SoftmaxFloat32(GraphBuilder& b, int x, int64_t dim) {
  if (!b.ok() || x < 0) return -1;
  if (b.tensor(x).dtype == DType::kFloat16) {
    return b.Add1("softmax", {x}, {{"dim", Int(dim)}, {"half_to_float", Int(1)}});
  }
  const int up = b.Add1("to", {x}, {{"dtype", std::string("float32")}});
  return b.Add1("softmax", {up}, {{"dim", Int(dim)}});
}

}  // namespace layers_internal
}  // namespace memest

#endif  // MEMEST_ENGINE_MODELS_LAYERS_INTERNAL_H_
