// The row benchmarks (softmax, layer norm, reduce): one block per row of work.inputs[0]
// [rows, cols], launched the same way and checked a sampled row at a time.
#ifndef MEMEST_KERNELS_ROW_BENCH_CUH_
#define MEMEST_KERNELS_ROW_BENCH_CUH_

#include <algorithm>
#include <climits>

#include "kernels/dtype_cuda.cuh"
#include "kernels/harness.h"

namespace memest::kernels {

// Runs `work` through the harness as benchmark `name`: its one input filled with pattern
// `seed`, `launch(TypeTag<T>, in, out, blocks, threads)` launching the row kernel for the
// work's dtype (returning LastLaunchError's status), `check(seed)` checking the output.
template <typename Launch, typename Check>
StatusOr<Timing> RunRowBench(const KernelContext& ctx, const Work& work, int repeats,
                             const char* name, Launch launch, Check check) {
  const int seed = PatternSeeds(work.inputs)[0];
  const int threads = RowBlockThreads(work.cols);
  const int blocks = static_cast<int>(std::min<int64_t>(work.rows, INT_MAX));
  Bench bench;
  bench.name = name;
  bench.prepare = [&] {
    return FillInputs(ctx, work.dtype, work.inputs, {work.rows * work.cols});
  };
  bench.launch = [&] {
    return DispatchFloat(work.dtype, [&](auto tag) -> Status {
      using T = typename decltype(tag)::type;
      return launch(tag, reinterpret_cast<const T*>(work.inputs[0]),
                    reinterpret_cast<T*>(work.output), blocks, threads);
    });
  };
  bench.check = [&] { return check(seed); };
  return RunBench(ctx, bench, repeats);
}

}  // namespace memest::kernels

#endif  // MEMEST_KERNELS_ROW_BENCH_CUH_
