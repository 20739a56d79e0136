// Rules for the ops tensor parallelism adds to one rank's graph (engine/passes/tensor_parallel.h):
// Megatron-LM's linear with its communication, and the collectives between the tensor-parallel
// regions. As megatron/core/tensor_parallel/{layers,mappings}.py run them (NVIDIA/Megatron-LM,
// read at 00caa53; docs/parallelism.md cites each line). NCCL's collectives write into tensors
// their caller made and allocate nothing through PyTorch's allocator.
//
//   megatron_linear(x, weight, bias?; tp, gather_dim=-1, input_grad="none", weight_layout="out_in")
//     LinearWithGradAccumulationAndAsyncCommunication without gradient-accumulation fusion.
//     gather_dim >= 0 (sequence parallelism): x is this rank's shard of the sequence, gathered
//     along gather_dim into Megatron's global memory buffer (not a tensor of the graph: the
//     pass's hooks keep it, engine/step/tensor_parallel.cc) before the product. input_grad: what
//     backward does with the input's gradient, "all_reduce" (in place: a column-parallel linear
//     without sequence parallelism), "reduce_scatter" (into a new shard: with it) or "none" (a
//     row-parallel linear). weight_layout "in_out": an HF Conv1D weight [in, out].
//   tp_all_reduce(x; tp, out_of_place=0)   _ReduceFromModelParallelRegion: in place, x itself;
//                               backward hands the gradient on. out_of_place: DTensor's
//                               functional all-reduce, a new tensor (a clone reduced in place)
//   tp_reduce_scatter(x; tp, dim)  _ReduceScatterToSequenceParallelRegion: a new tensor of x's
//                               shape with dim divided by tp; backward all-gathers the gradient
//                               into a new tensor of x's shape
//   tp_scatter(x; tp, dim)      scatter_to_sequence_parallel_region then clone (Megatron's
//                               clone_scatter_output_in_embedding): this rank's chunk along dim as
//                               a new tensor; backward all-gathers into a new tensor of x's shape
//   tp_all_gather(x; tp, dim)   _GatherFromModelParallelRegion (ColumnParallelLinear with
//                               gather_output, vLLM's LogitsProcessor._gather_logits): every
//                               rank's shard along dim, a new tensor tp times x's size there;
//                               backward keeps the rank's chunk of the gradient, a new tensor
//                               (DTensor: reduce-scatters it into one)
//   DTensor's layouts: tp_reduce_scatter and tp_all_gather take scatter_copy and gather_copy
//   (0 or 1), the copies funcol makes when the sequence is not dim 0 (engine/rules/dtensor.cc)
//   flat (0 or 1): torch.distributed's list all_gather / reduce_scatter (Megatron's with split
//   sizes: its MoE dispatcher) over equal splits: ProcessGroupNCCL (and gloo) gathers into, or
//   scatters from, one new flat tensor of the whole (newLikeFlat) and copies it out or in, in
//   forward and again in backward (the other collective, with the splits)
//   vocab_parallel_embedding(weight[V/tp, d], ids; tp)   VocabParallelEmbedding before its
//                               reduction: the rank's rows looked up, the others' tokens zeroed
//   vocab_parallel_cross_entropy(logits[.., V/tp], target[..]; tp)   _VocabParallelCrossEntropy:
//                               the per-token loss, float32, of target's shape
//   cp_attention(q[B, H, L/cp, D], k[B, Hk, S/cp, D], v; cp, is_causal=0)   context parallelism's
//                               ring attention over the rank's share of the sequence
//                               (TransformerEngine's AttnFuncWithCPAndKVP2P), the output like q
#include "engine/rules/internal.h"

namespace memest {
namespace rules {

StatusOr<int64_t> TensorGroupSize(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(int64_t tp, IntAttr(c.op.attrs, "tp", 0, c.field));
  if (tp < 1) {
    return InvalidArgument(AttrField(c, "tp") + ": the tensor-parallel group size, at least 1, got " +
                           std::to_string(tp));
  }
  return tp;
}

bool FlagAttr(const OpCall& c, const char* name) {
  StatusOr<int64_t> v = IntAttr(c.op.attrs, name, 0, c.field);
  return v.ok() && *v != 0;
}

namespace {

// The dim attribute of a scatter / reduce-scatter, normalised, dividing evenly by tp.
StatusOr<int> ShardDim(const OpCall& c, int64_t tp) {
  MEMEST_ASSIGN_OR_RETURN(int64_t dim, IntAttr(c.op.attrs, "dim", 0, c.field));
  const Shape& x = c.in(0).shape;
  MEMEST_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, static_cast<int>(x.size()), AttrField(c, "dim")));
  if (x[d] % tp != 0) {
    return InvalidArgument(InputField(c, 0) + ": dim " + std::to_string(d) + " of " +
                           ShapeToString(x) + " does not split evenly over " + std::to_string(tp) +
                           " ranks");
  }
  return d;
}

StatusOr<std::vector<OutputSpec>> InferMegatronLinear(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(int64_t tp, TensorGroupSize(c));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 2, static_cast<int>(kMaxRank)));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 1, 2, 2));
  MEMEST_ASSIGN_OR_RETURN(std::string layout, StringAttr(c.op.attrs, "weight_layout", "out_in", c.field));
  if (layout != "out_in" && layout != "in_out") {
    return InvalidArgument(AttrField(c, "weight_layout") + ": out_in or in_out, got '" + layout + "'");
  }
  MEMEST_ASSIGN_OR_RETURN(std::string grad, StringAttr(c.op.attrs, "input_grad", "none", c.field));
  if (grad != "none" && grad != "all_reduce" && grad != "reduce_scatter") {
    return InvalidArgument(AttrField(c, "input_grad") + ": none, all_reduce or reduce_scatter, got '" +
                           grad + "'");
  }
  const Shape& w = c.in(1).shape;
  const int64_t in = layout == "out_in" ? w[1] : w[0];
  const int64_t out = layout == "out_in" ? w[0] : w[1];
  Shape y = c.in(0).shape;
  if (y.back() != in) {
    return InvalidArgument(InputField(c, 0) + ": last dim " + std::to_string(y.back()) +
                           " does not match the weight " + ShapeToString(w) + "'s " +
                           std::to_string(in) + " input features");
  }
  MEMEST_ASSIGN_OR_RETURN(int64_t gather, IntAttr(c.op.attrs, "gather_dim", -1, c.field));
  if (gather >= 0) {
    MEMEST_ASSIGN_OR_RETURN(int d, NormalizeDim(gather, static_cast<int>(y.size()) - 1,
                                                AttrField(c, "gather_dim")));
    MEMEST_ASSIGN_OR_RETURN(y[d], CheckedMul(y[d], tp));
  }
  y.back() = out;
  if (c.inputs.size() == 3 && c.in(2).shape != Shape{out}) {
    return InvalidArgument(InputField(c, 2) + ": the bias must be [" + std::to_string(out) +
                           "], got " + ShapeToString(c.in(2).shape));
  }
  return std::vector<OutputSpec>{{y, c.in(0).dtype}};
}

// Forward: `output = torch.matmul(total_input, weight.t())`, then `output = output + bias`: the
// product is a second tensor of the output's size until the sum replaces it. Saved:
// (input, weight), the input being this rank's shard under sequence parallelism. Backward:
// grad_input = grad_output.matmul(weight) always, of the gathered input's shape; it is the
// input's gradient unless it is reduce-scattered into a new shard (then scratch until the
// function returns) or the input needs none; grad_output.contiguous(); grad_weight and
// grad_bias (sum over the leading dims) are new.
void MegatronLinearMemory(const OpCall& c, OpMemory* m) {
  const Tensor& y = c.out(0);
  if (c.inputs.size() == 3) m->forward_temps.push_back(AllocOf(y.shape, y.dtype, "matmul before the bias"));
  bool grads = false;
  for (size_t i = 0; i < c.inputs.size(); ++i) grads |= c.needs_grad(i);
  if (!grads) return;
  m->saved_inputs = {0, 1};
  m->backward_needs_contiguous_grad = true;
  StatusOr<std::string> grad = StringAttr(c.op.attrs, "input_grad", "none", c.field);
  Shape gathered = y.shape;
  gathered.back() = c.in(0).shape.back();
  if (!c.needs_grad(0) || (grad.ok() && *grad == "reduce_scatter")) {
    m->backward_temps.push_back(AllocOf(gathered, c.in(0).dtype, "grad_input before its reduce-scatter"));
  }
}

StatusOr<std::vector<OutputSpec>> InferAllReduce(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(TensorGroupSize(c).status());
  MEMEST_RETURN_IF_ERROR(IntAttr(c.op.attrs, "out_of_place", 0, c.field).status());
  if (FlagAttr(c, "out_of_place")) return std::vector<OutputSpec>{{c.in(0).shape, c.in(0).dtype}};
  return std::vector<OutputSpec>{ViewOf(0, c.in(0).shape, c.in(0).dtype, c.in(0).strides)};
}

void PassGradient(const OpCall& c, OpMemory* m) { m->grad_flow = {GradFlow::kPassThrough}; }

StatusOr<std::vector<OutputSpec>> InferShard(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(int64_t tp, TensorGroupSize(c));
  MEMEST_ASSIGN_OR_RETURN(int d, ShardDim(c, tp));
  Shape y = c.in(0).shape;
  y[d] /= tp;
  return std::vector<OutputSpec>{{y, c.in(0).dtype}};
}

StatusOr<std::vector<OutputSpec>> InferGather(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(int64_t tp, TensorGroupSize(c));
  MEMEST_ASSIGN_OR_RETURN(int d, ShardDim(c, 1));
  Shape y = c.in(0).shape;
  StatusOr<int64_t> whole = CheckedMul(y[d], tp);
  if (!whole.ok()) return whole.status().Prefixed(AttrField(c, "tp") + ": ");
  y[d] = *whole;
  return std::vector<OutputSpec>{{y, c.in(0).dtype}};
}

// NCCL gathers into the new output: nothing else, and nothing saved. Funcol's all_gather_single
// (gather_copy) gathers along dim 0 and cats the chunks along the sequence into the output (the
// dim-0 result freed after); its backward reduce-scatters the gradient, first copied into chunk
// order when the sequence is not dim 0 (scatter_copy).
void GatherMemory(const OpCall& c, OpMemory* m) {
  if (FlagAttr(c, "gather_copy")) m->forward_temps.push_back(Alloc{BytesOf(c.out(0)), "all-gather before its cat"});
  if (FlagAttr(c, "scatter_copy")) m->backward_temps.push_back(Alloc{BytesOf(c.out(0)), "gradient in chunk order"});
  if (FlagAttr(c, "flat")) {
    m->forward_temps.push_back(Alloc{BytesOf(c.out(0)), "all_gather's flattened output (equal splits)"});
    m->backward_temps.push_back(Alloc{BytesOf(c.out(0)), "reduce_scatter's flattened input"});
  }
}

// The reduce-scatter reads `input_.contiguous()`: a copy of a strided input while it runs;
// funcol's reduce_scatter_tensor along a dim other than 0 copies it into chunk order
// (scatter_copy). The backward all-gathers the gradient, through a dim-0 result that the cat
// replaces (gather_copy).
void ReduceScatterMemory(const OpCall& c, OpMemory* m) {
  if (!IsContiguous(c.in(0).shape, c.in(0).strides) || FlagAttr(c, "scatter_copy")) {
    m->forward_temps.push_back(Alloc{BytesOf(c.in(0)), "reduce-scatter input made contiguous"});
  }
  if (FlagAttr(c, "gather_copy")) m->backward_temps.push_back(Alloc{BytesOf(c.in(0)), "all-gather before its cat"});
  if (FlagAttr(c, "flat")) {
    m->forward_temps.push_back(Alloc{BytesOf(c.in(0)), "reduce_scatter's flattened input"});
    m->backward_temps.push_back(Alloc{BytesOf(c.in(0)), "all_gather's flattened output (equal splits)"});
  }
}

// Megatron splits along the first dim, whose chunks are contiguous views; a chunk along a later
// dim (a batch-first [b, s, h] layout) is copied by `.contiguous()` before the clone.
void ScatterMemory(const OpCall& c, OpMemory* m) {
  StatusOr<int> d = ShardDim(c, 1);
  if (!d.ok()) return;
  bool strided = false;
  for (int k = 0; k < *d; ++k) strided |= c.in(0).shape[k] > 1;
  if (strided) m->forward_temps.push_back(Alloc{BytesOf(c.out(0)), "scattered chunk made contiguous"});
}

StatusOr<std::vector<OutputSpec>> InferVocabEmbedding(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(TensorGroupSize(c).status());
  return InferEmbedding(c);
}

// Forward: input_mask = (ids < start) | (ids >= end) (two bool tensors, then the mask),
// masked_input = ids.clone() - start, masked_input[input_mask] = 0 (index_put_ with a bool
// mask: nonzero's int64 positions, at most one per token), the lookup, output_parallel[
// input_mask, :] = 0.0 in place. Saved: masked_input (the lookup's indices) and input_mask
// (the index_put_'s). Backward: that assignment wrote through a view (`[mask, :]`), so autograd
// runs CopySlices: a copy of the incoming gradient, the view's slice of it cloned, and
// index_put_'s gradient grad.index_put(mask, 0) of that: three tensors of the output's size at
// once (measured on 1.13, tests/parallel tp/lm); then embedding_dense_backward
// (engine/rules/shape.cc's embedding: on CUDA its index sort and per-segment float32 sums).
void VocabEmbeddingMemory(const OpCall& c, OpMemory* m) {
  const int64_t n = Numel(c.in(1).shape);
  m->forward_temps = {{2 * n, "vocab range comparisons"}, {8 * n, "ids clone"},
                      {8 * n, "index_put_ positions"}};
  m->grad_flow = {GradFlow::kFresh, GradFlow::kNone};
  if (!c.needs_grad(0)) {
    m->forward_temps.push_back({9 * n, "masked ids and mask"});
    return;
  }
  m->saved_extras = {{8 * n, "masked ids"}, {n, "out-of-range mask"}};
  // CopySlices, then EmbeddingBackward: the incoming gradient is gone before the table's
  // gradient is made; of CopySlices' three tensors only its result is handed on.
  m->backward_scratch_consumes_grad = true;
  m->backward_first_temps.push_back(Alloc{2 * BytesOf(c.out(0)), "CopySlices: the slice, index_put_'s gradient"});
  m->backward_temps.push_back(Alloc{BytesOf(c.out(0)), "CopySlices: the gradient copied"});
  EmbeddingBackwardScratch(c, m);
}

StatusOr<std::vector<OutputSpec>> InferVocabCrossEntropy(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(TensorGroupSize(c).status());
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  const Shape& logits = c.in(0).shape;
  Shape rows(logits.begin(), logits.end() - (logits.empty() ? 0 : 1));
  if (logits.size() < 2 || c.in(1).shape != rows || IsFloating(c.in(1).dtype)) {
    return InvalidArgument(InputField(c, 1) + ": integer targets of the logits' leading dims " +
                           ShapeToString(rows) + ", got " + ShapeToString(c.in(1).shape));
  }
  return std::vector<OutputSpec>{{rows, DType::kFloat32}};
}

// Forward (megatron/core/tensor_parallel/cross_entropy.py): 16-bit logits are copied to
// float32 (.float()); float32 ones are worked on in place. logits_max = max(dim=-1) (values and
// indices), the max subtracted in place, the target mask (two comparisons), masked_target =
// target.clone() - start, arange, the predicted logits indexed and cloned, exp in place,
// sum_exp, log(sum_exp) - predicted (the loss), the softmax divided in place. Saved: the
// softmax (the float32 logits' storage), the target mask and masked_target. Backward writes
// the gradient into the saved softmax (arange and 1 - mask.float() beside it); autograd casts it
// to 16-bit logits' dtype, a new tensor. For float32 logits the gradient is the saved storage
// itself, counted here as a new tensor (an over-count of one logits-sized tensor in backward).
void VocabCrossEntropyMemory(const OpCall& c, OpMemory* m) {
  const int64_t n = Numel(c.in(1).shape);
  const bool copy = c.in(0).dtype != DType::kFloat32;
  const int64_t logits32 = Numel(c.in(0).shape) * 4;
  // Megatron-LM d98e8a64 cross_entropy.py 119-183 with its helpers (13-116), on the float32
  // logits worked on in place: past them and the saved mask and masked target, the forward
  // holds at most 16N beside the 4N loss (docs/parallelism-truth.md 3.1): the logits' max,
  // the predicted logits, sum_exp and log's temporary (arange_1d, the gather before its clone
  // and max's indices live at steps where fewer of these do).
  m->forward_temps = {{4 * n, "logits max"}, {4 * n, "predicted logits"}, {4 * n, "sum_exp"},
                      {4 * n, "log(sum_exp)"}};
  m->grad_flow = {GradFlow::kFresh, GradFlow::kNone};
  if (!c.needs_grad(0)) {
    m->forward_temps.push_back({n, "target mask"});
    m->forward_temps.push_back({8 * n, "masked target"});
    if (copy) m->forward_temps.push_back({logits32, "float32 logits"});
    return;
  }
  m->saved_extras = {{n, "target mask"}, {8 * n, "masked target"}};
  if (copy) m->saved_extras.push_back({logits32, "float32 softmax"});
  else m->saved_inputs.push_back(0);
  m->backward_temps = {{8 * n, "arange"}, {8 * n, "1 - mask.float()"}};
}

StatusOr<std::vector<OutputSpec>> InferCpAttention(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(int64_t cp, IntAttr(c.op.attrs, "cp", 0, c.field));
  if (cp < 1) {
    return InvalidArgument(AttrField(c, "cp") + ": the context-parallel group size, at least 1, "
                           "got " + std::to_string(cp));
  }
  MEMEST_RETURN_IF_ERROR(IntAttr(c.op.attrs, "is_causal", 0, c.field).status());
  for (size_t i = 0; i < 3; ++i) {
    MEMEST_RETURN_IF_ERROR(RequireFloating(c, i));
    MEMEST_RETURN_IF_ERROR(RequireRank(c, i, 4, 4));
  }
  const Shape& q = c.in(0).shape;
  const Shape& k = c.in(1).shape;
  const Shape& v = c.in(2).shape;
  if (q[0] != k[0] || q[3] != k[3] || k[1] != v[1] || k[2] != v[2] || k[1] <= 0 ||
      q[1] % k[1] != 0) {
    return InvalidArgument(c.field + ".inputs: attention shapes q " + ShapeToString(q) + ", k " +
                           ShapeToString(k) + ", v " + ShapeToString(v) + " do not match");
  }
  Shape out = q;
  out.back() = v.back();
  // Forward keeps cp copies of the keys and values and cp float32 outputs at once: each product
  // must be countable (tensors are at most kMaxTensorBytes; cp is the request's).
  const int64_t kv = BytesOf(c.in(1)) + BytesOf(c.in(2));
  for (int64_t bytes : {kv, Numel(out) * 4}) {
    if (!CheckedMul(cp, bytes).ok()) {
      return InvalidArgument(AttrField(c, "cp") + ": " + std::to_string(cp) +
                             " ranks' copies of " + std::to_string(bytes) +
                             " bytes are more than 2^62 bytes");
    }
  }
  return std::vector<OutputSpec>{{out, c.in(0).dtype}};
}

// TransformerEngine's AttnFuncWithCPAndKVP2P (context_parallel.py, read at d0067d0;
// /work/briefs/parallel-facts.md §8): forward copies the rank's K and V into one buffer
// (cat(k.view(-1), v.view(-1))) and receives the other ranks' into cp - 1 more, all kept until it
// returns, with each step's output in float32 and its float32 log-sum-exp for the correction.
// Saved: q, the last received K and V, the output and its float32 log-sum-exp [B, H, L]. Backward:
// two buffers each holding a K+V and its gradient (double buffering), dq's accumulator like q,
// then the input gradients.
void CpAttentionMemory(const OpCall& c, OpMemory* m) {
  StatusOr<int64_t> cp = IntAttr(c.op.attrs, "cp", 1, c.field);
  const int64_t steps = cp.ok() ? *cp : 1;
  const int64_t kv = BytesOf(c.in(1)) + BytesOf(c.in(2));
  const Shape& q = c.in(0).shape;
  const int64_t lse = q[0] * q[1] * q[2] * 4;
  const int64_t out32 = Numel(c.out(0).shape) * 4;
  m->forward_temps = {{steps * kv, "ring K and V buffers"}, {steps * out32, "per-step float32 outputs"},
                      {steps * lse, "per-step log-sum-exp"}};
  if (!c.needs_grad(0) && !c.needs_grad(1) && !c.needs_grad(2)) return;
  m->saved_inputs = {0};
  m->saved_outputs = {0};
  m->saved_extras = {{kv, "the last received K and V"}, {lse, "float32 log-sum-exp"}};
  m->backward_temps = {{4 * kv, "double-buffered K, V and their gradients"},
                       {BytesOf(c.in(0)), "dq accumulator"}};
}

}  // namespace

void RegisterParallelRules(std::vector<OpRule>* rules) {
  rules->push_back({"megatron_linear", 2, 3, InferMegatronLinear, MegatronLinearMemory});
  rules->push_back({"tp_all_reduce", 1, 1, InferAllReduce, PassGradient});
  rules->push_back({"tp_reduce_scatter", 1, 1, InferShard, ReduceScatterMemory});
  rules->push_back({"tp_scatter", 1, 1, InferShard, ScatterMemory});
  rules->push_back({"tp_all_gather", 1, 1, InferGather, GatherMemory});
  rules->push_back({"vocab_parallel_embedding", 2, 2, InferVocabEmbedding, VocabEmbeddingMemory});
  rules->push_back({"vocab_parallel_cross_entropy", 2, 2, InferVocabCrossEntropy,
                    VocabCrossEntropyMemory});
  rules->push_back({"cp_attention", 3, 3, InferCpAttention, CpAttentionMemory});
}

}  // namespace rules
}  // namespace memest
