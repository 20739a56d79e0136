// Rules for convolutions and pooling.
//
// derivatives.yaml (convolution): saves input and weight (input even when only the weight
// needs grad); transposed convolutions (conv_transpose1d/2d, aten::convolution with
// transposed=True) are the same op and keep the same. max_pool2d_with_indices saves its input and the int64 indices (an output-shaped
// tensor); avg_pool2d and _adaptive_avg_pool2d save their input. cuDNN's workspace is chosen
// per algorithm at run time and is not modelled here (Validate measures it on the device).
// On the CPU runtime a convolution's own scratch (oneDNN reorders and scratchpad, or im2col
// columns) is engine/rules/cpu_conv.h's measured rule.
// adaptive_avg_pool2d to 1x1 runs as a mean in PyTorch 2.x and keeps only sizes.
#include "engine/rules/cpu_conv.h"
#include "engine/rules/internal.h"

namespace memest {
namespace rules {
namespace {

constexpr int64_t kMaxSpatialAttr = (int64_t{1} << 31) - 1;

// Reads a per-spatial-dim attribute given as one int or a list of `n` ints, each in
// [min_value, kMaxSpatialAttr].
StatusOr<std::vector<int64_t>> SpatialAttr(const OpCall& c, const char* name, int n,
                                           int64_t fallback, int64_t min_value) {
  MEMEST_ASSIGN_OR_RETURN(std::vector<int64_t> v,
                          IntsAttr(c.op.attrs, name, std::vector<int64_t>(n, fallback), c.field));
  if (v.size() == 1) v.assign(n, v[0]);
  if (static_cast<int>(v.size()) != n) {
    return InvalidArgument(AttrField(c, name) + ": expected 1 or " + std::to_string(n) +
                           " values, got " + std::to_string(v.size()));
  }
  for (int64_t x : v) {
    if (x < min_value) {
      return InvalidArgument(AttrField(c, name) + ": must be at least " +
                             std::to_string(min_value) + ", got " + std::to_string(x));
    }
    if (x > kMaxSpatialAttr) {  // cuDNN and oneDNN take 32-bit strides, paddings and dilations
      return InvalidArgument(AttrField(c, name) + ": must be at most " +
                             std::to_string(kMaxSpatialAttr) + ", got " + std::to_string(x));
    }
  }
  return v;
}

// Output extent of one spatial dim, or an error when the window does not fit.
StatusOr<int64_t> OutExtent(const OpCall& c, int64_t in, int64_t k, int64_t s, int64_t p,
                            int64_t d) {
  // d < 2^31 and k - 1 < 2^56 (a weight's dim): the window's span may pass 64 bits.
  StatusOr<int64_t> dk = CheckedMul(d, k - 1);
  if (!dk.ok()) {
    return InvalidArgument(InputField(c, 1) + ": a window of " + std::to_string(k) +
                           " with dilation " + std::to_string(d) + " spans more than 2^62");
  }
  const int64_t span = *dk + 1;
  if (in + 2 * p < span) {
    return InvalidArgument(InputField(c, 0) + ": spatial size " + std::to_string(in) +
                           " (padding " + std::to_string(p) + ") is smaller than the window " +
                           std::to_string(span));
  }
  return (in + 2 * p - span) / s + 1;
}

struct ConvAttrs {
  std::vector<int64_t> stride, padding, dilation;
};

// A convolution's stride, padding and dilation, one value per spatial dim.
StatusOr<ConvAttrs> ReadConvAttrs(const OpCall& c, int n) {
  ConvAttrs a;
  MEMEST_ASSIGN_OR_RETURN(a.stride, SpatialAttr(c, "stride", n, 1, 1));
  MEMEST_ASSIGN_OR_RETURN(a.padding, SpatialAttr(c, "padding", n, 0, 0));
  MEMEST_ASSIGN_OR_RETURN(a.dilation, SpatialAttr(c, "dilation", n, 1, 1));
  return a;
}

// Whether a 2-D convolution runs channels-last: its input or weight reads as channels-last
// (PyTorch 2.x's cudnn_conv_suggest_memory_format, 1.13's mkldnn_conv_use_channels_last; both
// leave float64 row-major). ConvNeXt's LayerNorm2d hands its convolutions such an input.
bool ChannelsLastConv(const OpCall& c) {
  if (c.op.kind != "conv2d" || c.in(0).dtype == DType::kFloat64 || c.in(1).dtype == DType::kFloat64) {
    return false;
  }
  return SuggestsChannelsLast(c.in(0)) || SuggestsChannelsLast(c.in(1));
}

template <int N>
StatusOr<std::vector<OutputSpec>> InferConv(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, N + 2, N + 2));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 1, N + 2, N + 2));
  const Shape& x = c.in(0).shape;
  const Shape& w = c.in(1).shape;
  MEMEST_ASSIGN_OR_RETURN(int64_t groups, IntAttr(c.op.attrs, "groups", 1, c.field));
  if (groups <= 0 || x[1] % groups != 0 || w[0] % groups != 0) {
    return InvalidArgument(AttrField(c, "groups") + ": " + std::to_string(groups) +
                           " must be positive and divide the channels");
  }
  if (x[1] != w[1] * groups) {
    return InvalidArgument(InputField(c, 1) + ": weight " + ShapeToString(w) + " expects " +
                           std::to_string(w[1] * groups) + " input channels, the input " +
                           ShapeToString(x) + " has " + std::to_string(x[1]));
  }
  if (c.inputs.size() == 3 && c.in(2).shape != Shape{w[0]}) {
    return InvalidArgument(InputField(c, 2) + ": bias must have shape [" + std::to_string(w[0]) +
                           "], got " + ShapeToString(c.in(2).shape));
  }
  MEMEST_ASSIGN_OR_RETURN(ConvAttrs a, ReadConvAttrs(c, N));
  Shape out{x[0], w[0]};
  // The largest scratch a convolution's kernels make (engine/rules/cpu_conv.h) must be
  // representable too: the input unfolded for a gemm (im2col, the whole batch) and the weight
  // blocked in 16-channel tiles. The kernels' other buffers are small multiples of these or of
  // the tensors.
  Shape columns{x[0], w[1]};
  Shape blocked{(w[0] + 15) / 16 * 16, (x[1] + 15) / 16 * 16};
  for (int i = 0; i < N; ++i) {
    MEMEST_ASSIGN_OR_RETURN(int64_t e, OutExtent(c, x[2 + i], w[2 + i], a.stride[i],
                                                 a.padding[i], a.dilation[i]));
    out.push_back(e);
    columns.insert(columns.end(), {w[2 + i], e});
    blocked.push_back(w[2 + i]);
  }
  const DType dtype = PromoteTypes(c.in(0).dtype, c.in(1).dtype);
  MEMEST_RETURN_IF_ERROR(CheckedBytes(columns, dtype, c.field + ": its unfolded input").status());
  MEMEST_RETURN_IF_ERROR(CheckedBytes(blocked, dtype, c.field + ": its blocked weight").status());
  // A channels-last convolution writes a channels-last output (cuDNN's empty_cuda in that
  // memory format; 1.13's mkldnn and slow_conv2d resize_ it so).
  if (N == 2 && ChannelsLastConv(c)) return std::vector<OutputSpec>{{out, dtype, ChannelsLastStrides(out)}};
  return std::vector<OutputSpec>{{out, dtype}};
}

bool Transposed(const OpCall& c) { return c.op.kind.rfind("conv_transpose", 0) == 0; }

// A transposed convolution (the gradient of a convolution with respect to its input): weight
// [Cin, Cout / groups, k...], output extent (in - 1) * stride - 2 * padding +
// dilation * (k - 1) + output_padding + 1.
template <int N>
StatusOr<std::vector<OutputSpec>> InferConvTranspose(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, N + 2, N + 2));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 1, N + 2, N + 2));
  const Shape& x = c.in(0).shape;
  const Shape& w = c.in(1).shape;
  MEMEST_ASSIGN_OR_RETURN(int64_t groups, IntAttr(c.op.attrs, "groups", 1, c.field));
  if (groups <= 0 || x[1] % groups != 0) {
    return InvalidArgument(AttrField(c, "groups") + ": " + std::to_string(groups) +
                           " must be positive and divide the input's channels");
  }
  if (w[0] != x[1]) {
    return InvalidArgument(InputField(c, 1) + ": weight " + ShapeToString(w) + " expects " +
                           std::to_string(w[0]) + " input channels, the input " +
                           ShapeToString(x) + " has " + std::to_string(x[1]));
  }
  const StatusOr<int64_t> channels = CheckedMul(w[1], groups);
  if (!channels.ok()) return channels.status().Prefixed(AttrField(c, "groups") + ": ");
  const int64_t cout = *channels;
  if (c.inputs.size() == 3 && c.in(2).shape != Shape{cout}) {
    return InvalidArgument(InputField(c, 2) + ": bias must have shape [" + std::to_string(cout) +
                           "], got " + ShapeToString(c.in(2).shape));
  }
  MEMEST_ASSIGN_OR_RETURN(ConvAttrs a, ReadConvAttrs(c, N));
  MEMEST_ASSIGN_OR_RETURN(std::vector<int64_t> opad, SpatialAttr(c, "output_padding", N, 0, 0));
  Shape out{x[0], cout};
  Shape columns{w[1]};  // one image's columns: [Cout/g * k..., in...]
  for (int i = 0; i < N; ++i) {
    if (opad[i] >= a.stride[i] && opad[i] >= a.dilation[i]) {
      return InvalidArgument(AttrField(c, "output_padding") + ": " + std::to_string(opad[i]) +
                             " must be smaller than the stride or the dilation");
    }
    // Extents are below 2^56 and attributes below 2^31: the products and their sum are checked,
    // the rest cannot pass 64 bits.
    const StatusOr<int64_t> span = CheckedMul(x[2 + i] - 1, a.stride[i]);
    const StatusOr<int64_t> reach = CheckedMul(w[2 + i] - 1, a.dilation[i]);
    int64_t sum = 0;
    if (!span.ok() || !reach.ok() || !AddBytes(&sum, *span) || !AddBytes(&sum, *reach)) {
      return InvalidArgument(InputField(c, 0) + ": the output's extent passes 2^62");
    }
    const int64_t e = sum - 2 * a.padding[i] + opad[i] + 1;
    if (e <= 0) {
      return InvalidArgument(AttrField(c, "padding") + ": " + std::to_string(a.padding[i]) +
                             " leaves an output extent of " + std::to_string(e));
    }
    out.push_back(e);
    columns.push_back(w[2 + i]);
  }
  for (int i = 0; i < N; ++i) columns.push_back(x[2 + i]);
  const DType dtype = PromoteTypes(c.in(0).dtype, c.in(1).dtype);
  MEMEST_RETURN_IF_ERROR(CheckedBytes(columns, dtype, c.field + ": its columns").status());
  return std::vector<OutputSpec>{{out, dtype}};
}

// The convolution's geometry as aten hands it to its CPU kernels (1-D viewed as 2-D). `a` are
// its attributes, validated when the outputs were inferred.
CpuConvProblem CpuProblem(const OpCall& c, const ConvAttrs& a) {
  const Shape& x = c.in(0).shape;
  const Shape& w = c.in(1).shape;
  const Shape& y = c.out(0).shape;
  const int n = static_cast<int>(x.size()) - 2;
  const std::vector<int64_t>& stride = a.stride;
  const std::vector<int64_t>& pad = a.padding;
  const std::vector<int64_t>& dil = a.dilation;
  const bool two_d = n == 2;
  CpuConvProblem p;
  p.transposed = Transposed(c);
  p.n = x[0];
  p.ci = x[1];
  p.co = y[1];
  const StatusOr<int64_t> groups = IntAttr(c.op.attrs, "groups", 1, c.field);  // validated
  p.groups = !p.transposed ? x[1] / w[1] : groups.ok() ? *groups : 1;
  p.h = two_d ? x[2] : 1;
  p.w = x[n + 1];
  p.kh = two_d ? w[2] : 1;
  p.kw = w[n + 1];
  p.oh = two_d ? y[2] : 1;
  p.ow = y[n + 1];
  p.stride_h = two_d ? stride[0] : 1;
  p.stride_w = stride[n - 1];
  p.pad_h = two_d ? pad[0] : 0;
  p.pad_w = pad[n - 1];
  p.dil_h = two_d ? dil[0] : 1;
  p.dil_w = dil[n - 1];
  p.element_bytes = DTypeSize(c.in(0).dtype);
  p.bias = c.inputs.size() == 3;
  p.input_grad = c.needs_grad(0);
  p.weight_grad = c.needs_grad(1) || (p.bias && c.needs_grad(2));
  p.channels_last = ChannelsLastConv(c);
  if (c.cpu_l1_bytes > 0) p.l1_bytes = c.cpu_l1_bytes;
  if (c.cpu_l2_bytes > 0) p.l2_bytes = c.cpu_l2_bytes;
  return p;
}

// PyTorch 1.13's CPU convolutions allocate scratch inside the op (cpu_conv.h). The engine
// allocates an op's outputs (forward) or fresh gradients (backward) before its temporaries, so
// each is one temporary: the op's own high-water mark above what it returns.
void CpuConvScratch(const OpCall& c, OpMemory* m) {
  const DType dt = c.in(0).dtype;
  if (dt != DType::kFloat32 && dt != DType::kFloat64) return;  // not measured (see the note)
  const StatusOr<ConvAttrs> attrs = ReadConvAttrs(c, static_cast<int>(c.in(0).shape.size()) - 2);
  if (!attrs.ok()) return;  // unreachable: InferConv refused the op already
  const CpuConvProblem p = CpuProblem(c, *attrs);
  const CpuConvTrace t = CpuConvAllocations(p, c.cpu_isa);
  const int64_t fwd = PeakOfEvents(t.forward).peak - BytesOf(c.out(0));
  if (fwd > 0) m->forward_temps.push_back(Alloc{fwd, t.scratch});
  if (!p.input_grad && !p.weight_grad) return;
  int64_t fresh = 0;  // the gradients the engine allocates for this backward
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (c.needs_grad(i)) fresh += BytesOf(c.in(i));
  }
  const int64_t bwd = PeakOfEvents(t.backward).peak - fresh;
  if (bwd > 0) m->backward_temps.push_back(Alloc{bwd, t.scratch});
}

// A channels-last convolution (PyTorch 2.x's cuDNN path, aten/src/ATen/native/cudnn/
// ConvShared.cpp, as 1.13's mkldnn one, cpu_conv_nhwc.cc): the weight is made channels-last for
// the forward and again for the input's gradient (weight->contiguous(memory_format), a copy
// unless it is channels-last already: 1x1, or one input channel per group); grad_output is made
// channels-last; the input's and the weight's gradients are channels-last, and AccumulateGrad
// copies the weight's into the weight's own layout. On the CPU runtime the copies are part of
// the measured scratch (CpuConvScratch).
void ChannelsLastMemory(const OpCall& c, bool any_grad, OpMemory* m) {
  const Tensor& w = c.in(1);
  const Strides cl = ChannelsLastStrides(w.shape);
  bool weight_copied = false;  // weight.is_contiguous(channels_last) fails: dims above 1 differ
  for (size_t d = 0; d < 4 && d < w.strides.size(); ++d) {
    weight_copied = weight_copied || (w.shape[d] > 1 && w.strides[d] != cl[d]);
  }
  m->backward_grad_strides = ChannelsLastStrides(c.out(0).shape);
  m->fresh_grad_strides.resize(c.inputs.size());
  m->fresh_grad_strides[0] = ChannelsLastStrides(c.in(0).shape);
  if (weight_copied) m->fresh_grad_strides[1] = ChannelsLastStrides(w.shape);
  if (c.runtime != Runtime::kCuda || !weight_copied) return;
  m->forward_temps.push_back(Alloc{BytesOf(w), "channels-last weight copy"});
  if (any_grad && c.needs_grad(0)) {
    m->backward_temps.push_back(Alloc{BytesOf(w), "channels-last weight copy"});
  }
}

// One formula serves input, weight and bias (convolution_backward), so both input and weight
// are kept whenever any gradient is needed. Every backward kernel reads grad_output contiguous
// in the input's memory format (row-major here): cuDNN (ConvShared.cpp), oneDNN
// (mkldnn/Conv.cpp) and the native im2col path each copy one that is not.
void ConvMemory(const OpCall& c, OpMemory* m) {
  const bool any = c.needs_grad(0) || c.needs_grad(1) || (c.inputs.size() == 3 && c.needs_grad(2));
  SaveInputIf(m, any, 0);
  SaveInputIf(m, any, 1);
  m->backward_needs_contiguous_grad = any;
  if (ChannelsLastConv(c)) ChannelsLastMemory(c, any, m);
  if (c.runtime == Runtime::kCpuTorch113) CpuConvScratch(c, m);
}

struct PoolGeometry {
  std::vector<int64_t> kernel, stride, padding, dilation;
  bool ceil_mode = false;
};

StatusOr<PoolGeometry> ReadPool(const OpCall& c) {
  if (!HasAttr(c.op.attrs, "kernel_size")) {
    return InvalidArgument(AttrField(c, "kernel_size") + ": required");
  }
  PoolGeometry g;
  MEMEST_ASSIGN_OR_RETURN(g.kernel, SpatialAttr(c, "kernel_size", 2, 1, 1));
  MEMEST_ASSIGN_OR_RETURN(g.stride, SpatialAttr(c, "stride", 2, 0, 0));
  for (int i = 0; i < 2; ++i) {
    if (g.stride[i] == 0) g.stride[i] = g.kernel[i];
  }
  MEMEST_ASSIGN_OR_RETURN(g.padding, SpatialAttr(c, "padding", 2, 0, 0));
  MEMEST_ASSIGN_OR_RETURN(g.dilation, SpatialAttr(c, "dilation", 2, 1, 1));
  MEMEST_ASSIGN_OR_RETURN(int64_t ceil, IntAttr(c.op.attrs, "ceil_mode", 0, c.field));
  g.ceil_mode = ceil != 0;
  return g;
}

// pooling_output_shape (aten/src/ATen/native/Pool.h): with ceil_mode the last window may start
// past the padded end by less than a stride, as long as it starts inside the input or the
// left padding.
StatusOr<Shape> PoolOut(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 3, 4));
  MEMEST_ASSIGN_OR_RETURN(PoolGeometry g, ReadPool(c));
  Shape out = c.in(0).shape;
  const size_t h = out.size() - 2;
  for (int i = 0; i < 2; ++i) {
    const int64_t in = out[h + i];
    MEMEST_ASSIGN_OR_RETURN(int64_t e, OutExtent(c, in, g.kernel[i], g.stride[i], g.padding[i],
                                                 g.dilation[i]));
    if (g.ceil_mode) {
      const int64_t span = g.dilation[i] * (g.kernel[i] - 1) + 1;  // OutExtent checked it
      if ((in + 2 * g.padding[i] - span) % g.stride[i] != 0) ++e;
      if ((e - 1) * g.stride[i] >= in + g.padding[i]) --e;
    }
    out[h + i] = e;
  }
  return out;
}

StatusOr<std::vector<OutputSpec>> InferMaxPool(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_ASSIGN_OR_RETURN(Shape out, PoolOut(c));
  return std::vector<OutputSpec>{{out, c.in(0).dtype},
                                 {out, DType::kInt64, {}, -1, /*differentiable=*/false}};
}

void MaxPoolMemory(const OpCall& c, OpMemory* m) {
  if (!c.needs_grad(0)) return;
  m->backward_needs_dense_grad = true;
  m->saved_inputs.push_back(0);
  m->saved_outputs.push_back(1);  // indices
}

StatusOr<std::vector<OutputSpec>> InferAvgPool(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_ASSIGN_OR_RETURN(Shape out, PoolOut(c));
  return std::vector<OutputSpec>{{out, c.in(0).dtype}};
}

void SaveInputMemory(const OpCall& c, OpMemory* m) { SaveInputIf(m, c.needs_grad(0), 0); }

// adaptive_avg_pool2d to 1x1 is mean(dim=(-2, -1), keepdim=True) in PyTorch 2.x, which keeps only
// sizes; other sizes run _adaptive_avg_pool2d, which keeps its input.
void AdaptiveAvgPoolMemory(const OpCall& c, OpMemory* m) {
  const Shape& out = c.out(0).shape;
  const bool global = out[out.size() - 1] == 1 && out[out.size() - 2] == 1;
  if (global && c.runtime == Runtime::kCuda) return;  // 1.13's mean.dim kept the input
  SaveInputIf(m, c.needs_grad(0), 0);
}

StatusOr<std::vector<OutputSpec>> InferAdaptiveAvgPool(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 3, 4));
  MEMEST_ASSIGN_OR_RETURN(auto size, SpatialAttr(c, "output_size", 2, 1, 1));
  Shape out = c.in(0).shape;
  out[out.size() - 2] = size[0];
  out[out.size() - 1] = size[1];
  return std::vector<OutputSpec>{{out, c.in(0).dtype}};
}

// upsample_nearest2d / upsample_bilinear2d keep only sizes (derivatives.yaml: the backward reads
// grad, output_size, the input's sizes and the scales). PyTorch 1.13's CPU kernels
// (UpSampleKernel.cpp, compute_indices_weights) build, per spatial dim, an int64 source index
// and a weight in the input's dtype per output position (nearest), or two of each (linear),
// all live until the kernel returns (measured).
StatusOr<std::vector<OutputSpec>> InferUpsample(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 4, 4));
  if (!HasAttr(c.op.attrs, "output_size")) {
    return InvalidArgument(AttrField(c, "output_size") + ": required");
  }
  MEMEST_ASSIGN_OR_RETURN(std::vector<int64_t> size, SpatialAttr(c, "output_size", 2, 1, 1));
  MEMEST_RETURN_IF_ERROR(IntAttr(c.op.attrs, "align_corners", 0, c.field).status());
  Shape out = c.in(0).shape;
  out[2] = size[0];
  out[3] = size[1];
  return std::vector<OutputSpec>{{out, c.in(0).dtype, DenseStridesLike(c.in(0), out)}};
}

void UpsampleMemory(const OpCall& c, OpMemory* m) {
  if (c.runtime != Runtime::kCpuTorch113) return;
  const int64_t tables = c.op.kind == "upsample_bilinear2d" ? 2 : 1;
  const Shape& y = c.out(0).shape;
  const int64_t per_position = 8 + DTypeSize(c.in(0).dtype);  // int64 index + weight
  m->forward_temps.push_back(
      Alloc{tables * per_position * (y[2] + y[3]), "interpolation indices and weights (CPU)"});
}

}  // namespace

void RegisterConvRules(std::vector<OpRule>* r) {
  r->push_back({"conv1d", 2, 3, InferConv<1>, ConvMemory});
  r->push_back({"conv2d", 2, 3, InferConv<2>, ConvMemory});
  r->push_back({"conv_transpose1d", 2, 3, InferConvTranspose<1>, ConvMemory});
  r->push_back({"conv_transpose2d", 2, 3, InferConvTranspose<2>, ConvMemory});
  r->push_back({"upsample_nearest2d", 1, 1, InferUpsample, UpsampleMemory});
  r->push_back({"upsample_bilinear2d", 1, 1, InferUpsample, UpsampleMemory});
  r->push_back({"max_pool2d", 1, 1, InferMaxPool, MaxPoolMemory});
  r->push_back({"avg_pool2d", 1, 1, InferAvgPool, SaveInputMemory});
  r->push_back({"adaptive_avg_pool2d", 1, 1, InferAdaptiveAvgPool, AdaptiveAvgPoolMemory});
}

}  // namespace rules
}  // namespace memest
