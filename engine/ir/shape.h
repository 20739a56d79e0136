// Shapes, strides and checked byte arithmetic.
//
// A Shape is a list of non-negative sizes (PyTorch's `size()`); strides are in elements, as
// PyTorch's `stride()`. Every byte count in memest is computed through the checked helpers
// here, so a count that cannot be represented is an error, never a wrapped value:
//   - one tensor (a graph tensor, or a rule's scratch of a shape no graph tensor has) holds at
//     most kMaxTensorBytes (2^56 bytes, 64 PiB), checked where it enters the graph;
//   - a total (bytes live at once, a layer's sum, a category, reserved memory) is at most
//     kMaxBytes (2^62 bytes, 4 EiB), checked by AddBytes wherever bytes are summed.
// The gap between the two (2^6) lets a rule scale one tensor's bytes by a small constant (two
// score-sized gradients, three index arrays of int64) without a check of its own.
#ifndef MEMEST_ENGINE_IR_SHAPE_H_
#define MEMEST_ENGINE_IR_SHAPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "engine/ir/dtype.h"
#include "engine/ir/status.h"

namespace memest {

// Sizes or strides, held inline up to five dims (no heap allocation for the tensors of almost
// every model), and converted to and from the integer lists attributes hold.
class Shape : public absl::InlinedVector<int64_t, 5> {
 public:
  using Base = absl::InlinedVector<int64_t, 5>;
  using Base::Base;
  Shape() = default;
  Shape(const std::vector<int64_t>& v) : Base(v.begin(), v.end()) {}  // NOLINT: implicit
  operator std::vector<int64_t>() const { return {begin(), end()}; }  // NOLINT: implicit
};
using Strides = Shape;

// The largest byte count memest represents: 2^62. Anything larger is refused as an overflow.
inline constexpr int64_t kMaxBytes = int64_t{1} << 62;
// The largest tensor memest represents: 2^56 bytes (about 300,000 times an 80 GB GPU).
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 56;
// The most dims a tensor may have (PyTorch's TensorIterator takes 25): rules walk the dims, some
// pairwise, so a request's ranks must stay small.
inline constexpr size_t kMaxRank = 64;

// The one checked sum of byte counts: adds `bytes` (negative to take away) to `*total` and
// returns true, or returns false and leaves `*total` alone when the result would leave
// [-kMaxBytes, kMaxBytes]. Running totals on hot paths use it with a sticky error of their own
// (a Status per addition would cost more than the addition).
[[nodiscard]] inline bool AddBytes(int64_t* total, int64_t bytes) {
  int64_t sum;
  if (__builtin_add_overflow(*total, bytes, &sum) || sum > kMaxBytes || sum < -kMaxBytes) {
    return false;
  }
  *total = sum;
  return true;
}

// ceil(a / b) for a >= 0 and b > 0, without a + b - 1 overflowing.
inline int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }

// a * b, or an error if the product exceeds kMaxBytes.
StatusOr<int64_t> CheckedMul(int64_t a, int64_t b);
// a + b, or an error if the sum leaves [-kMaxBytes, kMaxBytes] (AddBytes, as a StatusOr).
StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b);
// What PyTorch's pinned host allocator (CachingHostAllocator) reserves for `bytes`: the next
// power of two (ATen/core/CachingHostAllocator.h, allocate: c10::llvm::PowerOf2Ceil); 0 for 0.
StatusOr<int64_t> PinnedHostBytes(int64_t bytes);

// Number of elements; an error (naming `field`) if a size is negative, the count overflows or
// the shape has more than kMaxRank dims.
StatusOr<int64_t> CheckedNumel(const Shape& shape, const std::string& field);
// Bytes of a dense tensor of this shape and dtype: an error naming `field` if a size is
// negative, the tensor would hold more than kMaxTensorBytes or it has more than kMaxRank dims.
StatusOr<int64_t> CheckedBytes(const Shape& shape, DType dtype, const std::string& field);

// Unchecked variants for shapes that were validated when they entered the graph (or by a
// rule's infer, for its scratch).
inline int64_t Numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
inline int64_t Bytes(const Shape& shape, DType dtype) { return Numel(shape) * DTypeSize(dtype); }

// Row-major (contiguous) strides for a shape.
Strides ContiguousStrides(const Shape& shape);
// True if `strides` are the row-major strides of `shape` (size-1 dims are ignored, as in
// PyTorch's is_contiguous).
bool IsContiguous(const Shape& shape, const Strides& strides);
// Strides for viewing a tensor of (old_shape, old_strides) as new_shape without a copy, as
// PyTorch's `view` computes them (at::detail::computeStride). Returns false, when no view is
// possible (reshape then copies).
bool ComputeViewStrides(const Shape& old_shape, const Strides& old_strides,
                        const Shape& new_shape, Strides* out);

// Broadcasts two shapes as PyTorch does (right-aligned, size 1 stretches), or an error.
StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b);

// Normalizes a possibly negative dim index against rank, or an error naming `field`.
StatusOr<int> NormalizeDim(int64_t dim, int rank, const std::string& field);

// "[8, 1024, 768]".
std::string ShapeToString(const Shape& shape);

}  // namespace memest

#endif  // MEMEST_ENGINE_IR_SHAPE_H_
