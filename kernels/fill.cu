#include "kernels/fill.h"

#include <algorithm>

#include "kernels/cuda_status.h"
#include "kernels/dtype_cuda.cuh"
#include "kernels/pattern.h"

namespace memest::kernels {

namespace {

// Not zero: a page of zeros could in principle be special-cased somewhere below us.
constexpr uint8_t kTouchByte = 0xA5;
constexpr int kThreads = 256;

__global__ void TouchKernel(uint8_t* head, int64_t head_bytes, uint4* body, int64_t vectors,
                            uint8_t* tail, int64_t tail_bytes) {
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const unsigned word = 0x01010101u * kTouchByte;
  const uint4 v = make_uint4(word, word, word, word);
  for (int64_t i = tid; i < vectors; i += stride) body[i] = v;
  // Head and tail are under 16 bytes each; a launch always has at least 256 threads.
  if (tid < head_bytes) head[tid] = kTouchByte;
  if (tid < tail_bytes) tail[tid] = kTouchByte;
}

template <typename T>
__global__ void FillPatternKernel(T* out, int64_t n, int seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    out[i] = FromFloat<T>(PatternValue(seed, i));
  }
}

__global__ void FillBytesKernel(uint8_t* out, int64_t n, int seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    out[i] = PatternByte(seed, i);
  }
}

}  // namespace

int GridStrideBlocks(int64_t items, int threads, int sm_count) {
  const int64_t needed = std::max<int64_t>(1, (items + threads - 1) / threads);
  const int64_t full = static_cast<int64_t>(std::max(sm_count, 1)) * std::max(1, 2048 / threads);
  return static_cast<int>(std::min(needed, 2 * full));
}

Status LaunchTouch(cudaStream_t stream, void* ptr, int64_t bytes, int sm_count) {
  if (bytes < 0) return InvalidArgument("bytes: must be >= 0, got " + std::to_string(bytes));
  if (bytes == 0) return Status::Ok();
  uint8_t* p = static_cast<uint8_t*>(ptr);
  const auto misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) % 16);
  const int64_t head = std::min<int64_t>((16 - misalign) % 16, bytes);
  const int64_t vectors = (bytes - head) / 16;
  const int64_t tail = (bytes - head) % 16;
  uint4* body = reinterpret_cast<uint4*>(p + head);
  uint8_t* tail_ptr = p + head + vectors * 16;
  const int blocks = GridStrideBlocks(std::max<int64_t>(vectors, 16), kThreads, sm_count);
  TouchKernel<<<blocks, kThreads, 0, stream>>>(p, head, body, vectors, tail_ptr, tail);
  return LastLaunchError("TouchKernel");
}

Status LaunchFillPattern(cudaStream_t stream, void* ptr, int64_t elements, DType dtype, int seed,
                         int sm_count) {
  if (elements <= 0) return Status::Ok();
  const int blocks = GridStrideBlocks(elements, kThreads, sm_count);
  if (dtype == DType::kUInt8) {
    FillBytesKernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint8_t*>(ptr), elements, seed);
    return LastLaunchError("FillBytesKernel");
  }
  return DispatchFloat(dtype, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    FillPatternKernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(ptr), elements, seed);
    return LastLaunchError("FillPatternKernel");
  });
}

}  // namespace memest::kernels
