// Rules for normalisation layers, and the vector norm and clamp F.normalize is made of.
//
// derivatives.yaml: native_layer_norm saves input, weight, bias and its mean and rstd outputs
// (float32 for float32/half inputs, shaped like the input with the normalised dims set to 1);
// native_batch_norm saves input, weight, running stats and save_mean / save_invstd ([C],
// float32); native_group_norm saves input, weight, mean and rstd ([N, G]). RMSNorm has no
// fused kernel in the PyTorch versions that presets target; it is written (as HF's
// LlamaRMSNorm) as x.to(float32).pow(2).mean(-1, keepdim) -> rsqrt -> x * rstd -> .to(dtype)
// -> weight * ..., and its rule accounts for what those ops save.
#include <algorithm>

#include "engine/rules/internal.h"

namespace memest {
namespace rules {
namespace {

Status CheckAffine(const OpCall& c, size_t first, const Shape& want) {
  for (size_t i = first; i < c.inputs.size() && i < first + 2; ++i) {
    if (c.in(i).shape != want) {
      return InvalidArgument(InputField(c, i) + ": expected shape " + ShapeToString(want) +
                             ", got " + ShapeToString(c.in(i).shape));
    }
  }
  return Status::Ok();
}

bool AnyNeedsGrad(const OpCall& c) {
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (c.needs_grad(i)) return true;
  }
  return false;
}

// Normalisations keep their input and two float32 statistics (mean and rstd / invstd).
void SaveInputAndStats(const OpCall& c, const Shape& stats, const char* mean, const char* rstd,
                       OpMemory* m) {
  const DType acc = AccType(c.in(0).dtype);
  m->saved_inputs.push_back(0);
  m->saved_extras.push_back(AllocOf(stats, acc, mean));
  m->saved_extras.push_back(AllocOf(stats, acc, rstd));
}

StatusOr<int64_t> NormalizedNdim(const OpCall& c) {
  MEMEST_ASSIGN_OR_RETURN(int64_t n, IntAttr(c.op.attrs, "normalized_ndim", 1, c.field));
  if (n < 1 || n > static_cast<int64_t>(c.in(0).shape.size())) {
    return InvalidArgument(AttrField(c, "normalized_ndim") + ": must be in [1, rank], got " +
                           std::to_string(n));
  }
  return n;
}

StatusOr<std::vector<OutputSpec>> InferLayerNorm(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, 8));
  MEMEST_ASSIGN_OR_RETURN(int64_t n, NormalizedNdim(c));
  const Shape& x = c.in(0).shape;
  MEMEST_RETURN_IF_ERROR(CheckAffine(c, 1, Shape(x.end() - n, x.end())));
  return std::vector<OutputSpec>{{c.in(0).shape, c.in(0).dtype}};  // contiguous
}

// The kernels read their input row-major (layer_norm_cpu / layer_norm_cuda:
// input.expect_contiguous(); 1.13: input.contiguous()): a permuted input (ConvNeXt's
// LayerNorm2d normalises x.permute(0, 2, 3, 1)) is copied for the forward, and the saved input
// is copied again in backward (layer_norm_backward_*: input.expect_contiguous()), as is an
// incoming gradient that is not row-major (it comes back through the permute). Measured on
// 1.13 (conformance ops/layer_norm_permuted_input); 2.x read from source.
void LayerNormMemory(const OpCall& c, OpMemory* m) {
  const bool strided = !IsContiguous(c.in(0).shape, c.in(0).strides);
  if (strided) m->forward_temps.push_back(Alloc{BytesOf(c.in(0)), "layer_norm contiguous input"});
  if (!AnyNeedsGrad(c)) return;
  StatusOr<int64_t> n = NormalizedNdim(c);
  Shape stats = c.in(0).shape;
  for (int64_t i = 0; i < (n.ok() ? *n : 1); ++i) stats[stats.size() - 1 - i] = 1;
  SaveInputAndStats(c, stats, "layer_norm mean", "layer_norm rstd", m);
  m->backward_needs_contiguous_grad = true;
  if (strided) m->backward_temps.push_back(Alloc{BytesOf(c.in(0)), "layer_norm contiguous input"});
  if (c.runtime == Runtime::kCpuTorch113) {
    // LayerNormBackwardKernel (CPU): a [2, 1, N] float32 dgamma/dbeta partial-sum buffer (per
    // thread; one thread assumed) and a scalar.
    const int64_t features = Numel(c.in(0).shape) / std::max<int64_t>(Numel(stats), 1);
    m->backward_temps.push_back(Alloc{2 * features * 4, "layer_norm backward partial sums"});
    m->backward_temps.push_back(Alloc{4, "layer_norm backward scalar"});
  }
}

StatusOr<std::vector<OutputSpec>> InferBatchNorm(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 2, 5));
  const Shape channels{c.in(0).shape[1]};
  for (size_t i = 1; i < c.inputs.size(); ++i) {
    if (c.in(i).shape != channels) {
      return InvalidArgument(InputField(c, i) + ": expected shape " + ShapeToString(channels) +
                             ", got " + ShapeToString(c.in(i).shape));
    }
  }
  return std::vector<OutputSpec>{{c.in(0).shape, c.in(0).dtype}};  // contiguous
}

void BatchNormMemory(const OpCall& c, OpMemory* m) {
  if (!AnyNeedsGrad(c)) return;
  SaveInputAndStats(c, {c.in(0).shape[1]}, "batch_norm save_mean", "batch_norm save_invstd", m);
  if (c.runtime == Runtime::kCpuTorch113) {  // batch_norm_backward_cpu: an input-sized buffer
    m->backward_temps.push_back(Alloc{BytesOf(c.in(0)), "batch_norm backward buffer"});
  }
}

StatusOr<std::vector<OutputSpec>> InferGroupNorm(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 2, 5));
  MEMEST_ASSIGN_OR_RETURN(int64_t groups, IntAttr(c.op.attrs, "num_groups", 0, c.field));
  const int64_t ch = c.in(0).shape[1];
  if (groups <= 0 || ch % groups != 0) {
    return InvalidArgument(AttrField(c, "num_groups") + ": must be positive and divide the " +
                           std::to_string(ch) + " channels, got " + std::to_string(groups));
  }
  MEMEST_RETURN_IF_ERROR(CheckAffine(c, 1, Shape{ch}));
  return std::vector<OutputSpec>{{c.in(0).shape, c.in(0).dtype}};  // contiguous
}

void GroupNormMemory(const OpCall& c, OpMemory* m) {
  if (!AnyNeedsGrad(c)) return;
  StatusOr<int64_t> groups = IntAttr(c.op.attrs, "num_groups", 1, c.field);
  SaveInputAndStats(c, {c.in(0).shape[0], groups.ok() ? *groups : 1}, "group_norm mean",
                    "group_norm rstd", m);
  m->backward_needs_dense_grad = true;  // derivatives.yaml: grads[0].contiguous()
  if (c.runtime == Runtime::kCpuTorch113) {  // GroupNormBackwardKernel: two [N, C] float32 sums
    m->backward_temps.push_back(
        Alloc{2 * c.in(0).shape[0] * c.in(0).shape[1] * 4, "group_norm backward ds, db"});
  }
}

StatusOr<std::vector<OutputSpec>> InferRmsNorm(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 1, 8));
  MEMEST_RETURN_IF_ERROR(IntAttr(c.op.attrs, "upcast", 0, c.field).status());
  if (c.inputs.size() == 2 && c.in(1).shape != Shape{c.in(0).shape.back()}) {
    return InvalidArgument(InputField(c, 1) + ": expected shape [" +
                           std::to_string(c.in(0).shape.back()) + "], got " +
                           ShapeToString(c.in(1).shape));
  }
  DType out = c.in(0).dtype;
  if (c.inputs.size() == 2) out = PromoteTypes(out, c.in(1).dtype);
  return std::vector<OutputSpec>{{c.in(0).shape, out}};
}

void RmsNormMemory(const OpCall& c, OpMemory* m) {
  const Tensor& x = c.in(0);
  const bool weighted = c.inputs.size() == 2;
  StatusOr<int64_t> upcast_attr = IntAttr(c.op.attrs, "upcast", 0, c.field);
  const bool upcast = upcast_attr.ok() && *upcast_attr != 0 && x.dtype != DType::kFloat32;
  const DType compute = upcast ? DType::kFloat32 : x.dtype;
  const int64_t n = Numel(x.shape);
  Shape rows = x.shape;
  rows.back() = 1;
  const bool grad = c.needs_grad(0) || (weighted && c.needs_grad(1));
  if (!grad) {
    // Under no_grad every intermediate is transient: x^2 is gone before x*rstd is formed.
    m->forward_temps.push_back(Alloc{n * DTypeSize(compute), "rms_norm x*rstd"});
    if (upcast) m->forward_temps.push_back(Alloc{n * 4, "rms_norm float32 copy"});
    return;
  }
  // pow(2) and x*rstd keep the (float32 copy of the) input; rsqrt keeps its [.., 1] result.
  if (upcast) {
    m->saved_extras.push_back(Alloc{n * 4, "rms_norm float32 copy of x"});
  } else {
    m->saved_inputs.push_back(0);
  }
  m->saved_extras.push_back(AllocOf(rows, compute, "rms_norm rstd"));
  if (c.runtime == Runtime::kCpuTorch113) {  // 1.13's mean.dim keeps its input, x.pow(2)
    m->saved_extras.push_back(Alloc{n * DTypeSize(compute), "rms_norm x^2 (kept by 1.13's mean)"});
  }
  if (weighted) {
    // weight * xhat keeps xhat (in x's dtype) for the weight's gradient: a frozen weight (a
    // LoRA base) needs none, and xhat is gone once the product exists. With upcast the float32
    // xhat is a local that lives until the module returns.
    Alloc xhat{n * DTypeSize(x.dtype), "rms_norm normalised x"};
    (c.needs_grad(1) ? m->saved_extras : m->forward_temps).push_back(xhat);
    if (upcast) m->forward_temps.push_back(Alloc{n * 4, "rms_norm float32 x*rstd"});
  }
  // The backward of those ops holds two input-sized products at its peak; 1.13, which kept x^2,
  // one (measured on 1.13's CPU path, where the same ops written out one by one agree).
  const int products = c.runtime == Runtime::kCpuTorch113 ? 1 : 2;
  m->backward_temps.push_back(
      Alloc{products * n * DTypeSize(compute), "rms_norm backward products"});
}

// ---- F.normalize's pieces: norm(x; p=2, dim, keepdim) and clamp(x; min?, max?) ----

// norm.ScalarOpt_dim / linalg_vector_norm, p = 2 (derivatives.yaml: norm_backward(grad, self,
// p, result, ...) keeps self and result). Backward (FunctionsManual.cpp, p = 2):
// self * (grad / norm).masked_fill_(norm == 0, 0): an output-sized quotient and bool mask
// (2.x, CUDA); 1.13's CPU also held an input-sized product and the mask (measured:
// [8, 4, 16] -> [8, 4, 1]: 2048 + 32 bytes beside the gradient).
StatusOr<std::vector<OutputSpec>> InferNorm(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_ASSIGN_OR_RETURN(double p, FloatAttr(c.op.attrs, "p", 2.0, c.field));
  if (p != 2.0) return InvalidArgument(AttrField(c, "p") + ": only the 2-norm is modelled");
  MEMEST_ASSIGN_OR_RETURN(std::vector<int64_t> dims, IntsAttr(c.op.attrs, "dim", {}, c.field));
  MEMEST_ASSIGN_OR_RETURN(int64_t keepdim, IntAttr(c.op.attrs, "keepdim", 0, c.field));
  const Shape& x = c.in(0).shape;
  std::vector<bool> reduced(x.size(), dims.empty());
  for (int64_t d : dims) {
    MEMEST_ASSIGN_OR_RETURN(int k, NormalizeDim(d, static_cast<int>(x.size()), AttrField(c, "dim")));
    reduced[k] = true;
  }
  Shape out;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!reduced[i]) out.push_back(x[i]);
    else if (keepdim) out.push_back(1);
  }
  return std::vector<OutputSpec>{{out, c.in(0).dtype}};
}

void NormMemory(const OpCall& c, OpMemory* m) {
  if (!c.needs_grad(0)) return;
  m->saved_inputs.push_back(0);
  m->saved_outputs.push_back(0);
  const int64_t n = Numel(c.out(0).shape);
  m->backward_temps.push_back(Alloc{n, "norm backward: norm == 0"});
  m->backward_temps.push_back(c.runtime == Runtime::kCpuTorch113
                                  ? Alloc{BytesOf(c.in(0)), "norm backward: self * scale (CPU)"}
                                  : Alloc{BytesOf(c.out(0)), "norm backward: grad / norm"});
}

// clamp / clamp_min / clamp_max (derivatives.yaml: clamp_backward(grad, self, min, max) keeps
// self): backward is where(mask, grad, 0) with a bool mask per bound (self >= min,
// self <= max, and-ed in place) and a 0-dim zero (measured on 1.13's CPU).
StatusOr<std::vector<OutputSpec>> InferClamp(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  if (!HasAttr(c.op.attrs, "min") && !HasAttr(c.op.attrs, "max")) {
    return InvalidArgument(AttrField(c, "min") + ": clamp needs a min or a max");
  }
  MEMEST_RETURN_IF_ERROR(FloatAttr(c.op.attrs, "min", 0.0, c.field).status());
  MEMEST_RETURN_IF_ERROR(FloatAttr(c.op.attrs, "max", 0.0, c.field).status());
  return std::vector<OutputSpec>{{c.in(0).shape, c.in(0).dtype}};
}

void ClampMemory(const OpCall& c, OpMemory* m) {
  if (!c.needs_grad(0)) return;
  m->saved_inputs.push_back(0);
  const int64_t bounds = HasAttr(c.op.attrs, "min") + HasAttr(c.op.attrs, "max");
  m->backward_temps.push_back(Alloc{bounds * Numel(c.in(0).shape), "clamp backward masks"});
  m->backward_temps.push_back(Alloc{DTypeSize(c.in(0).dtype), "zero"});
}

}  // namespace

void RegisterNormRules(std::vector<OpRule>* r) {
  r->push_back({"norm", 1, 1, InferNorm, NormMemory});
  r->push_back({"clamp", 1, 1, InferClamp, ClampMemory});
  r->push_back({"layer_norm", 1, 3, InferLayerNorm, LayerNormMemory});
  r->push_back({"batch_norm", 1, 5, InferBatchNorm, BatchNormMemory});
  r->push_back({"group_norm", 1, 3, InferGroupNorm, GroupNormMemory});
  r->push_back({"rms_norm", 1, 2, InferRmsNorm, RmsNormMemory});
}

}  // namespace rules
}  // namespace memest
