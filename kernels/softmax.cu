// Row softmax, one block per row, float accumulation: the max, the sum of exp(x - max), then
// the scaled exponentials (three passes over the row; the later ones mostly hit in L2).
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/benchmarks.h"
#include "kernels/cuda_status.h"
#include "kernels/dtype_cuda.cuh"
#include "kernels/pattern.h"
#include "kernels/row_bench.cuh"

namespace memest::kernels {

namespace {

// Rows beyond the grid's 2^31 - 1 blocks wrap around (never in practice); the loop is uniform
// over a block, as BlockReduce needs.
template <typename T>
__global__ void SoftmaxKernel(const T* in, T* out, int64_t rows, int64_t cols) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = in + row * cols;
    T* y = out + row * cols;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, ToFloat(x[j]));
    m = BlockReduce(m, MaxOp{}, -INFINITY);
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += expf(ToFloat(x[j]) - m);
    s = BlockReduce(s, SumOp{}, 0.0f);
    const float inv = 1.0f / s;
    // In place is safe: every read of the row happened before the last BlockReduce, and each
    // thread reads x[j] before it writes y[j].
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      y[j] = FromFloat<T>(expf(ToFloat(x[j]) - m) * inv);
    }
  }
}

// expf is accurate to a couple of ulps; the float sum over a row adds a little more.
Tolerance SoftmaxTolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return {1e-7, 2e-3, 0};  // float16 subnormals step by 6e-8
    case DType::kBFloat16: return {1e-9, 1.6e-2, 0};
    default: return {1e-9, 5e-5, 0};
  }
}

Status CheckSoftmax(const KernelContext& ctx, const Work& work, int seed) {
  const int64_t cols = work.cols;
  const int count = static_cast<int>(std::clamp<int64_t>(4'000'000 / cols, 2, 8));
  const Tolerance tol = SoftmaxTolerance(work.dtype);
  // The exponentials are recomputed per column rather than stored beside the row: a row of a
  // few billion columns (a softmax over a whole flattened tensor) must not need host arrays.
  for (int64_t row : SampleIndices(work.rows, count)) {
    double m = -INFINITY;
    for (int64_t j = 0; j < cols; ++j) m = std::max<double>(m, PatternValue(seed, row * cols + j));
    double sum = 0;
    for (int64_t j = 0; j < cols; ++j) sum += std::exp(PatternValue(seed, row * cols + j) - m);
    MEMEST_RETURN_IF_ERROR(ExpectRow(ctx, work, row, tol, [&](int64_t j) {
      return std::exp(PatternValue(seed, row * cols + j) - m) / sum;
    }));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<Timing> RunSoftmax(const KernelContext& ctx, const Work& work, int repeats) {
  return RunRowBench(
      ctx, work, repeats, "softmax",
      [&](auto tag, auto* in, auto* out, int blocks, int threads) {
        using T = typename decltype(tag)::type;
        SoftmaxKernel<T><<<blocks, threads, 0, ctx.stream>>>(in, out, work.rows, work.cols);
        return LastLaunchError("SoftmaxKernel");
      },
      [&](int seed) { return CheckSoftmax(ctx, work, seed); });
}

}  // namespace memest::kernels
