// Kernels that write memory: Touch (every byte of a range) and the input patterns.
#ifndef MEMEST_KERNELS_FILL_H_
#define MEMEST_KERNELS_FILL_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/ir/dtype.h"
#include "engine/ir/status.h"

namespace memest::kernels {

// Writes every byte of [ptr, ptr + bytes) (a fixed non-zero byte), so that the pages are
// really backed: 16-byte stores over the aligned middle, single bytes for the unaligned head
// and the tail. Any alignment and any size; bytes == 0 launches nothing. Asynchronous.
Status LaunchTouch(cudaStream_t stream, void* ptr, int64_t bytes, int sm_count);

// Writes operand `seed`'s pattern (pattern.h) to `elements` elements of `dtype` at ptr: for
// float32/float16/bfloat16 PatternValue; for DType::kUInt8 PatternByte. INVALID_ARGUMENT for
// other dtypes (callers fill those as bytes). Asynchronous.
Status LaunchFillPattern(cudaStream_t stream, void* ptr, int64_t elements, DType dtype, int seed,
                         int sm_count);

// Blocks for a grid-stride launch over `items` work items with `threads` per block: enough to
// fill the GPU (8 blocks of 256 threads fill an SM), never more than the items need.
int GridStrideBlocks(int64_t items, int threads, int sm_count);

}  // namespace memest::kernels

#endif  // MEMEST_KERNELS_FILL_H_
