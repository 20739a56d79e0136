// Our own elementwise kernel: out = in0 * in1 + in2 (a fused multiply-add, the shape of most
// of PyTorch's pointwise traffic: up to three reads and one write per element).
#include <algorithm>
#include <string>

#include "kernels/benchmarks.h"
#include "kernels/cuda_status.h"
#include "kernels/dtype_cuda.cuh"
#include "kernels/fill.h"
#include "kernels/pattern.h"

namespace memest::kernels {

namespace {

constexpr int kThreads = 256;

// Float dtypes compute in float, as PyTorch's opmath does; a missing in1 is 0.5, in2 0.25.
struct FloatMath {
  using Compute = float;
  static constexpr float kMissingB = 0.5f;
  static constexpr float kMissingC = 0.25f;
  template <typename T>
  __device__ static float In(T v) { return ToFloat(v); }
  template <typename T>
  __device__ static T Out(float v) { return FromFloat<T>(v); }
  __device__ static float Apply(float a, float b, float c) { return fmaf(a, b, c); }
};

// Other dtypes run as bytes, in 8-bit integers; a missing in1 is 3, in2 1.
struct ByteMath {
  using Compute = unsigned;
  static constexpr unsigned kMissingB = 3;
  static constexpr unsigned kMissingC = 1;
  template <typename T>
  __device__ static unsigned In(T v) { return v; }
  template <typename T>
  __device__ static T Out(unsigned v) { return static_cast<T>(v & 0xffu); }
  __device__ static unsigned Apply(unsigned a, unsigned b, unsigned c) { return a * b + c; }
};

// 16 bytes of T: one vector load or store.
template <typename T>
struct alignas(16) Pack {
  T v[16 / sizeof(T)];
};

template <typename T, typename M, int kInputs>
__device__ __forceinline__ T ApplyAt(const T* a, const T* b, const T* c, int64_t i) {
  using C = typename M::Compute;
  const C x = M::In(a[i]);
  const C y = kInputs >= 2 ? M::In(b[i]) : C(M::kMissingB);
  const C z = kInputs >= 3 ? M::In(c[i]) : C(M::kMissingC);
  return M::template Out<T>(M::Apply(x, y, z));
}

// No __restrict__: out may be a (in place). Each element (each 16-byte pack) is read and then
// written by the same thread, so in place is safe.
template <typename T, typename M, int kInputs, bool kVector>
__global__ void ElementwiseKernel(const T* a, const T* b, const T* c, T* out, int64_t n) {
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t scalar_from = 0;
  if constexpr (kVector) {
    constexpr int kPack = 16 / sizeof(T);
    using P = Pack<T>;
    const int64_t packs = n / kPack;
    for (int64_t p = tid; p < packs; p += stride) {
      const P va = reinterpret_cast<const P*>(a)[p];
      P vb, vc, vo;
      if constexpr (kInputs >= 2) vb = reinterpret_cast<const P*>(b)[p];
      if constexpr (kInputs >= 3) vc = reinterpret_cast<const P*>(c)[p];
#pragma unroll
      for (int j = 0; j < kPack; ++j) {
        vo.v[j] = ApplyAt<T, M, kInputs>(va.v, vb.v, vc.v, j);
      }
      reinterpret_cast<P*>(out)[p] = vo;
    }
    scalar_from = packs * kPack;  // the tail that does not fill a pack
  }
  for (int64_t i = scalar_from + tid; i < n; i += stride) {
    out[i] = ApplyAt<T, M, kInputs>(a, b, c, i);
  }
}

template <typename T, typename M, int kInputs>
Status Launch(const KernelContext& ctx, const Work& work, int64_t n) {
  const T* a = reinterpret_cast<const T*>(work.inputs[0]);
  const T* b = kInputs >= 2 ? reinterpret_cast<const T*>(work.inputs[1]) : nullptr;
  const T* c = kInputs >= 3 ? reinterpret_cast<const T*>(work.inputs[2]) : nullptr;
  T* out = reinterpret_cast<T*>(work.output);
  bool aligned = work.output % 16 == 0;
  for (int i = 0; i < kInputs; ++i) aligned = aligned && work.inputs[i] % 16 == 0;
  if (aligned) {
    const int blocks = GridStrideBlocks(std::max<int64_t>(n / (16 / sizeof(T)), 1), kThreads,
                                        ctx.sm_count);
    ElementwiseKernel<T, M, kInputs, true><<<blocks, kThreads, 0, ctx.stream>>>(a, b, c, out, n);
  } else {
    const int blocks = GridStrideBlocks(n, kThreads, ctx.sm_count);
    ElementwiseKernel<T, M, kInputs, false><<<blocks, kThreads, 0, ctx.stream>>>(a, b, c, out, n);
  }
  return LastLaunchError("ElementwiseKernel");
}

template <typename T, typename M>
Status LaunchFor(const KernelContext& ctx, const Work& work, int64_t n) {
  switch (work.inputs.size()) {
    case 1: return Launch<T, M, 1>(ctx, work, n);
    case 2: return Launch<T, M, 2>(ctx, work, n);
    default: return Launch<T, M, 3>(ctx, work, n);
  }
}

// The float results are exact in float (pattern.h) and round once to the output dtype on
// both sides, so only a last-place difference is allowed; bytes must match exactly.
Tolerance ElementwiseTolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return {1e-7, 1e-6, 0};
    case DType::kFloat16: return {1e-7, 1e-3, 0};
    case DType::kBFloat16: return {1e-7, 8e-3, 0};
    default: return {0, 0, 0};
  }
}

Status CheckElementwise(const KernelContext& ctx, const Work& work, DType run_dtype, int64_t n,
                        const std::vector<int>& seeds) {
  const size_t inputs = work.inputs.size();
  const Tolerance tol = ElementwiseTolerance(run_dtype);
  for (int64_t i : SampleIndices(n, 64)) {
    double want = 0;
    if (run_dtype == DType::kUInt8) {
      const unsigned a = PatternByte(seeds[0], i);
      const unsigned b = inputs >= 2 ? PatternByte(seeds[1], i) : ByteMath::kMissingB;
      const unsigned c = inputs >= 3 ? PatternByte(seeds[2], i) : ByteMath::kMissingC;
      want = (a * b + c) & 0xffu;
    } else {
      const double a = PatternValue(seeds[0], i);
      const double b = inputs >= 2 ? PatternValue(seeds[1], i) : FloatMath::kMissingB;
      const double c = inputs >= 3 ? PatternValue(seeds[2], i) : FloatMath::kMissingC;
      want = RoundTo(run_dtype, a * b + c);
    }
    MEMEST_ASSIGN_OR_RETURN(std::vector<double> got, ReadBack(ctx, work.output, run_dtype, i, 1));
    MEMEST_RETURN_IF_ERROR(ExpectNear("output[" + std::to_string(i) + "]", got[0], want, 0, tol));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<Timing> RunElementwise(const KernelContext& ctx, const Work& work, int repeats) {
  const bool floating = work.dtype == DType::kFloat32 || work.dtype == DType::kFloat16 ||
                        work.dtype == DType::kBFloat16;
  // Non-float dtypes: the same bytes, as uint8.
  const DType run_dtype = floating ? work.dtype : DType::kUInt8;
  const int64_t n = floating ? work.elements : work.elements * DTypeSize(work.dtype);
  const std::vector<int> seeds = PatternSeeds(work.inputs);
  const std::vector<int64_t> elements(work.inputs.size(), n);

  Bench bench;
  bench.name = "elementwise";
  bench.prepare = [&] { return FillInputs(ctx, run_dtype, work.inputs, elements); };
  bench.launch = [&]() -> Status {
    switch (run_dtype) {
      case DType::kFloat32: return LaunchFor<float, FloatMath>(ctx, work, n);
      case DType::kFloat16: return LaunchFor<__half, FloatMath>(ctx, work, n);
      case DType::kBFloat16: return LaunchFor<__nv_bfloat16, FloatMath>(ctx, work, n);
      default: return LaunchFor<uint8_t, ByteMath>(ctx, work, n);
    }
  };
  bench.check = [&] { return CheckElementwise(ctx, work, run_dtype, n, seeds); };
  return RunBench(ctx, bench, repeats);
}

}  // namespace memest::kernels
