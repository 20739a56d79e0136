// CudaDevice: validate::Device on a real GPU (validate/device.h has the contract).
//
// It owns, for one CUDA device: a non-default stream that every kernel, library call and
// timing event goes to; a cuBLAS handle and a cuDNN handle bound to that stream; and every
// allocation made through Malloc, which it frees on destruction if the caller did not. The
// probe is measured once, in Open, in the order that lets each figure be told apart: the
// context first (NVML), then each library handle (cudaMemGetInfo around its creation).
//
// Not thread-safe (device.h: calls come from one thread); each call makes its device current
// on the calling thread first, so several CudaDevices (one per GPU) can be used in turn.
#ifndef MEMEST_KERNELS_CUDA_DEVICE_H_
#define MEMEST_KERNELS_CUDA_DEVICE_H_

#include <memory>

#include "engine/ir/status.h"
#include "kernels/work_check.h"
#include "validate/device.h"

// The CUDA handle types, declared rather than included, so that this header needs no CUDA
// include path (they are the types cuda_runtime.h, cublas_v2.h and cudnn.h typedef).
struct CUstream_st;
struct cublasContext;
struct cudnnContext;

namespace memest::kernels {

class CudaDevice : public validate::Device {
 public:
  // Opens CUDA device `ordinal` (as CUDA numbers them: after CUDA_VISIBLE_DEVICES): creates
  // the context, the stream and the library handles, and measures the probe. UNAVAILABLE
  // when there is no such device or no working driver ("no CUDA device 0: cudaGetDeviceCount:
  // no CUDA-capable device is detected"); INVALID_ARGUMENT for a negative ordinal.
  static StatusOr<std::unique_ptr<CudaDevice>> Open(int ordinal);

  // Waits for the stream, then frees what Malloc handed out and not Free'd, and destroys the
  // handles and the stream. Errors here cannot be returned and are ignored.
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  // As measured in Open; free_bytes is the free memory once the context and the handles exist.
  StatusOr<validate::DeviceProbe> Probe() override;
  StatusOr<validate::DeviceMemInfo> MemInfo() override;

  // cudaMalloc; RESOURCE_EXHAUSTED naming the size when it does not fit ("cudaMalloc(2.00
  // GiB): out of memory (1.20 GiB free of 79.1 GiB)"); INVALID_ARGUMENT for bytes <= 0.
  StatusOr<validate::DevicePtr> Malloc(int64_t bytes) override;
  // cudaFree of an address Malloc returned (INVALID_ARGUMENT otherwise). cudaFree waits for
  // the device, like the caching allocator's own release of a segment.
  Status Free(validate::DevicePtr ptr) override;

  // The fill kernel over [ptr, ptr + bytes), which must lie inside one live allocation.
  Status Touch(validate::DevicePtr ptr, int64_t bytes) override;

  // Convolutions: the workspace of the algorithm cuDNN's heuristics put first (as PyTorch
  // with benchmark=False). 0 for every other kind: cuBLAS's workspace is per handle, not per
  // call, and our kernels need none. Only the shape and dtype are checked; no operands needed.
  StatusOr<int64_t> WorkspaceBytes(const validate::Work& work) override;

  // Checks the work (work_check.h) and runs its benchmark (benchmarks.h): warm-up, the median
  // of `repeats` (1 to 10000) timed runs on the stream, then a check of a sample of the output.
  // The inputs' contents are overwritten with test patterns. A wrong result is INTERNAL
  // naming the kernel and the element.
  StatusOr<validate::Timing> Run(const validate::Work& work, int repeats) override;

  Status Synchronize() override;

 private:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {}
  Status Init();                 // Open's work after the device was found
  Status MeasureContext();       // probe_.context_bytes, or a note saying why not
  Status CreateLibraryHandles();  // and probe_.cublas_handle_bytes / cudnn_handle_bytes
  Status MakeCurrent();          // cudaSetDevice(ordinal_)

  int ordinal_;
  int sm_count_ = 1;
  CUstream_st* stream_ = nullptr;
  cublasContext* cublas_ = nullptr;
  cudnnContext* cudnn_ = nullptr;
  validate::DeviceProbe probe_;
  AllocationMap allocations_;
};

}  // namespace memest::kernels

#endif  // MEMEST_KERNELS_CUDA_DEVICE_H_
