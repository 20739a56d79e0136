// The device catalog: capacity and fixed costs (CUDA context, cuBLAS workspace) per GPU, and
// the names schedulers give them. docs/devices.md lists each figure with its source.
#ifndef MEMEST_ENGINE_IR_DEVICES_H_
#define MEMEST_ENGINE_IR_DEVICES_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/status.h"

namespace memest {

struct DeviceInfo {
  std::string name;         // "h100-80gb"
  std::string description;  // "NVIDIA H100 80GB HBM3 (SXM)"
  int64_t capacity_bytes = 0;        // total memory as cudaMemGetInfo reports it
  // What a PyTorch 2.x process holds outside its caching allocator once CUDA is initialised and
  // the step's first kernels have loaded, with CUDA_MODULE_LOADING=LAZY (PyTorch's default
  // since 1.13 with CUDA >= 11.7). CudaContextBytes gives it for eager loading.
  int64_t cuda_context_bytes = 0;
  int64_t cublas_workspace_bytes = 0;  // per handle and stream, through the caching allocator
  int compute_capability = 0;        // 80 for sm_80; 0 for a GPU that does not run CUDA
  // Streaming multiprocessors (compute units on AMD): what sizes per-program scratch, such as
  // vLLM's Triton top-k/top-p buffer (engine/report/serving.h).
  int multiprocessors = 0;
  // false for a GPU that PyTorch drives through ROCm/HIP (AMD Instinct): memest estimates with
  // its capacity, but Validate, which replays the step with CUDA, refuses it.
  bool cuda = true;
  bool measured = false;  // capacity read on such a device (else estimated; docs/devices.md)
};

// Every device in the catalog, in a stable order.
const std::vector<DeviceInfo>& ListDevices();

// The device called `name`, case-insensitive. Besides the catalog's names and short aliases
// ("a100", "h100-sxm", "4090") it takes the names schedulers use:
//   - the GPU's own name as nvidia-smi / NVML report it ("NVIDIA A100-SXM4-80GB",
//     "NVIDIA H100 80GB HBM3", "Tesla T4", "AMD Instinct MI300X");
//   - Kubernetes GPU feature discovery's nvidia.com/gpu.product label, which is that name with
//     spaces as '-' ("NVIDIA-A100-SXM4-80GB", "Tesla-T4"), also with its "-SHARED" suffix for a
//     time-sliced GPU;
//   - Slurm GRES specifications "gpu:<type>[:<count>]" and their usual type names
//     ("gpu:a100:4", "gpu:a100_80gb", "gpu:rtx_a6000").
// A MIG slice ("...-MIG-1g.10gb") is refused with a message saying to give its capacity.
// NOT_FOUND names the catalog ("unknown device 'x'; known: ..."; the caller prefixes its
// field).
StatusOr<DeviceInfo> FindDevice(std::string_view name);

// A bare capacity's multiprocessors: an H100 SXM's.
inline constexpr int kDatacenterMultiprocessors = 132;

// A device of `capacity_bytes` with the fixed costs of a current datacenter GPU.
DeviceInfo BareDevice(int64_t capacity_bytes);

// The CUDA context under `loading`: the catalog's lazy figure, or with every kernel image of
// PyTorch's libraries loaded at initialisation (CUDA_MODULE_LOADING=EAGER, or CUDA < 11.7).
int64_t CudaContextBytes(const DeviceInfo& device, ModuleLoading loading);

// The sm generation whose SDPA kernel rules apply (engine/rules/sdpa_select.h): the device's
// own; for a ROCm GPU, whose flash and memory-efficient kernels (AOTriton) take the calls
// sm_90's do for the shapes memest builds, 90.
int AttentionCapability(const DeviceInfo& device);

// The cuBLAS workspace one handle and stream takes under CUBLAS_WORKSPACE_CONFIG `config`, as
// PyTorch's CublasHandlePool parses it: the sum of SIZE KiB x COUNT over its ":SIZE:COUNT"
// pairs. Refuses text that is not such pairs, naming `field`.
StatusOr<int64_t> CublasWorkspaceBytes(const std::string& config, const std::string& field);

}  // namespace memest

#endif  // MEMEST_ENGINE_IR_DEVICES_H_
