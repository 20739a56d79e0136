// The op rule table: one entry per op kind, the heart of memest's accuracy.
//
// A rule says, for one call of its op, (1) the outputs' shapes, dtypes and strides, and
// whether an output shares an input's storage (views, in-place ops); and (2) the op's memory
// behaviour as PyTorch runs it: the scratch it allocates while it runs, what autograd saves
// for backward (inputs, outputs, extra tensors such as dropout masks, pooling indices and
// normalisation statistics, each in its real dtype), what its backward allocates beyond the
// input gradients, and how each input's gradient comes to be (a fresh tensor, or the incoming
// gradient passed through). The rules mirror PyTorch's tools/autograd/derivatives.yaml and the
// aten kernels; docs/op-rules.md cites the source of each.
//
// Vocabulary (inputs; attributes, with defaults):
//   linear(x, weight[out,in], bias?)          matmul(a, b)          bmm(a, b)
//   addmm(bias, a, b)                         baddbmm(self, a, b; beta=1, alpha=1)
//   einsum(a, b; equation)
//   conv1d / conv2d(x, weight, bias?; stride=1, padding=0, dilation=1, groups=1)
//   conv_transpose1d / conv_transpose2d(x, weight[in,out/groups,..], bias?; stride=1,
//       padding=0, output_padding=0, dilation=1, groups=1)
//   max_pool2d(x; kernel_size, stride=kernel_size, padding=0, dilation=1, ceil_mode=0)
//       -> (out, indices int64)
//   avg_pool2d(x; kernel_size, stride=kernel_size, padding=0, ceil_mode=0)
//   adaptive_avg_pool2d(x; output_size)
//   upsample_nearest2d(x; output_size)   upsample_bilinear2d(x; output_size, align_corners=0)
//   layer_norm(x, weight?, bias?; normalized_ndim=1)
//   batch_norm(x, weight?, bias?, running_mean?, running_var?)   (training: batch statistics)
//   group_norm(x, weight?, bias?; num_groups)
//   rms_norm(x, weight?; upcast=0)   upcast=1: computes in float32 as HF's LlamaRMSNorm does
//   relu / silu / hardswish / hardsigmoid / sigmoid / tanh(x; inplace=0)
//   hardtanh(x; min_val=-1, max_val=1, inplace=0)   (ReLU6: hardtanh(0, 6))
//   gelu(x; approximate="none"|"tanh", inplace=0)
//   exp(x)  rsqrt(x)  sqrt(x)  neg(x)  log1p(x)  log2(x)  floor(x)  pow(x; exponent)
//   softmax / log_softmax(x; dim=-1, inplace=0)  dropout(x; p=0.1, inplace=0)
//   stochastic_depth(x; p, mode="row"|"batch")   (torchvision.ops.stochastic_depth)
//   embedding(weight, indices)
//   embedding_bag(weight, indices, offsets?, per_sample_weights?; mode="mean", bag_size,
//       include_last_offset=0)
//   index(x, idx...; dim=0)   x[:, ..., idx1, idx2, ..] with integer index tensors (broadcast)
//   index_put_(x, idx, values; dim=0, accumulate=0) in place: x[:, ..., idx] = values
//   index_add_(x, idx, source; dim=0) in place: x.index_add_(dim, idx, source)
//   gather(x, idx; dim) -> idx's shape: x.gather(dim, idx)
//   mla_profile_attention(q, kv_c_normed, k_pe; workspace_rows, v_head_dim, kv_head_dim)
//       vLLM's latent attention in its profile run (engine/rules/served_mla.cc)
//   scatter_(x, idx; dim, value) in place   one_hot(ids; num_classes) -> int64 [..., num_classes]
//   nonzero(x; count) -> int64 [count, rank]   (count: the data's, as traced)
//   topk(x; k, dim=-1, largest=1, sorted=1) -> (values, indices)   sort(x; dim=-1, descending=0)
//   max(x) / min(x) -> 0-dim
//   add / sub / mul / div(a, b)   tensors, broadcasting       (a; scalar=<float>) with a scalar
//   add_ / mul_ / div_ (a, b) in place on a
//   masked_fill(x, mask; value)  where(cond, a, b)
//   eq / ne / lt / le / gt / ge(a, b) or (a; scalar) -> bool, not differentiable
//   bitwise_and / bitwise_or(a, b) integer or bool, not differentiable   bitwise_not(x) (~x)
//   maximum / minimum(a, b)   cumsum(x; dim) (an integral x sums into int64)
//   nms(boxes[N, 4], scores[N]; iou_threshold, count) -> int64 [count]   (torchvision.ops)
//   roi_align(x[N, C, H, W], rois[K, 5]; output_size, spatial_scale, sampling_ratio, aligned)
//   sum / mean(x; dim=[...] (all when absent), keepdim=0)
//   all / any(x; dim=[...] (all when absent), keepdim=0) -> bool, not differentiable
//   reshape / view(x; shape=[...], one -1 allowed)  transpose(x; dim0, dim1)  permute(x; dims)
//   expand(x; shape)  unsqueeze(x; dim)  squeeze(x; dim)  slice(x; dim, start, end, step=1)
//   split(x; dim, sizes=[...]) -> several views      flatten(x; start_dim=0, end_dim=-1)
//   detach(x)   x's storage, no gradient
//   contiguous(x)  to(x; dtype)  cat(xs...; dim=0)  arange(; end, start=0, step=1)
//   cross_entropy(logits[N,C,..], target[N,..] int64; reduction="mean"|"sum"|"none")
//   nll_loss(logp[N,C,..], target[N,..]; reduction)  mse_loss(a, b)
//   scaled_dot_product_attention(q, k, v, mask?; is_causal=0, dropout_p=0, fused=0, backend)
//                                            fused=0: the math form; fused=1: the kernel PyTorch
//                                            2.x runs (backend flash|efficient|cudnn|math)
//   lstm / gru(x, per layer and direction w_ih, w_hh[, b_ih, b_hh], h0?[, c0?]; num_layers=1,
//       bidirectional=0, batch_first=0, bias=1, dropout=0) -> (output, h_n[, c_n])
//       (engine/passes/rnn_expand.h; cuDNN's fused RNN on CUDA, 1.13's per-step ops on the CPU)
//   full(; shape, dtype="float32")   a tensor made without reading the graph (a factory, a
//                                    mask computed from constants and buffers): no gradient
//   expand and full take batch_dim: the dim of `shape` that is the micro-batch (rescaled with it)
//   pad(x; pad=[left, right, ...], value=0)   roll(x; shifts, dims)   clone(x)
//   fill_(x; value=0) in place   exponential_(x) in place (random draws, as fill_)
//   norm(x; p=2, dim=[...], keepdim=0)   clamp(x; min?, max?)
//   copy_(dst, src) in place: src broadcast to dst and converted to its dtype
//   bmm_into(dst, a, b) in place: a @ b written into dst (bmm's out=)
//   Tensor parallelism's, added by engine/passes/tensor_parallel.h (engine/rules/parallel.cc):
//   megatron_linear(x, weight, bias?; tp, gather_dim=-1, input_grad, weight_layout)
//   tp_all_reduce(x; tp)  tp_reduce_scatter(x; tp, dim)  tp_scatter(x; tp, dim)
//   tp_all_gather(x; tp, dim)   (a gathered column-parallel output: vLLM's logits)
//   vocab_parallel_embedding(weight, ids; tp)  vocab_parallel_cross_entropy(logits, target; tp)
//   cp_attention(q, k, v; cp, is_causal=0)   (context parallelism: engine/passes/context_parallel.h)
//   DTensor's (config.parallelism.tensor_layers; engine/rules/dtensor.cc): tp_from_local(x; tp)
//   dtensor_embedding(weight, ids; tp, scatter_dim=-1, scatter_copy=0, gather_copy=0)
//   loss_parallel_cross_entropy(logits, target; tp, nll_float32=0); and tp_all_reduce's
//   out_of_place=1, tp_reduce_scatter's and tp_all_gather's scatter_copy and gather_copy
//   (funcol's new tensors and layout copies)
//   linear_4bit(x, weight, bias?; out_features, weight_dtype, double_quant=0, autocast=""):
//     bitsandbytes' 4-bit linear, added by engine/passes/quantize.h (engine/rules/quantized.cc)
//   int8_quantize_rows(x; threshold, outlier_columns), int8_outlier_inputs(x, cols),
//   int8_outlier_weight(weight, SCB, cols), linear_8bit(x, weight, SCB, CA, SCA, bias?;
//   held_grad=""), int8_add_outliers(y, subA, subB, CA, SCA, x; autocast=""): bitsandbytes'
//     LLM.int8 (Linear8bitLt), a call as engine/passes/quantize.h writes it
//     (engine/rules/quantized_int8.cc)
//   torchao_int4_mm(x, qdata, scale, zero_point; group_size), torchao_int8_mm(x, qdata),
//   torchao_int8_scale(m, scale): torchao's weight-only linears, added by
//     engine/passes/quantize_torchao.h (engine/rules/quantized_torchao.cc)
//   te_linear(x, weight, bias?; activation_dtype, transposes=1): TransformerEngine's te.Linear
//     under fp8_autocast, added by engine/passes/fp8_te.h (engine/rules/fp8_te.cc)
//   w8a8_linear(x, weight, bias?; out_features, input_type, inputs, asymmetric=0, block_k=0)
//   wna16_linear(x, weight, bias?; out_features, bits, kernel, act_order=0, multiprocessors):
//     vLLM's quantized linears, added by engine/passes/served_quantize.h
//     (engine/rules/served_quantized.cc)
//   punica_lora_(y, x, slots...; slices, rank, shrink=1, tp=1, fully_sharded="none") in place:
//     vLLM's LoRA kernels on a wrapped module's output, added by engine/passes/served_lora.h
//     (engine/rules/served_lora.cc)
//   fused_experts(x, topk_weights, topk_ids; experts): vLLM's FusedMoE, built for serving by
//     engine/models/moe_layers.cc (engine/rules/fused_moe.cc)
//   Megatron-LM's MoELayer, built by engine/models/megatron_moe.cc (engine/rules/moe_dispatch.cc):
//   ep_all_to_all(x; ep, rows, experts, top_k, role)   the token dispatcher's all-to-all
//   index_select(x, idx; dim)   scatter(x, idx, src?; dim, value)   out of place
//   scatter_add_(x, idx, src; dim) in place   remainder(x; other)
//   megatron_swiglu(x, weights?)   its fused (weighted) SwiGLU
#ifndef MEMEST_ENGINE_RULES_OP_RULES_H_
#define MEMEST_ENGINE_RULES_OP_RULES_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"
#include "engine/rules/reduce_scratch.h"

namespace memest {

struct OpRule;

// One call of an op, as its rule sees it. During inference of outputs, `outputs` is empty.
struct OpCall {
  const Op& op;
  TensorPtrs inputs;
  TensorPtrs outputs;
  std::string field;  // where errors point, e.g. "model.ops[3]"
  bool grad_enabled = true;  // false under no_grad: inference, a checkpoint's first pass
  Runtime runtime = Runtime::kCuda;  // the few rules that differ on PyTorch 1.13's CPU path
  CpuIsa cpu_isa = CpuIsa::kAvx512;  // the CPU runtime's convolution kernels
  int64_t cpu_l1_bytes = 0;           // and the caches they are blocked by (0: oneDNN's defaults)
  int64_t cpu_l2_bytes = 0;
  // The GPU's multiprocessors and threads per multiprocessor, which size a CUDA reduction's
  // staging buffer (engine/rules/reduce_scratch.h); an H100's by default.
  ReduceDevice gpu;
  // The rule of op.kind when the caller has already looked it up (the step simulator does once
  // per op); null: OpMemoryOf looks it up.
  const OpRule* rule = nullptr;

  const Tensor& in(size_t i) const { return *inputs[i]; }
  const Tensor& out(size_t i) const { return *outputs[i]; }
  bool needs_grad(size_t i) const { return grad_enabled && inputs[i]->requires_grad; }
};

struct OutputSpec {
  Shape shape;
  DType dtype = DType::kFloat32;
  Strides strides;        // empty: contiguous
  int alias_input = -1;   // >= 0: shares the storage of that input (a view or in-place result)
  bool differentiable = true;  // false for integer / bool outputs (indices, masks)
};

// A tensor the rule allocates that is not a graph tensor (scratch, masks, statistics).
struct Alloc {
  int64_t bytes = 0;
  const char* what = "";  // "mask", "mean", "rstd", "broadcast product", ...
};

// How an input's gradient comes to be in backward.
enum class GradFlow : uint8_t {
  kFresh,         // backward allocates a new tensor shaped like the input
  kPassThrough,   // the incoming gradient of output 0 is handed on as is (add, same-shape views)
  kNone,          // not differentiable (indices, masks, targets, integer tensors)
};

struct OpMemory {
  std::vector<Alloc> forward_temps;   // live together while the op runs, freed when it returns
  std::vector<int> saved_inputs;      // input indices autograd keeps until this op's backward
  std::vector<int> saved_outputs;     // output indices autograd keeps
  std::vector<Alloc> saved_extras;    // extra tensors the op returns and autograd keeps
  std::vector<Alloc> backward_temps;  // scratch while its backward runs
  std::vector<GradFlow> grad_flow;    // one per input; filled with defaults when left empty
  // Per output, when its storage is larger than its shape (a 0-dim result viewing the
  // full-size buffer it was reduced from); empty or 0: the shape's bytes.
  std::vector<int64_t> output_storage_bytes;
  // Backward copies an incoming gradient that is not dense (an expanded view) before using it.
  bool backward_needs_dense_grad = false;
  // Backward copies an incoming gradient that is not row-major contiguous (a transposed or
  // sliced view: convolutions' grad_output.contiguous()) before using it.
  bool backward_needs_contiguous_grad = false;
  // With backward_needs_contiguous_grad: the layout the backward wants its incoming gradient
  // in, when not row-major (a channels-last convolution's grad_output.contiguous(
  // channels_last)); a gradient in another layout is copied. Empty: row-major.
  Strides backward_grad_strides;
  // Per input: the strides of the fresh gradient the backward makes (a channels-last
  // convolution's input and weight gradients); empty, or empty for an input: contiguous.
  std::vector<Strides> fresh_grad_strides;
  // Per input: the bytes of the fresh gradient the backward makes when it is larger than the
  // input (DTensor's row-split embedding, whose gradient is the whole table); empty, or 0 for an
  // input: the input's bytes.
  std::vector<int64_t> fresh_grad_bytes;
  // The backward runs as two autograd nodes (cross_entropy: nll_loss_backward, then
  // _log_softmax_backward_data): the first turns the incoming gradient into the backward
  // scratch, and the incoming gradient is released before the second makes the inputs'
  // gradients. Only for ops that pass no gradient through.
  bool backward_scratch_consumes_grad = false;
  // With backward_scratch_consumes_grad: scratch of the first node alone, freed when it returns,
  // before the second makes the inputs' gradients (CopySlices' clones of a view's gradient).
  std::vector<Alloc> backward_first_temps;
  // With backward_scratch_consumes_grad: saved_extras (their indices) only the first node keeps,
  // released when it returns, before the second node's scratch is made (autograd frees a node's
  // saved variables once it has run: nll_loss's float32 copy of the log-probabilities under
  // autocast, gone before the cast of its gradient back to the logits' dtype).
  std::vector<int> first_node_releases;
  // The order the backward hands the inputs' gradients on (autograd's next edges; an input
  // reached through another node, as linear's weight through t(), comes last). Empty: the
  // inputs' order. It matters where gradients meet in an InputBuffer (a weight used each step).
  std::vector<int> grad_order;
  // What the op keeps for backward (saved_inputs, saved_outputs, saved_extras) it keeps as
  // attributes of its autograd node (a custom Function's `ctx.tensors = ...`), not through
  // save_for_backward: its backward does not free them, the graph's end does (the node dies with
  // the graph), and torch.utils.checkpoint's hooks never see them, so a non-reentrant region's
  // first forward keeps them to the graph's end too (bitsandbytes' MatMul8bitLt).
  bool saved_until_graph_freed = false;
};

struct OpRule {
  std::string_view kind;
  int min_inputs = 1;
  int max_inputs = 1;  // -1: any number
  // Output shapes and dtypes from the inputs and attributes; refuses bad shapes and attributes
  // with an error naming "<call.field>.inputs[i]" or "<call.field>.attrs.<name>".
  StatusOr<std::vector<OutputSpec>> (*infer)(const OpCall& call) = nullptr;
  // Memory behaviour of a call whose outputs are resolved. Under no_grad
  // (call.grad_enabled false) nothing is saved: what would be saved is scratch.
  void (*memory)(const OpCall& call, OpMemory* mem) = nullptr;
  // True for ops that return their input in eval mode (dropout): inference aliases them.
  bool identity_in_eval = false;
  // For ops whose backward hands the incoming gradient on (GradFlow::kPassThrough): the strides
  // of the gradient input `in` receives, given the output gradient's; false when aten must copy
  // it instead (a reshape of a layout no view can express). Null: the same strides when the
  // ranks match, contiguous otherwise.
  bool (*grad_view)(const Op& op, const Tensor& in, const Tensor& out, const Strides& out_grad,
                    Strides* in_grad) = nullptr;
  // The backward hands each input a new view of the incoming gradient (transpose, reshape,
  // sum, cat), not the incoming tensor itself (add, contiguous): AccumulateGrad may then steal
  // it even when another input got a view of the same storage.
  bool backward_makes_views = false;
  // The op may keep what it saves as attributes of its node (OpMemory::saved_until_graph_freed):
  // the simulator asks the memory rule only of such ops before they run.
  bool keeps_node_attributes = false;
};

// The rule for `kind`, or nullptr.
const OpRule* FindOpRule(std::string_view kind);
// Every rule, sorted by kind.
std::vector<const OpRule*> AllOpRules();
// The op's outputs, validated: NOT_FOUND-like INVALID_ARGUMENT for an unknown kind (naming
// `call.field`.kind and listing the vocabulary), wrong input counts, bad shapes. Whether each
// output's bytes fit in 64 bits is for the caller to check (GraphBuilder::Add does, to name the
// request field a size too large came from).
StatusOr<std::vector<OutputSpec>> InferOutputs(const OpCall& call);
// The memory behaviour of a resolved call, with grad_flow defaults filled in.
OpMemory OpMemoryOf(const OpCall& call);
// Whether ops `a` and `b` of `g` are alike to every rule: the same kind and attributes, and
// tensors of the same shapes, strides, dtypes and requires_grad, aliasing or not alike, in
// place of each other (rules read nothing else of a call's op and tensors). Their calls under
// one configuration then get the same answers (Graph::copy_of names candidates).
bool OpsAlikeToRules(const Graph& g, int a, int b);

}  // namespace memest

#endif  // MEMEST_ENGINE_RULES_OP_RULES_H_
