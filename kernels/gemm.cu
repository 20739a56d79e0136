// GEMM through cuBLAS, as torch.matmul / torch.bmm run it.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/benchmarks.h"
#include "kernels/cuda_status.h"
#include "kernels/pattern.h"

namespace memest::kernels {

using validate::GemmShape;

namespace {

cudaDataType_t CudaDataType(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kBFloat16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

// Sums of pattern products are exact in float (pattern.h), so float32 is held to float
// rounding. A half output rounds once at the end (rtol: two units in the last place), and
// cuBLAS may by default add split-K partial sums up in the output type (what PyTorch's
// allow_fp16_reduced_precision_reduction permits): each partial sum is a difference of two
// prefix sums, so no larger than twice the largest prefix sum (`scale`), and each of up to a
// few dozen of them may be rounded a couple of times.
Tolerance GemmTolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return {1e-6, 2e-3, 0.05};
    case DType::kBFloat16: return {1e-6, 1.6e-2, 0.4};
    default: return {1e-6, 1e-5, 1e-6};
  }
}

// Gives the handle its default workspace back when the run ends, however it ends, so that it
// never keeps a pointer into memory the caller may free (cublasSetStream resets the workspace).
class WorkspaceScope {
 public:
  explicit WorkspaceScope(const KernelContext& ctx) : ctx_(ctx) {}
  ~WorkspaceScope() {
    if (set_) (void)cublasSetStream(ctx_.cublas, ctx_.stream);
  }
  Status Set(DevicePtr workspace, int64_t bytes) {
    if (bytes <= 0) return Status::Ok();
    set_ = true;
    MEMEST_CUBLAS_TRY(cublasSetWorkspace(ctx_.cublas, reinterpret_cast<void*>(workspace),
                                         static_cast<size_t>(bytes)));
    return Status::Ok();
  }

 private:
  const KernelContext& ctx_;
  bool set_ = false;
};

Status CheckGemm(const KernelContext& ctx, const Work& work, const std::vector<int>& seeds) {
  const GemmShape& g = work.gemm;
  // Each sample sums k products on the host; keep the whole check to ~20M of them.
  const int count = static_cast<int>(std::clamp<int64_t>(20'000'000 / g.k, 4, 48));
  const Tolerance tol = GemmTolerance(work.dtype);
  for (int64_t idx : SampleIndices(g.batch * g.m * g.n, count)) {
    const int64_t b = idx / (g.m * g.n);
    const int64_t i = idx % (g.m * g.n) / g.n;
    const int64_t j = idx % g.n;
    double want = 0, peak = 0;  // the sum, and its largest prefix sum in magnitude
    for (int64_t kk = 0; kk < g.k; ++kk) {
      const double a = PatternValue(seeds[0], (b * g.m + i) * g.k + kk);
      const double bv = PatternValue(seeds[1], (b * g.k + kk) * g.n + j);
      want += a * bv;
      peak = std::max(peak, std::fabs(want));
    }
    MEMEST_ASSIGN_OR_RETURN(std::vector<double> got,
                            ReadBack(ctx, work.output, work.dtype, idx, 1));
    MEMEST_RETURN_IF_ERROR(ExpectNear("output[" + std::to_string(b) + ", " + std::to_string(i) +
                                          ", " + std::to_string(j) + "]",
                                      got[0], RoundTo(work.dtype, want), peak, tol));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<Timing> RunGemm(const KernelContext& ctx, const Work& work, int repeats) {
  const GemmShape& g = work.gemm;
  const cudaDataType_t type = CudaDataType(work.dtype);
  const std::vector<int> seeds = PatternSeeds(work.inputs);

  WorkspaceScope workspace(ctx);
  MEMEST_RETURN_IF_ERROR(workspace.Set(work.workspace, work.workspace_bytes).Prefixed("gemm: "));

  Bench bench;
  bench.name = "gemm";
  bench.prepare = [&] {
    return FillInputs(ctx, work.dtype, work.inputs, {g.batch * g.m * g.k, g.batch * g.k * g.n});
  };
  bench.launch = [&]() -> Status {
    // cuBLAS is column-major: a row-major [m, n] C is a column-major [n, m] one, so compute
    // C^T = B^T A^T, which reads the row-major A and B as they lie.
    const float alpha = 1.0f, beta = 0.0f;
    MEMEST_CUBLAS_TRY(cublasGemmStridedBatchedEx(
        ctx.cublas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(g.n), static_cast<int>(g.m),
        static_cast<int>(g.k), &alpha, reinterpret_cast<const void*>(work.inputs[1]), type,
        static_cast<int>(g.n), g.k * g.n, reinterpret_cast<const void*>(work.inputs[0]), type,
        static_cast<int>(g.k), g.m * g.k, &beta, reinterpret_cast<void*>(work.output), type,
        static_cast<int>(g.n), g.m * g.n, static_cast<int>(g.batch), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
    return Status::Ok();
  };
  bench.check = [&] { return CheckGemm(ctx, work, seeds); };
  return RunBench(ctx, bench, repeats);
}

Status TinyGemm(const KernelContext& ctx, DevicePtr scratch) {
  MEMEST_CUDA_TRY(cudaMemsetAsync(reinterpret_cast<void*>(scratch), 0, 3 * 64 * sizeof(float),
                                  ctx.stream));
  const float alpha = 1.0f, beta = 0.0f;
  const float* a = reinterpret_cast<const float*>(scratch);
  float* c = reinterpret_cast<float*>(scratch) + 128;
  MEMEST_CUBLAS_TRY(cublasGemmStridedBatchedEx(ctx.cublas, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8,
                                               &alpha, a, CUDA_R_32F, 8, 64, a + 64, CUDA_R_32F,
                                               8, 64, &beta, c, CUDA_R_32F, 8, 64, 1,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  MEMEST_CUDA_TRY(cudaStreamSynchronize(ctx.stream));
  return Status::Ok();
}

}  // namespace memest::kernels
