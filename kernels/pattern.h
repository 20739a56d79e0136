// The deterministic input values every benchmark runs on, computed the same way on the device
// (to fill the inputs) and on the host (to check a sample of the output).
//
// Operand `seed` holds, at flat index i, a small multiple of 1/16 in [-0.6875, 0.6875] that
// repeats with a period of 17, 19 or 23 (by seed) and sums to zero over each period. Why these:
//  - every value is exact in float32, TF32, float16 and bfloat16, and so is every product of
//    two; sums of products stay exact in float32 while they stay small, so a GEMM or a
//    convolution with float accumulation gives the host's double result before the final
//    rounding to the output type;
//  - the periods are coprime and each period sums to zero, so a dot product of two operands
//    (a GEMM row and column, a convolution window) stays bounded however long it is, and a
//    half-precision output never overflows;
//  - neighbouring elements differ, so a wrong index or layout shows in the result.
#ifndef MEMEST_KERNELS_PATTERN_H_
#define MEMEST_KERNELS_PATTERN_H_

#include <cstdint>

#ifdef __CUDACC__
#define MEMEST_HOST_DEVICE __host__ __device__
#else
#define MEMEST_HOST_DEVICE
#endif

namespace memest::kernels {

MEMEST_HOST_DEVICE inline int PatternPeriod(int seed) {
  return seed % 3 == 0 ? 17 : (seed % 3 == 1 ? 19 : 23);
}

// i >= 0.
MEMEST_HOST_DEVICE inline float PatternValue(int seed, int64_t i) {
  const int period = PatternPeriod(seed);
  // A fixed permutation of the residues (5 is coprime to each period), centred on zero.
  const int r = static_cast<int>(i % period) * 5 % period;
  return static_cast<float>(r - (period - 1) / 2) * 0.0625f;
}

// For dtypes that run as raw bytes (int64, bool, ...): any byte value, exactly checkable.
MEMEST_HOST_DEVICE inline uint8_t PatternByte(int seed, int64_t i) {
  return static_cast<uint8_t>(i % 251 + 37 * seed);
}

}  // namespace memest::kernels

#endif  // MEMEST_KERNELS_PATTERN_H_
