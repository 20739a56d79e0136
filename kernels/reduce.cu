// Row sum, one block per row, float accumulation, output in the input dtype.
#include <algorithm>
#include <string>

#include "kernels/benchmarks.h"
#include "kernels/cuda_status.h"
#include "kernels/dtype_cuda.cuh"
#include "kernels/pattern.h"
#include "kernels/row_bench.cuh"

namespace memest::kernels {

namespace {

template <typename T>
__global__ void RowSumKernel(const T* in, T* out, int64_t rows, int64_t cols) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = in + row * cols;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += ToFloat(x[j]);
    s = BlockReduce(s, SumOp{}, 0.0f);
    if (threadIdx.x == 0) out[row] = FromFloat<T>(s);
  }
}

// Sums of pattern values are exact in float (pattern.h); only the output rounding remains,
// the same on both sides.
Tolerance ReduceTolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return {1e-6, 1e-3, 0};
    case DType::kBFloat16: return {1e-6, 8e-3, 0};
    default: return {1e-6, 1e-6, 0};
  }
}

Status CheckReduce(const KernelContext& ctx, const Work& work, int seed) {
  const int64_t cols = work.cols;
  const int count = static_cast<int>(std::clamp<int64_t>(20'000'000 / cols, 4, 64));
  const Tolerance tol = ReduceTolerance(work.dtype);
  for (int64_t row : SampleIndices(work.rows, count)) {
    double want = 0;
    for (int64_t j = 0; j < cols; ++j) want += PatternValue(seed, row * cols + j);
    MEMEST_ASSIGN_OR_RETURN(std::vector<double> got,
                            ReadBack(ctx, work.output, work.dtype, row, 1));
    MEMEST_RETURN_IF_ERROR(ExpectNear("output[" + std::to_string(row) + "]", got[0],
                                      RoundTo(work.dtype, want), 0, tol));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<Timing> RunReduce(const KernelContext& ctx, const Work& work, int repeats) {
  return RunRowBench(
      ctx, work, repeats, "reduce",
      [&](auto tag, auto* in, auto* out, int blocks, int threads) {
        using T = typename decltype(tag)::type;
        RowSumKernel<T><<<blocks, threads, 0, ctx.stream>>>(in, out, work.rows, work.cols);
        return LastLaunchError("RowSumKernel");
      },
      [&](int seed) { return CheckReduce(ctx, work, seed); });
}

}  // namespace memest::kernels
