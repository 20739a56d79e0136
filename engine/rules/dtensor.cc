// Rules for the ops tensor parallelism adds to one rank's graph under DTensor's layers
// (config.parallelism.tensor_layers = dtensor; engine/passes/tensor_parallel.h): what
// torch.distributed.tensor.parallel's styles do beside the functional collectives, which are
// tp_all_reduce / tp_reduce_scatter / tp_all_gather with their funcol attributes
// (engine/rules/parallel.cc). As PyTorch 2.15 runs them, measured on the CPU with gloo
// (docs/parallelism-truth.md section 10, which cites each source line):
//
//   tp_from_local(x; tp)        ColwiseParallel's input hook on a Replicate input:
//                               DTensor.from_local, a view; its backward redistributes the
//                               Partial input gradient to Replicate, an all-reduce into a new
//                               tensor beside the incoming one (_FromTorchTensor.backward)
//   dtensor_embedding(weight[V/tp, d], ids; tp, scatter_dim=-1, scatter_copy=0, gather_copy=0)
//                               RowwiseParallel on an nn.Embedding (_MaskPartial): the rank's
//                               rows looked up, then the Partial lookup reduced: reduce-scattered
//                               along scatter_dim (SequenceParallel's Shard) or all-reduced into a
//                               new tensor (-1). Its weight's gradient is the whole [V, d] table
//                               on every rank (embedding_dense_backward has no row-sharded
//                               strategy), kept as the parameter's .grad
//   loss_parallel_cross_entropy(logits[N, V/tp], target[N]; tp, nll_float32=0)
//                               F.cross_entropy under loss_parallel(): the per-token loss,
//                               float32, of target's shape
#include "engine/rules/internal.h"

namespace memest {
namespace rules {
namespace {

StatusOr<std::vector<OutputSpec>> InferFromLocal(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(TensorGroupSize(c).status());
  return std::vector<OutputSpec>{ViewOf(0, c.in(0).shape, c.in(0).dtype, c.in(0).strides)};
}

void FromLocalMemory(const OpCall& c, OpMemory* m) { m->grad_flow = {GradFlow::kFresh}; }

StatusOr<std::vector<OutputSpec>> InferDTensorEmbedding(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(int64_t tp, TensorGroupSize(c));
  MEMEST_ASSIGN_OR_RETURN(std::vector<OutputSpec> out, InferEmbedding(c));
  // The weight's gradient is the whole table, tp times the rank's rows: a tensor it must be.
  StatusOr<int64_t> whole = CheckedMul(BytesOf(c.in(0)), tp);
  if (!whole.ok() || *whole > kMaxTensorBytes) {
    return InvalidArgument(AttrField(c, "tp") + ": " + std::to_string(tp) + " ranks' tables of " +
                           ShapeToString(c.in(0).shape) + " are more than " +
                           std::to_string(kMaxTensorBytes) + " bytes");
  }
  MEMEST_ASSIGN_OR_RETURN(int64_t dim, IntAttr(c.op.attrs, "scatter_dim", -1, c.field));
  if (dim < 0) return out;
  Shape& y = out[0].shape;
  MEMEST_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, static_cast<int>(y.size()), AttrField(c, "scatter_dim")));
  if (y[d] % tp != 0) {
    return InvalidArgument(AttrField(c, "scatter_dim") + ": dim " + std::to_string(d) + " of " +
                           ShapeToString(y) + " does not split evenly over " + std::to_string(tp) +
                           " ranks");
  }
  y[d] /= tp;
  return out;
}

// Forward (_MaskPartial._partition_value, then the reduction): the out-of-range mask (bool,
// kept by the placement until the reduction), ids.clone() - offset (the masked ids),
// masked[mask] = 0, the lookup [.., d] (Partial), then at the reduction lookup[mask, :] = 0 in
// place and the reduce-scatter (a chunk-order copy first when the sequence is not dim 0) or the
// functional all-reduce's clone. The temporaries below beside the output cover both moments (the
// lookup's with the mask and masked ids, the reduction's with the copy and the output); saved:
// the ids themselves (measured: the input's storage).
// Backward: the incoming gradient all-gathered whole (for a scattered output; into a dim-0
// result first, then cat, when a dim before the sequence holds more than one), then
// embedding_dense_backward of the whole [V, d] table: the weight's gradient.
void DTensorEmbeddingMemory(const OpCall& c, OpMemory* m) {
  StatusOr<int64_t> tp = TensorGroupSize(c);
  const int64_t n = Numel(c.in(1).shape);
  Shape whole = c.in(1).shape;
  whole.push_back(c.in(0).shape[1]);
  const int64_t lookup = Bytes(whole, c.in(0).dtype);
  const bool scattered = Numel(c.out(0).shape) != Numel(whole);
  m->forward_temps = {{n, "out-of-range mask"}, {8 * n, "masked ids"}, {lookup, "Partial lookup"}};
  if (scattered && FlagAttr(c, "scatter_copy")) m->forward_temps.push_back({lookup, "reduce-scatter chunk copy"});
  m->grad_flow = {GradFlow::kFresh, GradFlow::kNone};
  if (!c.needs_grad(0)) return;
  m->saved_inputs = {1};  // the ids (the local embedding op on the masked ids keeps the input's)
  // The whole table (at most kMaxTensorBytes: checked when the op was inferred).
  m->fresh_grad_bytes = {BytesOf(c.in(0)) * (tp.ok() ? *tp : 1), 0};
  if (scattered) {
    // The all-gather is a node of its own: its dim-0 result is gone before the table's
    // gradient is made, and the incoming shard with it.
    m->backward_scratch_consumes_grad = true;
    if (FlagAttr(c, "gather_copy")) m->backward_first_temps.push_back({lookup, "all-gather before its cat"});
    m->backward_temps.push_back({lookup, "the gradient all-gathered"});
  }
  EmbeddingBackwardScratch(c, m);
}

StatusOr<std::vector<OutputSpec>> InferLossParallel(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(TensorGroupSize(c).status());
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 2, 2));
  const Shape& logits = c.in(0).shape;
  if (c.in(1).shape != Shape{logits[0]} || IsFloating(c.in(1).dtype)) {
    return InvalidArgument(InputField(c, 1) + ": integer targets [" + std::to_string(logits[0]) +
                           "], got " + ShapeToString(c.in(1).shape));
  }
  return std::vector<OutputSpec>{{Shape{logits[0]}, DType::kFloat32}};
}

// torch/distributed/tensor/parallel/loss.py (L = N x V/tp elements). Forward, _log_softmax:
// x.to(float32) (a copy of 16-bit logits, kept by the local until it returns), amax [N, 1] and
// its all-reduce clone, shifted = x - max, exp(shifted) (freed after its sum), the sum [N, 1] and
// its all-reduce clone, log, result = shifted - logsumexp, cast back to the logits' dtype: the
// log-probabilities, saved. The last moment is the largest: the float32 copy, shifted, the
// float32 result and the cast one. Under autocast (nll_float32) nll_loss then runs on a float32
// copy of the log-probabilities, which it saves (made after the float32 temporaries are gone:
// counted in their place). _nll_loss_forward's [N] tensors (the masked targets, the gather and
// its all-reduce) are fewer bytes and come later. Saved: the log-probabilities, the targets, the
// total weight. Backward, _nll_loss_and_log_softmax_backward, in the dtype nll_loss saw:
// zeros_like(x), the masked targets, then (grad_input + exp(x)) * grad_output, with the saved
// log-probabilities at most four L-tensors at once; under autocast the float32 result is cast
// to the logits' dtype (their gradient).
void LossParallelMemory(const OpCall& c, OpMemory* m) {
  const Tensor& x = c.in(0);
  const int64_t n = x.shape[0];
  const int64_t elements = Numel(x.shape);
  const int64_t logp = BytesOf(x);          // the log-probabilities, the logits' dtype
  const int64_t f32 = elements * 4;         // _log_softmax's computation dtype
  const bool half = x.dtype != DType::kFloat32;
  StatusOr<int64_t> nll_float32 = IntAttr(c.op.attrs, "nll_float32", 0, c.field);
  const bool nll32 = half && nll_float32.ok() && *nll_float32 != 0;
  m->forward_temps = {{f32, "shifted logits"}, {n * 4, "amax"}, {n * 4, "amax all-reduced"},
                      {n * 4, "sum of exponentials all-reduced"}};
  if (half) m->forward_temps.push_back({f32, "float32 logits"});
  if (half && !nll32) m->forward_temps.push_back({f32, "float32 log-probabilities"});
  m->grad_flow = {GradFlow::kFresh, GradFlow::kNone};
  if (!c.needs_grad(0)) {
    m->forward_temps.push_back({logp, "log-probabilities"});
    return;
  }
  m->saved_inputs = {1};  // the targets
  m->saved_extras = {{logp, "log-probabilities"}, {4, "total weight"}};
  if (nll32) m->saved_extras.push_back({f32, "float32 copy of the log-probabilities (nll_loss)"});
  const int64_t grad = nll32 ? f32 : logp;
  m->backward_temps = {{grad, "zeros_like(x)"}, {grad, "exp(x), then the sum"},
                       {8 * n, "masked targets"}};
  if (nll32) m->backward_temps.push_back({f32, "the float32 gradient before its cast"});
}

}  // namespace

void RegisterDTensorRules(std::vector<OpRule>* rules) {
  rules->push_back({"tp_from_local", 1, 1, InferFromLocal, FromLocalMemory});
  rules->push_back({"dtensor_embedding", 2, 2, InferDTensorEmbedding, DTensorEmbeddingMemory});
  rules->push_back({"loss_parallel_cross_entropy", 2, 2, InferLossParallel, LossParallelMemory});
}

}  // namespace rules
}  // namespace memest
