// CUDA, cuBLAS and cuDNN error codes as memest Status values, naming the call that failed:
// "cudaMalloc: out of memory (cudaErrorMemoryAllocation)". Nothing in kernels/ exits, aborts or
// throws; every library call goes through one of these.
#ifndef MEMEST_KERNELS_CUDA_STATUS_H_
#define MEMEST_KERNELS_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string_view>

#include "engine/ir/status.h"

namespace memest::kernels {

// OK for cudaSuccess. Otherwise "<call>: <description> (<error name>)", with the code that says
// what the caller can do: out of memory is RESOURCE_EXHAUSTED, no device or driver UNAVAILABLE,
// a GPU this library has no code for FAILED_PRECONDITION, anything else INTERNAL. A failed call
// also sets the thread's last-error state, which a later kernel launch check would then
// misreport; this clears it (errors that kill the context stay, as they must).
Status FromCuda(cudaError_t err, std::string_view call);
Status FromCublas(cublasStatus_t status, std::string_view call);
// cuDNN 9 keeps a longer description of the last error; it is appended when there is one.
Status FromCudnn(cudnnStatus_t status, std::string_view call);

// The function name of a call expression: "cudaMalloc(&p, n)" -> "cudaMalloc".
std::string_view CallName(std::string_view expr);

// A kernel launch is checked with cudaGetLastError right after it (the launch itself returns
// nothing); faults while it runs surface at the next synchronizing call.
Status LastLaunchError(std::string_view kernel);

}  // namespace memest::kernels

// Return early with the call's error, named by its function: MEMEST_CUDA_TRY(cudaFree(p)).
#define MEMEST_CUDA_TRY(expr) \
  MEMEST_RETURN_IF_ERROR(::memest::kernels::FromCuda((expr), ::memest::kernels::CallName(#expr)))
#define MEMEST_CUBLAS_TRY(expr) \
  MEMEST_RETURN_IF_ERROR(::memest::kernels::FromCublas((expr), ::memest::kernels::CallName(#expr)))
#define MEMEST_CUDNN_TRY(expr) \
  MEMEST_RETURN_IF_ERROR(::memest::kernels::FromCudnn((expr), ::memest::kernels::CallName(#expr)))

#endif  // MEMEST_KERNELS_CUDA_STATUS_H_
