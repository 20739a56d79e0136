#include "kernels/cuda_device.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <unistd.h>

#include <string>
#include <utility>

#include "engine/report/report.h"
#include "kernels/benchmarks.h"
#include "kernels/cuda_status.h"
#include "kernels/fill.h"
#include "kernels/nvml.h"

namespace memest::kernels {

using validate::DeviceMemInfo;
using validate::DeviceProbe;
using validate::DevicePtr;
using validate::Timing;
using validate::Work;
using validate::WorkKind;

namespace {

// CUDA encodes versions as 1000 * major + 10 * minor: 12040 -> "12.4".
std::string VersionString(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

// cudaMalloc'd scratch for Open's tiny library calls, freed on every path.
class Scratch {
 public:
  ~Scratch() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  Status Allocate(size_t bytes) {
    MEMEST_CUDA_TRY(cudaMalloc(&ptr_, bytes));
    return Status::Ok();
  }
  DevicePtr address() const { return reinterpret_cast<DevicePtr>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

StatusOr<int64_t> FreeBytes() {
  size_t free = 0, total = 0;
  MEMEST_CUDA_TRY(cudaMemGetInfo(&free, &total));
  return static_cast<int64_t>(free);
}

}  // namespace

StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Open(int ordinal) {
  if (ordinal < 0) {
    return InvalidArgument("ordinal: must be >= 0, got " + std::to_string(ordinal));
  }
  const std::string no_device = "no CUDA device " + std::to_string(ordinal) + ": ";
  int count = 0;
  // Any failure here (no driver, a driver too old for this runtime, no device) means there is
  // nothing to validate on: UNAVAILABLE, whatever CUDA's code.
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return Unavailable(no_device + "cudaGetDeviceCount: " + cudaGetErrorString(err));
  }
  if (ordinal >= count) {
    return Unavailable(no_device + "this machine has " + std::to_string(count) +
                       " CUDA device(s)");
  }
  std::unique_ptr<CudaDevice> device(new CudaDevice(ordinal));
  // On failure the destructor releases whatever Init had created.
  MEMEST_RETURN_IF_ERROR(device->Init().Prefixed("CUDA device " + std::to_string(ordinal) + ": "));
  return {std::move(device)};
}

Status CudaDevice::MakeCurrent() {
  MEMEST_CUDA_TRY(cudaSetDevice(ordinal_));
  return Status::Ok();
}

Status CudaDevice::Init() {
  cudaDeviceProp prop{};
  MEMEST_CUDA_TRY(cudaGetDeviceProperties(&prop, ordinal_));  // needs no context
  probe_.name = prop.name;
  probe_.ordinal = ordinal_;
  probe_.compute_capability = prop.major * 10 + prop.minor;
  sm_count_ = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
  int driver = 0, runtime = 0;
  MEMEST_CUDA_TRY(cudaDriverGetVersion(&driver));
  MEMEST_CUDA_TRY(cudaRuntimeGetVersion(&runtime));
  probe_.driver_version = VersionString(driver);
  probe_.runtime_version = VersionString(runtime);

  MEMEST_RETURN_IF_ERROR(MeasureContext());  // creates the context
  cudaStream_t stream = nullptr;
  // Non-blocking: no implicit synchronization with the legacy default stream.
  MEMEST_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
  MEMEST_RETURN_IF_ERROR(CreateLibraryHandles());

  size_t free = 0, total = 0;
  MEMEST_CUDA_TRY(cudaMemGetInfo(&free, &total));
  probe_.total_bytes = static_cast<int64_t>(total);
  probe_.free_bytes = static_cast<int64_t>(free);
  return Status::Ok();
}

// The context's footprint is invisible to cudaMemGetInfo (which needs the context before it
// can answer), so it comes from NVML: this process's figure right after the context exists,
// before anything is allocated. Where NVML does not list this pid (a container's pid
// namespace), the device-wide used memory before and after creating the context. If this
// process had already used the device (another CudaDevice on it), the figure includes that.
Status CudaDevice::MeasureContext() {
  char pci[32] = {};
  MEMEST_CUDA_TRY(cudaDeviceGetPCIBusId(pci, sizeof(pci), ordinal_));
  StatusOr<std::unique_ptr<Nvml>> nvml = Nvml::Load();
  int64_t used_before = -1;
  if (nvml.ok()) {
    StatusOr<int64_t> used = (*nvml)->DeviceUsedBytes(pci);
    if (used.ok()) used_before = *used;
  }

  // Since CUDA 12 cudaSetDevice creates the primary context; cudaFree(nullptr) makes sure of
  // it on any runtime.
  MEMEST_RETURN_IF_ERROR(MakeCurrent());
  MEMEST_CUDA_TRY(cudaFree(nullptr));

  if (!nvml.ok()) {
    probe_.notes.push_back("context_bytes not measured: NVML unavailable (" +
                           nvml.status().message() + ")");
    return Status::Ok();
  }
  StatusOr<int64_t> mine = (*nvml)->ProcessUsedBytes(pci, static_cast<unsigned int>(getpid()));
  if (mine.ok()) {
    probe_.context_bytes = *mine;
    probe_.notes.push_back("context_bytes: NVML's memory for this process after creating the "
                           "context, before any allocation");
    return Status::Ok();
  }
  StatusOr<int64_t> used_after = (*nvml)->DeviceUsedBytes(pci);
  if (used_before >= 0 && used_after.ok()) {
    probe_.context_bytes = *used_after - used_before;
    probe_.notes.push_back("context_bytes: NVML's device-wide used memory before and after "
                           "creating the context (" + mine.status().message() +
                           "); approximate if another process allocated meanwhile");
    return Status::Ok();
  }
  probe_.notes.push_back("context_bytes not measured: " + mine.status().message());
  return Status::Ok();
}

// Each handle is measured as the free memory before it minus after it was created and ran one
// tiny call (cuBLAS sets up its default workspace, cuDNN loads its kernels). The scratch for
// those calls is allocated first, so that its own page is charged to neither.
Status CudaDevice::CreateLibraryHandles() {
  Scratch scratch;
  MEMEST_RETURN_IF_ERROR(scratch.Allocate(64 * 1024));
  const KernelContext ctx_before{stream_, nullptr, nullptr, sm_count_};

  MEMEST_ASSIGN_OR_RETURN(const int64_t free0, FreeBytes());
  cublasHandle_t cublas = nullptr;
  MEMEST_CUBLAS_TRY(cublasCreate(&cublas));
  cublas_ = cublas;
  MEMEST_CUBLAS_TRY(cublasSetStream(cublas, stream_));
  KernelContext ctx = ctx_before;
  ctx.cublas = cublas;
  MEMEST_RETURN_IF_ERROR(TinyGemm(ctx, scratch.address()));
  MEMEST_ASSIGN_OR_RETURN(const int64_t free1, FreeBytes());

  cudnnHandle_t cudnn = nullptr;
  MEMEST_CUDNN_TRY(cudnnCreate(&cudnn));
  cudnn_ = cudnn;
  MEMEST_CUDNN_TRY(cudnnSetStream(cudnn, stream_));
  ctx.cudnn = cudnn;
  MEMEST_RETURN_IF_ERROR(TinyConv(ctx, scratch.address()));
  MEMEST_ASSIGN_OR_RETURN(const int64_t free2, FreeBytes());

  probe_.cublas_handle_bytes = free0 - free1;
  probe_.cudnn_handle_bytes = free1 - free2;
  probe_.notes.push_back(
      "cublas_handle_bytes, cudnn_handle_bytes: free memory before minus after creating each "
      "handle and running one tiny call; approximate if another process allocated meanwhile, "
      "and kernels the libraries load later (CUDA lazy loading) take more");
  return Status::Ok();
}

CudaDevice::~CudaDevice() {
  // An Open that failed before the context existed leaves nothing to release (and making the
  // device current would create a context now).
  if (stream_ == nullptr && cublas_ == nullptr && cudnn_ == nullptr && allocations_.empty()) {
    return;
  }
  if (cudaSetDevice(ordinal_) != cudaSuccess) (void)cudaGetLastError();
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  for (const auto& [ptr, bytes] : allocations_) (void)cudaFree(reinterpret_cast<void*>(ptr));
  if (cublas_ != nullptr) (void)cublasDestroy(cublas_);
  if (cudnn_ != nullptr) (void)cudnnDestroy(cudnn_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  (void)cudaGetLastError();  // leave no error behind for whoever uses CUDA next
}

StatusOr<DeviceProbe> CudaDevice::Probe() { return probe_; }

StatusOr<DeviceMemInfo> CudaDevice::MemInfo() {
  MEMEST_RETURN_IF_ERROR(MakeCurrent());
  size_t free = 0, total = 0;
  MEMEST_CUDA_TRY(cudaMemGetInfo(&free, &total));
  DeviceMemInfo info;
  info.total_bytes = static_cast<int64_t>(total);
  info.free_bytes = static_cast<int64_t>(free);
  return info;
}

StatusOr<DevicePtr> CudaDevice::Malloc(int64_t bytes) {
  if (bytes <= 0) return InvalidArgument("bytes: must be positive, got " + std::to_string(bytes));
  MEMEST_RETURN_IF_ERROR(MakeCurrent());
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(bytes));
  const std::string call = "cudaMalloc(" + FormatBytes(bytes) + ")";
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it so no later check reports it
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return ResourceExhausted(call + ": out of memory");
    }
    return ResourceExhausted(call + ": out of memory (" +
                             FormatBytes(static_cast<int64_t>(free)) + " free of " +
                             FormatBytes(static_cast<int64_t>(total)) + ")");
  }
  MEMEST_RETURN_IF_ERROR(FromCuda(err, call));
  const auto ptr = reinterpret_cast<DevicePtr>(p);
  allocations_[ptr] = bytes;
  return ptr;
}

Status CudaDevice::Free(DevicePtr ptr) {
  auto it = allocations_.find(ptr);
  if (it == allocations_.end()) {
    return InvalidArgument("ptr: " + HexAddress(ptr) +
                           " is not a live address Malloc returned on this device");
  }
  MEMEST_RETURN_IF_ERROR(MakeCurrent());
  // On failure the record stays, and the destructor tries again.
  MEMEST_CUDA_TRY(cudaFree(reinterpret_cast<void*>(ptr)));
  allocations_.erase(it);
  return Status::Ok();
}

Status CudaDevice::Touch(DevicePtr ptr, int64_t bytes) {
  if (bytes < 0) return InvalidArgument("bytes: must be >= 0, got " + std::to_string(bytes));
  if (bytes == 0) return Status::Ok();
  MEMEST_RETURN_IF_ERROR(CheckInsideAllocation(ptr, bytes, allocations_, "ptr"));
  MEMEST_RETURN_IF_ERROR(MakeCurrent());
  return LaunchTouch(stream_, reinterpret_cast<void*>(ptr), bytes, sm_count_);
}

StatusOr<int64_t> CudaDevice::WorkspaceBytes(const Work& work) {
  MEMEST_RETURN_IF_ERROR(CheckShape(work));
  switch (work.kind) {
    case WorkKind::kConvForward:
    case WorkKind::kConvBackwardData:
    case WorkKind::kConvBackwardFilter:
      MEMEST_RETURN_IF_ERROR(MakeCurrent());
      return ConvWorkspaceBytes({stream_, cublas_, cudnn_, sm_count_}, work);
    default:
      return int64_t{0};
  }
}

StatusOr<Timing> CudaDevice::Run(const Work& work, int repeats) {
  if (repeats < 1 || repeats > kMaxRepeats) {
    return InvalidArgument("repeats: must be in [1, " + std::to_string(kMaxRepeats) + "], got " +
                           std::to_string(repeats));
  }
  MEMEST_RETURN_IF_ERROR(CheckShape(work));
  MEMEST_RETURN_IF_ERROR(CheckOperands(work, allocations_));
  MEMEST_RETURN_IF_ERROR(MakeCurrent());
  const KernelContext ctx{stream_, cublas_, cudnn_, sm_count_};
  switch (work.kind) {
    case WorkKind::kGemm: return RunGemm(ctx, work, repeats);
    case WorkKind::kConvForward:
    case WorkKind::kConvBackwardData:
    case WorkKind::kConvBackwardFilter: return RunConv(ctx, work, repeats);
    case WorkKind::kElementwise: return RunElementwise(ctx, work, repeats);
    case WorkKind::kSoftmax: return RunSoftmax(ctx, work, repeats);
    case WorkKind::kLayerNorm: return RunLayerNorm(ctx, work, repeats);
    case WorkKind::kReduce: return RunReduce(ctx, work, repeats);
  }
  return InvalidArgument("work.kind: unknown (" + std::to_string(static_cast<int>(work.kind)) +
                         ")");
}

Status CudaDevice::Synchronize() {
  MEMEST_RETURN_IF_ERROR(MakeCurrent());
  MEMEST_CUDA_TRY(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

}  // namespace memest::kernels
