// What a CUDA reduction over many rows allocates while it runs: PyTorch's reduction kernel
// (aten/src/ATen/native/cuda/Reduce.cuh, setReduceConfig) splits the rows of a long reduction
// across several blocks per output ("global reduce"), which then need a staging buffer for
// their partial results and a semaphore per output block, both through the caching allocator
// and freed when the kernel returns.
//
// The case modelled is the one every bias gradient runs: a contiguous [N, C] summed over its
// rows into [C] (addmm's and linear's bias, through sum_to_size). For C a multiple of 4 of at
// least 128 the rows are split once there are 1021 or more, into a staging buffer of
// 4 C ctas 128 bytes (ctas grows with the rows once the grid fills the GPU: 132 MiB for
// [16384, 4096] on an H200, 256 MiB for [131072, 4096]); narrower or odd C need more rows. Ported
// from PyTorch 2.11.0's Reduce.cuh; checked against 96 sums measured on an H200
// (tests/validation/cuda_probe.py, tests/data/cuda/h200-torch2.11-probe.json) and the bias
// gradients of nn.TransformerEncoder, BERT, ViT and GPT-2 recorded there.
#ifndef MEMEST_ENGINE_RULES_REDUCE_SCRATCH_H_
#define MEMEST_ENGINE_RULES_REDUCE_SCRATCH_H_

#include <cstdint>

namespace memest {

// The GPU a reduction runs on, as setReduceConfig sizes its grid.
struct ReduceDevice {
  int multiprocessors = 132;
  int max_threads_per_multiprocessor = 2048;
};

struct ReduceScratch {
  int64_t staging = 0;     // bytes; 0 when the rows are not split across blocks
  int64_t semaphores = 0;  // bytes
  // A float accumulator for a half output when the sum runs in pieces (below); 0 otherwise.
  int64_t accumulator = 0;
};

// x [rows, cols] of `elem_size`-byte elements, contiguous and 16-byte aligned, summed over its
// rows; `acc_size` is the accumulator's size in bytes (4 for float32, bfloat16 and float16
// sums; 8 for float64). An x whose byte offsets pass 32 bits is summed in pieces of half the
// rows (TensorIterator::with_32bit_indexing), one after the other: the largest piece's staging
// is what is live at once.
ReduceScratch RowSumScratch(int64_t rows, int64_t cols, int64_t elem_size, int64_t acc_size,
                            const ReduceDevice& d);

// The most threads one multiprocessor runs at once, by compute capability (10 * major + minor):
// 2048 on sm_70, sm_80, sm_90 and sm_100; 1536 on sm_86, sm_87, sm_89 and sm_120; 1024 on sm_75.
int MaxThreadsPerMultiprocessor(int compute_capability);

}  // namespace memest

#endif  // MEMEST_ENGINE_RULES_REDUCE_SCRATCH_H_
