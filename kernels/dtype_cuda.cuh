// Device-side element types for the float dtypes the kernels run (float32, float16, bfloat16):
// loads widen to float, stores round to nearest, as PyTorch's kernels do (float "opmath").
// CUDA-only (.cu files).
#ifndef MEMEST_KERNELS_DTYPE_CUDA_CUH_
#define MEMEST_KERNELS_DTYPE_CUDA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "engine/ir/dtype.h"
#include "engine/ir/status.h"

namespace memest::kernels {

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the element type of `dtype`; INVALID_ARGUMENT for a dtype that
// is not float32, float16 or bfloat16. f returns a Status.
template <typename F>
Status DispatchFloat(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(TypeTag<float>{});
    case DType::kFloat16: return f(TypeTag<__half>{});
    case DType::kBFloat16: return f(TypeTag<__nv_bfloat16>{});
    default: break;
  }
  return InvalidArgument("work.dtype: must be float32, float16 or bfloat16, got " +
                         std::string(DTypeName(dtype)));
}

// Threads per block for the row kernels (one block per row): enough threads to cover a row
// a few elements each, a whole number of warps, at most 1024.
inline int RowBlockThreads(int64_t cols) {
  if (cols <= 512) return 128;
  if (cols <= 2048) return 256;
  if (cols <= 8192) return 512;
  return 1024;
}

// Block-wide reductions for the row kernels. Every thread of the block must call them (the
// row loop is uniform over the block); blockDim.x is a multiple of 32.
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename Op>
__device__ __forceinline__ float WarpReduce(float v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

template <typename Op>
__device__ float BlockReduce(float v, Op op, float identity) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = WarpReduce(v, op);
  __syncthreads();  // a previous reduction's readers are done with `partial` and `total`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = static_cast<int>(blockDim.x >> 5);
    v = WarpReduce(lane < warps ? partial[lane] : identity, op);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

}  // namespace memest::kernels

#endif  // MEMEST_KERNELS_DTYPE_CUDA_CUH_
