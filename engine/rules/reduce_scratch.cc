// Reduce.cuh's launch configuration for a sum over the rows of [N, C], as PyTorch 2.11.0 sets it
// (setReduceConfig, ReduceConfig::set_block_dimension, global_memory_size, semaphore_size).
//
// TensorIterator puts the reduced dim first: the inputs are N, the outputs C, and the reduction
// is not along the fastest-moving dim, so each thread works on `vec` adjacent outputs (4, halved
// until it divides C) and blocks do not reduce along x. The block is at most
// max_reduce_threads (512) / vec threads: `width` outputs (at most a warp) by `height` rows.
// Rows are split across the block's warps once each thread would see at least min(16 height, 256)
// of them; then, if each thread would still see at least 256 and the grid's output blocks do not
// already fill the GPU (multiprocessors * max threads per multiprocessor / block threads), the
// rows are split across `ctas` blocks per output, which need a staging buffer of
// acc_size * C * ctas * width * vec bytes and 4 bytes of semaphore per output block.
#include "engine/rules/reduce_scratch.h"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace memest {
namespace {

constexpr int64_t kWarp = 32;
constexpr int64_t kMaxReduceThreads = 512;  // max_reduce_threads() for every real dtype

int64_t DivUp(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The largest power of two not above n (n >= 1), as Reduce.cuh's last_pow2.
int64_t LastPow2(int64_t n) {
  int64_t p = 1;
  while (p <= n / 2) p *= 2;
  return p;
}

// One kernel's staging and semaphores: x [rows, cols] that 32-bit offsets reach.
ReduceScratch OneKernel(int64_t rows, int64_t cols, int64_t acc_size, const ReduceDevice& d) {
  if (rows <= 1 || cols < 2) return {};  // a copy, or a full reduction (not this layout)
  int64_t vec = 4;
  while (cols % vec != 0) vec /= 2;
  const int64_t dim0 = cols / vec, dim1 = rows;
  const int64_t max_threads = kMaxReduceThreads / vec;
  const int64_t d0 = dim0 < max_threads ? LastPow2(dim0) : max_threads;
  const int64_t d1 = dim1 < max_threads ? LastPow2(dim1) : max_threads;
  int64_t width = std::min(d0, kWarp);
  const int64_t height = std::min(d1, max_threads / width);
  width = std::min(d0, max_threads / height);
  if (rows < std::min<int64_t>(height * 16, 256)) return {};  // rows stay within a thread
  const int64_t per_thread = DivUp(rows, height);
  const int64_t blocks_per_sm = d.max_threads_per_multiprocessor / (width * height);
  const int64_t target = int64_t{d.multiprocessors} * blocks_per_sm;
  const int64_t grid_x = DivUp(cols / vec, width);
  if (per_thread < 256 || grid_x > target) return {};
  const int64_t ctas =
      std::max(std::min(DivUp(target, grid_x), DivUp(per_thread, 16)), DivUp(per_thread, 256));
  if (ctas <= 1) return {};
  return ReduceScratch{acc_size * cols * ctas * width * vec, 4 * grid_x, 0};
}

}  // namespace

ReduceScratch RowSumScratch(int64_t rows, int64_t cols, int64_t elem_size, int64_t acc_size,
                            const ReduceDevice& d) {
  constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
  // can_use_32bit_indexing: the elements and the last element's byte offset within int32. Else
  // split_by_dim halves the dim of the largest offset span, the rows, and each half is summed in
  // turn (the larger half is the ceiling).
  int64_t piece = rows;
  auto fits = [&](int64_t r) {
    return r <= kMax32 / std::max<int64_t>(cols, 1) &&
           (r - 1) * cols * elem_size + (cols - 1) * elem_size < kMax32;
  };
  while (piece > 1 && !fits(piece)) piece -= piece / 2;
  ReduceScratch s = OneKernel(piece, cols, acc_size, d);
  if (piece < rows && elem_size < acc_size) s.accumulator = cols * acc_size;
  return s;
}

int MaxThreadsPerMultiprocessor(int compute_capability) {
  switch (compute_capability) {
    case 75:
      return 1024;
    case 86:
    case 87:
    case 89:
    case 120:
    case 121:
      return 1536;
    default:
      return 2048;
  }
}

}  // namespace memest
