#include "engine/ir/shape.h"

#include <algorithm>

namespace memest {

StatusOr<int64_t> PinnedHostBytes(int64_t bytes) {
  int64_t pinned = 1;
  while (pinned < bytes) {
    MEMEST_ASSIGN_OR_RETURN(pinned, CheckedMul(pinned, 2));
  }
  return bytes <= 0 ? 0 : pinned;
}

StatusOr<int64_t> CheckedMul(int64_t a, int64_t b) {
  if (a < 0 || b < 0) return InvalidArgument("negative size in product");
  if (a == 0 || b == 0) return int64_t{0};
  if (a > kMaxBytes / b) {
    return InvalidArgument("byte count overflows 64 bits (" + std::to_string(a) + " x " +
                           std::to_string(b) + ")");
  }
  return a * b;
}

StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b) {
  if (!AddBytes(&a, b)) return InvalidArgument("byte count exceeds 2^62 bytes");
  return a;
}

namespace {

// The element count of `shape`, or -1 when a size is negative (*bad_dim names it) or the
// product of its sizes, a 0 counted as 1, passes kMaxBytes: an empty tensor's strides
// (ContiguousStrides) are that product, and must not wrap either.
int64_t NumelOrMinusOne(const Shape& shape, size_t* bad_dim) {
  int64_t span = 1;
  bool empty = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      *bad_dim = i;
      return -1;
    }
    empty |= shape[i] == 0;
    const int64_t d = std::max<int64_t>(shape[i], 1);
    if (span > kMaxBytes / d) return -1;
    span *= d;
  }
  return empty ? 0 : span;
}

Status NegativeSize(const Shape& shape, size_t dim, const std::string& field) {
  return InvalidArgument(field + "[" + std::to_string(dim) + "]: must be non-negative, got " +
                         std::to_string(shape[dim]));
}

Status TooManyDims(const Shape& shape, const std::string& field) {
  return InvalidArgument(field + ": has " + std::to_string(shape.size()) + " dims, more than " +
                         std::to_string(kMaxRank));
}

}  // namespace

StatusOr<int64_t> CheckedNumel(const Shape& shape, const std::string& field) {
  if (shape.size() > kMaxRank) return TooManyDims(shape, field);
  size_t bad_dim = shape.size();
  const int64_t n = NumelOrMinusOne(shape, &bad_dim);
  if (bad_dim < shape.size()) return NegativeSize(shape, bad_dim, field);
  if (n < 0) {
    return InvalidArgument(field + ": shape " + ShapeToString(shape) +
                           ": its sizes multiply to more than 2^62");
  }
  return n;
}

StatusOr<int64_t> CheckedBytes(const Shape& shape, DType dtype, const std::string& field) {
  if (shape.size() > kMaxRank) return TooManyDims(shape, field);
  size_t bad_dim = shape.size();
  const int64_t n = NumelOrMinusOne(shape, &bad_dim);
  if (bad_dim < shape.size()) return NegativeSize(shape, bad_dim, field);
  if (n < 0 || n > kMaxTensorBytes / DTypeSize(dtype)) {
    return InvalidArgument(field + ": a tensor of shape " + ShapeToString(shape) + " of " +
                           std::string(DTypeName(dtype)) +
                           " would hold more than 2^56 bytes (64 PiB), the largest tensor "
                           "memest represents");
  }
  return n * DTypeSize(dtype);
}

Strides ContiguousStrides(const Shape& shape) {
  Strides s(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    s[i] = s[i + 1] * std::max<int64_t>(shape[i + 1], 1);
  }
  return s;
}

bool IsContiguous(const Shape& shape, const Strides& strides) {
  int64_t expected = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    if (shape[i] == 1) continue;
    if (shape[i] == 0) return true;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

// Mirrors at::detail::computeStride: walks the old dims in chunks that are contiguous with
// each other and checks that the new dims tile each chunk exactly.
bool ComputeViewStrides(const Shape& old_shape, const Strides& old_strides,
                        const Shape& new_shape, Strides* out) {
  out->assign(new_shape.size(), 1);
  if (old_shape.empty()) {
    return true;
  }
  if (Numel(old_shape) == 0) {
    *out = ContiguousStrides(new_shape);
    return true;
  }
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(old_shape.size()) - 1; tensor_d >= 0;
       --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    if (tensor_d == 0 ||
        (old_shape[tensor_d - 1] != 1 &&
         old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        (*out)[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b) {
  size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) {
      return InvalidArgument("shapes " + ShapeToString(a) + " and " + ShapeToString(b) +
                             " do not broadcast (dim " + std::to_string(i) + ": " +
                             std::to_string(da) + " vs " + std::to_string(db) + ")");
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

StatusOr<int> NormalizeDim(int64_t dim, int rank, const std::string& field) {
  int64_t r = rank == 0 ? 1 : rank;
  if (dim < -r || dim >= r) {
    return InvalidArgument(field + ": dim " + std::to_string(dim) +
                           " is out of range for a tensor of rank " + std::to_string(rank));
  }
  return static_cast<int>(dim < 0 ? dim + r : dim);
}

std::string ShapeToString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace memest
