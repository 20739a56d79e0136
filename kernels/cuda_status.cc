#include "kernels/cuda_status.h"

#include <string>

namespace memest::kernels {

namespace {

std::string Join(std::string_view call, const char* what, const char* name) {
  std::string m(call);
  m += ": ";
  m += what != nullptr ? what : "unknown error";
  if (name != nullptr) {
    m += " (";
    m += name;
    m += ")";
  }
  return m;
}

}  // namespace

std::string_view CallName(std::string_view expr) {
  const size_t paren = expr.find('(');
  return paren == std::string_view::npos ? expr : expr.substr(0, paren);
}

Status FromCuda(cudaError_t err, std::string_view call) {
  if (err == cudaSuccess) return Status::Ok();
  // Reset the last-error state this failure left behind (see the header).
  (void)cudaGetLastError();
  std::string m = Join(call, cudaGetErrorString(err), cudaGetErrorName(err));
  switch (err) {
    case cudaErrorMemoryAllocation:
      return ResourceExhausted(std::move(m));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return Unavailable(std::move(m));
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return FailedPrecondition(m + "; memest's kernels are built for sm_80 and sm_90");
    default:
      return Internal(std::move(m));
  }
}

Status FromCublas(cublasStatus_t status, std::string_view call) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  std::string m = Join(call, cublasGetStatusString(status), cublasGetStatusName(status));
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return ResourceExhausted(std::move(m));
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return FailedPrecondition(std::move(m));
    default:
      return Internal(std::move(m));
  }
}

Status FromCudnn(cudnnStatus_t status, std::string_view call) {
  if (status == CUDNN_STATUS_SUCCESS) return Status::Ok();
  std::string m = Join(call, cudnnGetErrorString(status), nullptr);
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof(detail));
  if (detail[0] != '\0') {
    m += " [";
    m += detail;
    m += "]";
  }
  // cuDNN 9 codes come in categories of a thousand: 2xxx bad parameter, 3xxx not supported,
  // 4xxx internal (4004: a device allocation failed), 5xxx execution failed.
  const int code = static_cast<int>(status);
  if (code == static_cast<int>(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)) {
    return ResourceExhausted(std::move(m));
  }
  if (code / 1000 == 3) return FailedPrecondition(std::move(m));
  return Internal(std::move(m));
}

Status LastLaunchError(std::string_view kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::Ok();
  std::string call = "launch of ";
  call += kernel;
  return FromCuda(err, call);
}

}  // namespace memest::kernels
