// Row layer norm without affine parameters, one block per row, float accumulation. Two passes
// for the statistics (mean, then the mean squared deviation) rather than one pass of sums of
// squares, which cancels badly when the mean is large against the spread.
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

constexpr float kEps = 1e-5f;  // torch.nn.LayerNorm's default

template <typename T>
__global__ void LayerNormKernel(const T* in, T* out, int64_t rows, int64_t cols) {
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = in + row * cols;
    T* y = out + row * cols;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += ToFloat(x[j]);
    const float mean = BlockReduce(s, SumOp{}, 0.0f) * inv_cols;
    float v = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float d = ToFloat(x[j]) - mean;
      v += d * d;
    }
    const float rstd = rsqrtf(BlockReduce(v, SumOp{}, 0.0f) * inv_cols + kEps);
    // In place is safe, as in softmax.cu.
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      y[j] = FromFloat<T>((ToFloat(x[j]) - mean) * rstd);
    }
  }
}

// Outputs are O(1); float statistics and rsqrtf cost a few ulps.
Tolerance LayerNormTolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return {1e-4, 2e-3, 0};
    case DType::kBFloat16: return {1e-3, 1.6e-2, 0};
    default: return {1e-5, 1e-5, 0};
  }
}

Status CheckLayerNorm(const KernelContext& ctx, const Work& work, int seed) {
  const int64_t cols = work.cols;
  const int count = static_cast<int>(std::clamp<int64_t>(4'000'000 / cols, 2, 8));
  const Tolerance tol = LayerNormTolerance(work.dtype);
  for (int64_t row : SampleIndices(work.rows, count)) {
    double mean = 0;
    for (int64_t j = 0; j < cols; ++j) mean += PatternValue(seed, row * cols + j);
    mean /= static_cast<double>(cols);
    double var = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const double d = PatternValue(seed, row * cols + j) - mean;
      var += d * d;
    }
    const double rstd = 1.0 / std::sqrt(var / static_cast<double>(cols) + kEps);
    MEMEST_RETURN_IF_ERROR(ExpectRow(ctx, work, row, tol, [&](int64_t j) {
      return (PatternValue(seed, row * cols + j) - mean) * rstd;
    }));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<Timing> RunLayerNorm(const KernelContext& ctx, const Work& work, int repeats) {
  return RunRowBench(
      ctx, work, repeats, "layer_norm",
      [&](auto tag, auto* in, auto* out, int blocks, int threads) {
        using T = typename decltype(tag)::type;
        LayerNormKernel<T><<<blocks, threads, 0, ctx.stream>>>(in, out, work.rows, work.cols);
        return LastLaunchError("LayerNormKernel");
      },
      [&](int seed) { return CheckLayerNorm(ctx, work, seed); });
}

}  // namespace memest::kernels
