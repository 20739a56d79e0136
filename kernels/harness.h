// The one benchmark harness (as in nccl-tests: each benchmark fills a small struct; the harness
// times, checks and reports). A benchmark says how to fill its inputs, how to launch one run
// and how to check a sample of its output; the harness does the rest the same way for all:
//
//   prepare (input patterns) -> kWarmupRuns launches -> `repeats` launches, each between two
//   CUDA events on the device's stream -> median -> prepare again -> one launch -> synchronize
//   -> check
//
// Checking after a fresh prepare keeps the check valid when the timed runs changed the inputs
// (an in-place op whose output is its input). Every error comes back as a Status prefixed with
// the benchmark's name ("softmax: output[3, 17] = 0.25, expected 0.5 ..."); nothing exits.
#ifndef MEMEST_KERNELS_HARNESS_H_
#define MEMEST_KERNELS_HARNESS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/ir/dtype.h"
#include "engine/ir/status.h"
#include "validate/device.h"

namespace memest::kernels {

using validate::DevicePtr;
using validate::Timing;
using validate::Work;

// What every benchmark runs with: the device's own (non-default) stream and library handles,
// both bound to that stream.
struct KernelContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudnnHandle_t cudnn = nullptr;
  int sm_count = 1;  // streaming multiprocessors, to size grid-stride launches
};

struct Bench {
  std::string name;                 // the kernel, for messages: "softmax"
  std::function<Status()> prepare;  // enqueue the input patterns on the stream (may be empty)
  std::function<Status()> launch;   // enqueue one run on the stream
  std::function<Status()> check;    // after a synchronized run: compare a sample (may be empty)
};

inline constexpr int kWarmupRuns = 2;
inline constexpr int kMaxRepeats = 10000;

// Runs `bench` as above; repeats in [1, kMaxRepeats] (the caller checks).
StatusOr<Timing> RunBench(const KernelContext& ctx, const Bench& bench, int repeats);

// ---- Inputs --------------------------------------------------------------------------------

// The pattern seed of each input: its position, except that an input at the same address as
// an earlier one (x * x passes one buffer twice) takes the earlier one's seed, since the
// memory can hold only one pattern.
std::vector<int> PatternSeeds(const std::vector<DevicePtr>& inputs);

// Fills each distinct input with its seed's pattern (pattern.h) over the largest element count
// any input at that address needs. Float dtypes get PatternValue; the rest run as bytes and
// get PatternByte (pass DType::kUInt8 with byte counts). Asynchronous, on ctx.stream.
Status FillInputs(const KernelContext& ctx, DType dtype, const std::vector<DevicePtr>& inputs,
                  const std::vector<int64_t>& elements);

// ---- Checks --------------------------------------------------------------------------------

// A result passes when |got - want| <= atol + rtol * |want| + rscale * scale, where want is
// the host's double result rounded to the output dtype, and scale is the magnitude that the
// benchmark's intermediate roundings are relative to (0 when the result is exact before its
// final rounding): for a convolution the sum of |terms|, or for cuDNN's FFT and Winograd
// algorithms, which transform their operands, the root of the sum of squared terms (conv.cu
// says why); the largest partial sum for a GEMM, whose split-K partial sums cuBLAS may add up
// in the output type.
struct Tolerance {
  double atol = 0;
  double rtol = 0;
  double rscale = 0;
};

// What storing v in dtype and reading it back gives (float32, float16, bfloat16; v otherwise).
double RoundTo(DType dtype, double v);

// Copies elements [first, first + count) of a dtype array at `base` to the host as doubles
// (bytes as 0..255 for DType::kUInt8). Synchronizes ctx.stream.
StatusOr<std::vector<double>> ReadBack(const KernelContext& ctx, DevicePtr base, DType dtype,
                                       int64_t first, int64_t count);

// At most `count` distinct indices in [0, total), sorted: the first, the last, evenly spaced
// ones and a few pseudo-random ones (the same every run).
std::vector<int64_t> SampleIndices(int64_t total, int count);

// OK, or INTERNAL naming the element: "output[2, 5] = 0.5, expected 0.25 (|diff| 0.25 > tol
// 1e-05)". `element` is how the benchmark names the element.
Status ExpectNear(std::string_view element, double got, double want, double scale,
                  const Tolerance& tol);

// Row `row` of the [rows, cols] output of `work` against want(j) for each column j, read back
// in chunks (a row of billions of columns must not need billions of host doubles).
Status ExpectRow(const KernelContext& ctx, const Work& work, int64_t row, const Tolerance& tol,
                 const std::function<double(int64_t)>& want);

}  // namespace memest::kernels

#endif  // MEMEST_KERNELS_HARNESS_H_
