// Rules for torchvision's detection ops: nms and roi_align (torchvision/csrc/ops).
//
// nms(boxes[N, 4], scores[N]; iou_threshold, count) -> int64 [count], the kept boxes' indices in
// decreasing score; count is the data's, carried by the traced graph. Not differentiable.
//   CPU (cpu/nms_kernel.cpp): x1, y1, x2, y2 as contiguous copies of the box columns, areas =
//   (x2 - x1) * (y2 - y1), order = scores.sort(stable, descending) (its values, its indices and
//   sort's arange of positions live together), then suppressed [N] uint8 and keep [N] int64;
//   the result is keep.narrow(0, 0, count): a view of the [N] int64 storage. Measured on 1.13
//   (torchvision 0.14): the high-water mark is the sort, 40 N bytes for float32 boxes, 8 N of
//   them the storage the result keeps.
//   CUDA (cuda/nms_kernel.cu): order = scores.sort(...) indices (8 N; the sorted values are
//   freed when the statement ends), dets_sorted = boxes.index_select(0, order) (N boxes),
//   mask int64 [N * ceil(N / 64)], the kept indices copied back to the device (8 count), and
//   the result order.index(keep) (8 count).
//
// roi_align(x[N, C, H, W], rois[K, 5]; output_size, spatial_scale, sampling_ratio, aligned)
//   -> [K, C, ph, pw]. torchvision's autograd (autograd/roi_align_kernel.cpp) keeps rois and
//   x's sizes; the backward kernel makes zeros of x's shape and adds into them (the gradient).
//   The CPU and CUDA forward kernels allocate only the output (measured on 1.13's CPU).
#include <algorithm>

#include "engine/rules/internal.h"

namespace memest {
namespace rules {
namespace {

StatusOr<std::vector<OutputSpec>> InferNms(const OpCall& c) {
  const Shape& boxes = c.in(0).shape;
  if (boxes.size() != 2 || boxes[1] != 4 || !IsFloating(c.in(0).dtype)) {
    return InvalidArgument(InputField(c, 0) + ": nms takes floating boxes [N, 4], got " +
                           ShapeToString(boxes));
  }
  if (c.in(1).shape != Shape{boxes[0]}) {
    return InvalidArgument(InputField(c, 1) + ": scores must be [" + std::to_string(boxes[0]) +
                           "], got " + ShapeToString(c.in(1).shape));
  }
  MEMEST_RETURN_IF_ERROR(FloatAttr(c.op.attrs, "iou_threshold", 0.5, c.field).status());
  MEMEST_ASSIGN_OR_RETURN(int64_t count, IntAttr(c.op.attrs, "count", -1, c.field));
  if (count < 0 || count > boxes[0]) {
    return InvalidArgument(AttrField(c, "count") + ": the boxes kept, in [0, " +
                           std::to_string(boxes[0]) + "], got " + std::to_string(count));
  }
  // CUDA's suppression mask, N * ceil(N / 64) int64: refused when it passes the byte bound.
  const int64_t n = boxes[0];
  StatusOr<int64_t> mask = CheckedMul(n, (n + 63) / 64);
  if (!mask.ok() || !CheckedMul(*mask, 8).ok()) {
    return InvalidArgument(InputField(c, 0) + ": nms of " + std::to_string(n) +
                           " boxes needs a suppression mask past 2^62 bytes");
  }
  return std::vector<OutputSpec>{{{count}, DType::kInt64, {}, -1, false}};
}

void NmsMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow = {GradFlow::kNone, GradFlow::kNone};
  const int64_t n = c.in(0).shape[0];
  const int64_t e = DTypeSize(c.in(0).dtype);
  const int64_t count = c.out(0).shape.empty() ? 0 : c.out(0).shape[0];
  if (c.runtime == Runtime::kCpuTorch113) {
    // The result views an [N] int64 storage; beside it, the high-water mark of the rest: the
    // sort (4 columns, areas and sorted scores, e each; order and positions, int64) or the
    // suppression loop (columns, areas, order, suppressed and keep itself).
    m->output_storage_bytes = {8 * n};
    const int64_t at_sort = 6 * n * e + 16 * n, at_loop = 5 * n * e + 17 * n;
    m->forward_temps.push_back(
        Alloc{std::max(at_sort, at_loop) - 8 * n, "nms: box columns, areas, sort"});
    return;
  }
  const int64_t mask = n * ((n + 63) / 64) * 8;  // checked in InferNms
  m->forward_temps.push_back(
      Alloc{n * 8 + 4 * n * e + mask + count * 8, "nms: order, sorted boxes, mask, kept"});
}

StatusOr<std::vector<OutputSpec>> InferRoiAlign(const OpCall& c) {
  MEMEST_RETURN_IF_ERROR(RequireRank(c, 0, 4, 4));
  MEMEST_RETURN_IF_ERROR(RequireFloating(c, 0));
  const Shape& rois = c.in(1).shape;
  if (rois.size() != 2 || rois[1] != 5) {
    return InvalidArgument(InputField(c, 1) + ": rois must be [K, 5] (batch index, x1, y1, x2, " +
                           "y2), got " + ShapeToString(rois));
  }
  MEMEST_ASSIGN_OR_RETURN(std::vector<int64_t> size, IntsAttr(c.op.attrs, "output_size", {}, c.field));
  if (size.size() != 2 || size[0] <= 0 || size[1] <= 0) {
    return InvalidArgument(AttrField(c, "output_size") + ": two positive sizes, got " +
                           ShapeToString(size));
  }
  MEMEST_RETURN_IF_ERROR(FloatAttr(c.op.attrs, "spatial_scale", 1.0, c.field).status());
  MEMEST_RETURN_IF_ERROR(IntAttr(c.op.attrs, "sampling_ratio", -1, c.field).status());
  MEMEST_RETURN_IF_ERROR(IntAttr(c.op.attrs, "aligned", 0, c.field).status());
  const Shape& x = c.in(0).shape;
  return std::vector<OutputSpec>{{{rois[0], x[1], size[0], size[1]}, c.in(0).dtype}};
}

void RoiAlignMemory(const OpCall& c, OpMemory* m) {
  m->grad_flow = {GradFlow::kFresh, GradFlow::kNone};
  if (c.needs_grad(0)) m->saved_inputs.push_back(1);
}

}  // namespace

void RegisterDetectionRules(std::vector<OpRule>* r) {
  r->push_back({"nms", 2, 2, InferNms, NmsMemory});
  r->push_back({"roi_align", 2, 2, InferRoiAlign, RoiAlignMemory});
}

}  // namespace rules
}  // namespace memest
