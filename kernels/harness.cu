#include "kernels/harness.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "kernels/cuda_status.h"
#include "kernels/fill.h"

namespace memest::kernels {

namespace {

// Timed launches are enqueued behind a kernel that holds the stream until the host has queued
// them all, so that each event pair measures the kernel and not the host's enqueue latency
// (a cuDNN call can take longer to enqueue than a small kernel takes to run). Chunks bound how
// many launches wait at once; the launch queue is finite, and a host blocked on a full queue
// would never release the stream. The hold also gives up after kHoldTimeoutNs, in case a
// library call waits for the stream while it is held.
constexpr int kChunk = 32;
constexpr long long kHoldTimeoutNs = 50'000'000;  // 50 ms

__device__ __forceinline__ unsigned long long GlobalTimerNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void HoldStreamKernel(const volatile int* release, long long timeout_ns) {
  const unsigned long long start = GlobalTimerNs();
  while (*release == 0) {
    if (static_cast<long long>(GlobalTimerNs() - start) > timeout_ns) break;
    __nanosleep(1000);
  }
}

// Host memory the device can read (the release flag), freed on every path.
class ReleaseFlag {
 public:
  ~ReleaseFlag() {
    if (flag_ != nullptr) (void)cudaFreeHost(flag_);
  }
  Status Create() {
    void* p = nullptr;
    MEMEST_CUDA_TRY(cudaHostAlloc(&p, sizeof(int), cudaHostAllocMapped));
    flag_ = static_cast<int*>(p);
    Set(0);
    void* d = nullptr;
    MEMEST_CUDA_TRY(cudaHostGetDevicePointer(&d, p, 0));
    device_ = static_cast<const int*>(d);
    return Status::Ok();
  }
  // A volatile store: the compiler must not drop or reorder it, a device is polling it.
  void Set(int v) { *static_cast<volatile int*>(flag_) = v; }
  const int* device() const { return device_; }

 private:
  int* flag_ = nullptr;  // written by the host, read by HoldStreamKernel
  const int* device_ = nullptr;
};

class Events {
 public:
  ~Events() {
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  }
  Status Create(int n) {
    events_.reserve(n);
    for (int i = 0; i < n; ++i) {
      cudaEvent_t e = nullptr;
      MEMEST_CUDA_TRY(cudaEventCreate(&e));
      events_.push_back(e);
    }
    return Status::Ok();
  }
  cudaEvent_t operator[](int i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Appends the milliseconds of `count` launches, each between its own pair of events.
Status TimeChunk(const KernelContext& ctx, const Bench& bench, int count, ReleaseFlag& flag,
                 std::vector<double>* ms) {
  Events events;
  MEMEST_RETURN_IF_ERROR(events.Create(count + 1));
  flag.Set(0);
  HoldStreamKernel<<<1, 1, 0, ctx.stream>>>(flag.device(), kHoldTimeoutNs);
  Status st = LastLaunchError("HoldStreamKernel");
  if (st.ok()) st = FromCuda(cudaEventRecord(events[0], ctx.stream), "cudaEventRecord");
  for (int i = 0; i < count && st.ok(); ++i) {
    st = bench.launch();
    if (st.ok()) st = FromCuda(cudaEventRecord(events[i + 1], ctx.stream), "cudaEventRecord");
  }
  flag.Set(1);  // on every path, or the stream would stay held until the timeout
  if (!st.ok()) {
    // Wait for the hold kernel before returning: the caller frees the flag next (cudaFreeHost,
    // not documented to wait for kernels), and a kernel still polling it would read unmapped
    // host memory, a fault that kills the context. The flag is 1, so this
    // waits only for the launches already queued; its own error (if any) matters less than
    // the one being returned.
    (void)cudaStreamSynchronize(ctx.stream);
    (void)cudaGetLastError();
    return st;
  }
  MEMEST_CUDA_TRY(cudaEventSynchronize(events[count]));
  for (int i = 0; i < count; ++i) {
    float t = 0;
    MEMEST_CUDA_TRY(cudaEventElapsedTime(&t, events[i], events[i + 1]));
    ms->push_back(t);
  }
  return Status::Ok();
}

StatusOr<Timing> RunBenchUnprefixed(const KernelContext& ctx, const Bench& bench, int repeats) {
  if (repeats < 1 || repeats > kMaxRepeats) {
    return InvalidArgument("repeats: must be in [1, " + std::to_string(kMaxRepeats) + "], got " +
                           std::to_string(repeats));
  }
  if (bench.prepare) MEMEST_RETURN_IF_ERROR(bench.prepare());
  for (int i = 0; i < kWarmupRuns; ++i) MEMEST_RETURN_IF_ERROR(bench.launch());
  // Warm-up errors that only show when the kernels run (a fault) surface here, before timing.
  MEMEST_CUDA_TRY(cudaStreamSynchronize(ctx.stream));

  ReleaseFlag flag;
  MEMEST_RETURN_IF_ERROR(flag.Create());
  std::vector<double> ms;
  ms.reserve(repeats);
  for (int done = 0; done < repeats; done += kChunk) {
    MEMEST_RETURN_IF_ERROR(TimeChunk(ctx, bench, std::min(kChunk, repeats - done), flag, &ms));
  }

  if (bench.prepare) MEMEST_RETURN_IF_ERROR(bench.prepare());
  MEMEST_RETURN_IF_ERROR(bench.launch());
  MEMEST_CUDA_TRY(cudaStreamSynchronize(ctx.stream));
  if (bench.check) MEMEST_RETURN_IF_ERROR(bench.check());

  Timing timing;
  timing.median_ms = Median(std::move(ms));
  timing.repeats = repeats;
  return timing;
}

std::string FormatDouble(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

}  // namespace

StatusOr<Timing> RunBench(const KernelContext& ctx, const Bench& bench, int repeats) {
  StatusOr<Timing> result = RunBenchUnprefixed(ctx, bench, repeats);
  if (!result.ok()) return result.status().Prefixed(bench.name + ": ");
  return result;
}

std::vector<int> PatternSeeds(const std::vector<DevicePtr>& inputs) {
  std::vector<int> seeds(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    seeds[i] = static_cast<int>(i);
    for (size_t j = 0; j < i; ++j) {
      if (inputs[j] == inputs[i]) {
        seeds[i] = seeds[j];
        break;
      }
    }
  }
  return seeds;
}

Status FillInputs(const KernelContext& ctx, DType dtype, const std::vector<DevicePtr>& inputs,
                  const std::vector<int64_t>& elements) {
  const std::vector<int> seeds = PatternSeeds(inputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (seeds[i] != static_cast<int>(i)) continue;  // filled with the first at this address
    int64_t n = 0;
    for (size_t j = i; j < inputs.size(); ++j) {
      if (inputs[j] == inputs[i]) n = std::max(n, elements[j]);
    }
    MEMEST_RETURN_IF_ERROR(LaunchFillPattern(ctx.stream, reinterpret_cast<void*>(inputs[i]), n,
                                             dtype, seeds[i], ctx.sm_count));
  }
  return Status::Ok();
}

double RoundTo(DType dtype, double v) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<float>(v);
    case DType::kFloat16: return __half2float(__float2half_rn(static_cast<float>(v)));
    case DType::kBFloat16: return __bfloat162float(__float2bfloat16_rn(static_cast<float>(v)));
    default: return v;
  }
}

StatusOr<std::vector<double>> ReadBack(const KernelContext& ctx, DevicePtr base, DType dtype,
                                       int64_t first, int64_t count) {
  const int64_t size = DTypeSize(dtype);
  std::vector<unsigned char> raw(static_cast<size_t>(count * size));
  MEMEST_CUDA_TRY(cudaMemcpyAsync(raw.data(), reinterpret_cast<const void*>(base + first * size),
                                  raw.size(), cudaMemcpyDeviceToHost, ctx.stream));
  MEMEST_CUDA_TRY(cudaStreamSynchronize(ctx.stream));
  std::vector<double> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const unsigned char* p = raw.data() + i * size;
    switch (dtype) {
      case DType::kFloat32: {
        float f;
        std::memcpy(&f, p, sizeof(f));
        out[i] = f;
        break;
      }
      case DType::kFloat16: {
        __half h;
        std::memcpy(&h, p, sizeof(h));
        out[i] = __half2float(h);
        break;
      }
      case DType::kBFloat16: {
        __nv_bfloat16 b;
        std::memcpy(&b, p, sizeof(b));
        out[i] = __bfloat162float(b);
        break;
      }
      case DType::kUInt8:
        out[i] = *p;
        break;
      default:
        return Internal("ReadBack: unsupported dtype " + std::string(DTypeName(dtype)));
    }
  }
  return out;
}

std::vector<int64_t> SampleIndices(int64_t total, int count) {
  std::vector<int64_t> idx;
  if (total <= 0 || count <= 0) return idx;
  if (total <= count) {
    for (int64_t i = 0; i < total; ++i) idx.push_back(i);
    return idx;
  }
  idx.push_back(0);
  idx.push_back(total - 1);
  const int even = std::max(1, count / 2);
  for (int i = 1; i < even; ++i) idx.push_back(static_cast<int64_t>(i) * (total - 1) / even);
  uint64_t state = 0x9E3779B97F4A7C15ull;  // fixed: the same sample every run
  for (int tries = 0; static_cast<int>(idx.size()) < count && tries < 4 * count; ++tries) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    idx.push_back(static_cast<int64_t>((state >> 11) % static_cast<uint64_t>(total)));
  }
  std::sort(idx.begin(), idx.end());
  idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  return idx;
}

Status ExpectRow(const KernelContext& ctx, const Work& work, int64_t row, const Tolerance& tol,
                 const std::function<double(int64_t)>& want) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  const int64_t cols = work.cols;
  for (int64_t j0 = 0; j0 < cols; j0 += kChunk) {
    const int64_t len = std::min(kChunk, cols - j0);
    MEMEST_ASSIGN_OR_RETURN(std::vector<double> got,
                            ReadBack(ctx, work.output, work.dtype, row * cols + j0, len));
    for (int64_t jj = 0; jj < len; ++jj) {
      const int64_t j = j0 + jj;
      MEMEST_RETURN_IF_ERROR(
          ExpectNear("output[" + std::to_string(row) + ", " + std::to_string(j) + "]", got[jj],
                     RoundTo(work.dtype, want(j)), 0, tol));
    }
  }
  return Status::Ok();
}

Status ExpectNear(std::string_view element, double got, double want, double scale,
                  const Tolerance& tol) {
  const double diff = std::fabs(got - want);
  const double allowed = tol.atol + tol.rtol * std::fabs(want) + tol.rscale * scale;
  if (diff <= allowed) return Status::Ok();  // NaN fails here too
  std::string m(element);
  m += " = " + FormatDouble(got) + ", expected " + FormatDouble(want) + " (|diff| " +
       FormatDouble(diff) + " > tolerance " + FormatDouble(allowed) + ")";
  return Internal(std::move(m));
}

}  // namespace memest::kernels
