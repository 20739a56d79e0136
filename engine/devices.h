// The device catalog: capacity and fixed costs (CUDA context, cuBLAS workspace) per GPU.
#ifndef MEMEST_ENGINE_DEVICES_H_
#define MEMEST_ENGINE_DEVICES_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/status.h"

namespace memest {

struct DeviceInfo {
  std::string name;         // "h100-80gb"
  std::string description;  // "NVIDIA H100 80GB HBM3 (SXM)"
  int64_t capacity_bytes = 0;        // total memory as cudaMemGetInfo reports it
  int64_t cuda_context_bytes = 0;    // driver context + PyTorch's kernels, outside the allocator
  int64_t cublas_workspace_bytes = 0;  // per handle and stream, through the caching allocator
  int compute_capability = 0;        // 80 for sm_80
};

// Every device in the catalog, in a stable order.
const std::vector<DeviceInfo>& ListDevices();
// The device called `name` (case-insensitive, aliases such as "a100" accepted), or NOT_FOUND
// naming the catalog ("unknown device 'x'; known: ..."; the caller prefixes its field).
StatusOr<DeviceInfo> FindDevice(std::string_view name);
// A device of `capacity_bytes` with the fixed costs of a current datacenter GPU.
DeviceInfo BareDevice(int64_t capacity_bytes);

}  // namespace memest

#endif  // MEMEST_ENGINE_DEVICES_H_
