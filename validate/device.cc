#include "validate/device.h"

namespace memest::validate {

const char* WorkKindName(WorkKind kind) {
  switch (kind) {
    case WorkKind::kGemm: return "gemm";
    case WorkKind::kConvForward: return "conv_forward";
    case WorkKind::kConvBackwardData: return "conv_backward_data";
    case WorkKind::kConvBackwardFilter: return "conv_backward_filter";
    case WorkKind::kElementwise: return "elementwise";
    case WorkKind::kSoftmax: return "softmax";
    case WorkKind::kLayerNorm: return "layer_norm";
    case WorkKind::kReduce: return "reduce";
  }
  return "unknown";
}

WorkBytes BytesNeeded(const Work& w) {
  const int64_t e = DTypeSize(w.dtype);
  WorkBytes b;
  const ConvShape& c = w.conv;
  const int64_t x = c.n * c.c * c.h * c.w * e;
  const int64_t wt = c.k * (c.groups > 0 ? c.c / c.groups : 0) * c.r * c.s * e;
  const int64_t y = c.n * c.k * c.out_h() * c.out_w() * e;
  switch (w.kind) {
    case WorkKind::kGemm:
      b.inputs = {w.gemm.batch * w.gemm.m * w.gemm.k * e, w.gemm.batch * w.gemm.k * w.gemm.n * e};
      b.output = w.gemm.batch * w.gemm.m * w.gemm.n * e;
      break;
    case WorkKind::kConvForward: b.inputs = {x, wt}; b.output = y; break;
    case WorkKind::kConvBackwardData: b.inputs = {y, wt}; b.output = x; break;
    case WorkKind::kConvBackwardFilter: b.inputs = {x, y}; b.output = wt; break;
    case WorkKind::kElementwise:
      b.inputs.assign(w.inputs.empty() ? 1 : w.inputs.size(), w.elements * e);
      b.output = w.elements * e;
      break;
    case WorkKind::kSoftmax:
    case WorkKind::kLayerNorm:
      b.inputs = {w.rows * w.cols * e};
      b.output = w.rows * w.cols * e;
      break;
    case WorkKind::kReduce:
      b.inputs = {w.rows * w.cols * e};
      b.output = w.rows * e;
      break;
  }
  return b;
}

}  // namespace memest::validate
