// What a CUDA reduction over many rows allocates while it runs: PyTorch's reduction kernel
// (aten/src/ATen/native/cuda/Reduce.cuh, setReduceConfig) splits the rows of a long reduction
// across several blocks per output ("global reduce"), which then need a staging buffer for
// their partial results and a semaphore per output block, both through the caching allocator
// and freed when the kernel returns.
//
// The case modelled is the one every bias gradient runs: a contiguous [N, C] summed over its
// rows into [C] (addmm's and linear's bias, through sum_to_size). Ported from PyTorch 2.11.0's
// Reduce.cuh; checked against 96 sums measured on an H200 (tests/validation/cuda_probe.py,
// tests/data/cuda/h200-torch2.11-probe.json) and the bias gradients of nn.TransformerEncoder, BERT,
// ViT and GPT-2 recorded there.
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
};

// x [rows, cols], contiguous and 16-byte aligned, summed over its rows; `acc_size` is the
// accumulator's size in bytes (4 for float32, bfloat16 and float16 sums; 8 for float64).
ReduceScratch RowSumScratch(int64_t rows, int64_t cols, int64_t acc_size, const ReduceDevice& d);

// The most threads one multiprocessor runs at once, by compute capability (10 * major + minor):
// 2048 on sm_70, sm_80, sm_90 and sm_100; 1536 on sm_86, sm_87, sm_89 and sm_120; 1024 on sm_75.
int MaxThreadsPerMultiprocessor(int compute_capability);

}  // namespace memest

#endif  // MEMEST_ENGINE_RULES_REDUCE_SCRATCH_H_
