// The device a validation runs on: the only seam between the host-side replay (validate/) and
// CUDA (kernels/). CudaDevice (kernels/cuda_device.h) implements it on a real GPU; FakeDevice
// (validate/fake_device.h) implements it in host memory for the tests.
//
// Every call returns its error as a value (a Status naming what failed, "cudaMalloc(2.00 GiB):
// out of memory"); nothing here exits or throws. Calls are made from one thread.
#ifndef MEMEST_VALIDATE_DEVICE_H_
#define MEMEST_VALIDATE_DEVICE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/ir/dtype.h"
#include "engine/ir/status.h"

namespace memest::validate {

// A device address (0 is never a valid one).
using DevicePtr = uintptr_t;

struct DeviceMemInfo {
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;  // free on the whole device, as cudaMemGetInfo says
};

// What the device is, measured once when it is opened.
struct DeviceProbe {
  std::string name;                 // "NVIDIA H100 80GB HBM3"
  int ordinal = 0;
  int compute_capability = 0;       // 90 for sm_90
  std::string driver_version;       // "12.4" (cudaDriverGetVersion)
  std::string runtime_version;      // "13.0" (cudaRuntimeGetVersion)
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;           // after this process's context and library handles exist
  // This process's own footprint on the device right after the context was created, before
  // any allocation: what nvidia-smi shows for an idle PyTorch process. -1 where it cannot be
  // measured (no NVML); `notes` then says why.
  int64_t context_bytes = -1;
  // Device memory cuBLAS/cuBLASLt and cuDNN take for their handles and first calls, outside any
  // allocator of ours (free before minus free after creating the handle and running one small
  // call), -1 where not measured.
  int64_t cublas_handle_bytes = -1;
  int64_t cudnn_handle_bytes = -1;
  std::vector<std::string> notes;
};

// The compute of one op (or one half of its backward) at the model's shapes.
enum class WorkKind {
  kGemm,                // C[batch, m, n] = A[batch, m, k] @ B[batch, k, n]  (cuBLAS)
  kConvForward,         // y = conv(x, w)                                      (cuDNN)
  kConvBackwardData,    // dx = conv_transpose(dy, w)                          (cuDNN)
  kConvBackwardFilter,  // dw from x and dy                                    (cuDNN)
  kElementwise,         // out[i] = f(in0[i], in1[i], ...) over `elements`      (ours)
  kSoftmax,             // row softmax of [rows, cols]                         (ours)
  kLayerNorm,           // row normalization of [rows, cols]                   (ours)
  kReduce,              // out[r] = sum of in[r, :] over [rows, cols]           (ours)
};
const char* WorkKindName(WorkKind kind);  // "gemm", "conv_forward", ...

struct GemmShape {
  int64_t batch = 1, m = 0, n = 0, k = 0;
};

// NCHW convolution; a 1-D convolution has h = r = 1.
struct ConvShape {
  int64_t n = 0, c = 0, h = 0, w = 0;   // input
  int64_t k = 0, r = 0, s = 0;          // output channels, kernel height and width
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
  // 0 for a stride below 1 (refused by every check before it matters).
  int64_t out_h() const {
    return stride_h < 1 ? 0 : (h + 2 * pad_h - dilation_h * (r - 1) - 1) / stride_h + 1;
  }
  int64_t out_w() const {
    return stride_w < 1 ? 0 : (w + 2 * pad_w - dilation_w * (s - 1) - 1) / stride_w + 1;
  }
};

struct Work {
  WorkKind kind = WorkKind::kElementwise;
  // float32, float16 or bfloat16. Only kElementwise takes other dtypes (it then moves
  // elements * size bytes); the other kinds refuse them with INVALID_ARGUMENT.
  DType dtype = DType::kFloat32;
  GemmShape gemm;                 // kGemm
  ConvShape conv;                 // kConv*
  int64_t rows = 0, cols = 0;     // kSoftmax, kLayerNorm, kReduce: [rows, cols]
  int64_t elements = 0;           // kElementwise
  // Operands, in the order the kind names them (gemm: A, B; conv forward: x, w; backward data:
  // dy, w; backward filter: x, dy; elementwise: up to 3 inputs; softmax, layer norm, reduce:
  // the input), each at least as large as the shape needs (the caller checks).
  std::vector<DevicePtr> inputs;
  DevicePtr output = 0;
  // Scratch for the library (cuDNN's workspace, cuBLAS's workspace) already allocated by the
  // caller; `workspace_bytes` is its size (0: none).
  DevicePtr workspace = 0;
  int64_t workspace_bytes = 0;
};

// Bytes an operand of the work needs: what the caller must provide.
struct WorkBytes {
  std::vector<int64_t> inputs;
  int64_t output = 0;
};
WorkBytes BytesNeeded(const Work& work);

struct Timing {
  double median_ms = 0;  // median of the timed repeats (CUDA events on the device's stream)
  int repeats = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual StatusOr<DeviceProbe> Probe() = 0;
  virtual StatusOr<DeviceMemInfo> MemInfo() = 0;

  // Raw device memory (cudaMalloc / cudaFree): what the caching allocator reserves segments
  // from. Malloc of more than is free is RESOURCE_EXHAUSTED, not a crash.
  virtual StatusOr<DevicePtr> Malloc(int64_t bytes) = 0;
  virtual Status Free(DevicePtr ptr) = 0;

  // A kernel writes every byte of [ptr, ptr + bytes), so the memory is really touched.
  // Asynchronous; errors surface here or at the next Synchronize.
  virtual Status Touch(DevicePtr ptr, int64_t bytes) = 0;

  // The workspace the library would ask for to run `work` with the algorithm it would choose
  // (cuDNN's heuristic, as PyTorch with benchmark=False); 0 for kinds that need none.
  virtual StatusOr<int64_t> WorkspaceBytes(const Work& work) = 0;

  // Runs `work` for real: warm-up, then `repeats` timed runs on the device's stream, then a
  // check of a sample of the output. The inputs are overwritten with a known pattern first (so
  // the check has an answer); the output may be an input only for kElementwise, kSoftmax and
  // kLayerNorm. Every operand must lie inside memory this device's Malloc returned.
  virtual StatusOr<Timing> Run(const Work& work, int repeats) = 0;

  virtual Status Synchronize() = 0;
};

}  // namespace memest::validate

#endif  // MEMEST_VALIDATE_DEVICE_H_
