// Shapes, strides and checked byte arithmetic.
//
// A Shape is a list of non-negative sizes (PyTorch's `size()`); strides are in elements, as
// PyTorch's `stride()`. Every byte count in memest is computed through the checked helpers
// here, so a shape whose byte count exceeds kMaxBytes (2^62) is an error, never a wrapped value.
#ifndef MEMEST_ENGINE_SHAPE_H_
#define MEMEST_ENGINE_SHAPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/dtype.h"
#include "engine/status.h"

namespace memest {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

// The largest byte count memest represents: 2^62. Anything larger is refused as an overflow.
inline constexpr int64_t kMaxBytes = int64_t{1} << 62;

// a * b, or an error if the product exceeds kMaxBytes.
StatusOr<int64_t> CheckedMul(int64_t a, int64_t b);
// a + b, or an error if the sum exceeds kMaxBytes.
StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b);

// Number of elements; an error (naming `field`) if a size is negative or the count overflows.
StatusOr<int64_t> CheckedNumel(const Shape& shape, const std::string& field);
// Bytes of a dense tensor of this shape and dtype, checked as above.
StatusOr<int64_t> CheckedBytes(const Shape& shape, DType dtype, const std::string& field);

// Unchecked variants for shapes that were validated when they entered the graph.
int64_t Numel(const Shape& shape);
int64_t Bytes(const Shape& shape, DType dtype);

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

#endif  // MEMEST_ENGINE_SHAPE_H_
