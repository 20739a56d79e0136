// Helpers shared by the op rule files (engine/rules/*.cc). Not part of the engine's public API.
#ifndef MEMEST_ENGINE_RULES_INTERNAL_H_
#define MEMEST_ENGINE_RULES_INTERNAL_H_

#include <string>
#include <vector>

#include "engine/rules/op_rules.h"

namespace memest {
namespace rules {

// Each rule family registers its rules here.
void RegisterMatmulRules(std::vector<OpRule>* rules);
void RegisterConvRules(std::vector<OpRule>* rules);
void RegisterNormRules(std::vector<OpRule>* rules);
void RegisterPointwiseRules(std::vector<OpRule>* rules);
void RegisterShapeRules(std::vector<OpRule>* rules);
void RegisterLossRules(std::vector<OpRule>* rules);
void RegisterIndexRules(std::vector<OpRule>* rules);
void RegisterRecurrentRules(std::vector<OpRule>* rules);
void RegisterCopyRules(std::vector<OpRule>* rules);
void RegisterAttentionRules(std::vector<OpRule>* rules);
void RegisterCompareRules(std::vector<OpRule>* rules);
void RegisterSelectRules(std::vector<OpRule>* rules);
void RegisterDetectionRules(std::vector<OpRule>* rules);
void RegisterParallelRules(std::vector<OpRule>* rules);
void RegisterDTensorRules(std::vector<OpRule>* rules);
void RegisterQuantizedRules(std::vector<OpRule>* rules);
void RegisterQuantizedInt8Rules(std::vector<OpRule>* rules);
void RegisterQuantizedTorchaoRules(std::vector<OpRule>* rules);
void RegisterFp8TeRules(std::vector<OpRule>* rules);
void RegisterServedQuantizedRules(std::vector<OpRule>* rules);
void RegisterServedLoraRules(std::vector<OpRule>* rules);
void RegisterServedMlaRules(std::vector<OpRule>* rules);
void RegisterFusedMoeRules(std::vector<OpRule>* rules);
void RegisterMoeDispatchRules(std::vector<OpRule>* rules);

// sum / mean(x; dim, keepdim)'s output: the reduced shape, floating or int64 (shape.cc).
StatusOr<std::vector<OutputSpec>> InferReduce(const OpCall& c);

// embedding(weight, indices)'s outputs, and its backward's scratch on CUDA (shape.cc).
StatusOr<std::vector<OutputSpec>> InferEmbedding(const OpCall& c);
// The tensor-parallel group size attribute `tp` (at least 1) of the parallel ops
// (engine/rules/parallel.cc, dtensor.cc).
StatusOr<int64_t> TensorGroupSize(const OpCall& c);
// An integer attribute read as a flag: set and not 0.
bool FlagAttr(const OpCall& c, const char* name);
void EmbeddingBackwardScratch(const OpCall& c, OpMemory* m);

inline std::string InputField(const OpCall& c, size_t i) {
  return c.field + ".inputs[" + std::to_string(i) + "]";
}
inline std::string AttrField(const OpCall& c, const char* name) {
  return c.field + ".attrs." + name;
}

// Dense strides that keep `t`'s memory order (what empty_like / TensorIterator give an
// output of a pointwise op on a permuted input).
Strides DenseStridesLike(const Tensor& t);
// Dense strides for `shape` (of t's rank) in t's memory order: an op that resizes some dims
// (upsample) and keeps the input's layout.
Strides DenseStridesLike(const Tensor& t, const Shape& shape);
// Whether a 4-D tensor's strides read as channels-last (Tensor::suggest_memory_format).
bool SuggestsChannelsLast(const Tensor& t);
// Dense channels-last strides of a 4-D [N, C, H, W] shape.
Strides ChannelsLastStrides(const Shape& shape);
// A new output like `t`: same shape and dtype, laid out in t's memory order.
inline OutputSpec Like(const Tensor& t) {
  return OutputSpec{t.shape, t.dtype, DenseStridesLike(t), -1, true};
}
// A view of input i with the given shape and strides.
inline OutputSpec ViewOf(int input, Shape shape, DType dtype, Strides strides) {
  return OutputSpec{std::move(shape), dtype, std::move(strides), input, true};
}

inline int64_t BytesOf(const Tensor& t) { return Bytes(t.shape, t.dtype); }
inline Alloc AllocOf(const Shape& s, DType d, const char* what) { return Alloc{Bytes(s, d), what}; }

// Requires input i to be floating point.
Status RequireFloating(const OpCall& c, size_t i);
// Requires input i to have rank in [lo, hi].
Status RequireRank(const OpCall& c, size_t i, int lo, int hi);
// Requires input i to be an integer index tensor (not floating, not bool).
Status RequireIntegerIndex(const OpCall& c, size_t i);

// The shape of bmm(input a, input b), both [n, i, k] x [n, k, j] (matmul.cc).
StatusOr<Shape> BmmProduct(const OpCall& c, size_t a, size_t b);

// A memory rule for ops nothing flows back through (indices, masks, views outside autograd):
// no input gets a gradient, nothing is kept, no scratch.
void NoGradient(const OpCall& c, OpMemory* m);

// On CUDA, the staging a sum of [rows, cols] over its rows allocates while it runs
// (engine/rules/reduce_scratch.h), as backward scratch: a bias's or a broadcast operand's
// gradient (sum_to_size). `dtype`: what is summed.
void RowSumScratchTemps(const OpCall& c, int64_t rows, int64_t cols, DType dtype, OpMemory* m);

// Saves input i if `cond`.
inline void SaveInputIf(OpMemory* m, bool cond, int i) {
  if (cond) m->saved_inputs.push_back(i);
}

// The dtype of floating statistics PyTorch keeps for a floating dtype (float for halves).
inline DType AccType(DType d) { return d == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32; }

}  // namespace rules
}  // namespace memest

#endif  // MEMEST_ENGINE_RULES_INTERNAL_H_
