// NVML, loaded at run time with dlopen: what nvidia-smi reports about a device's memory, for
// the CUDA context's own footprint, which cudaMemGetInfo cannot see (it needs a context before
// it can answer). Nothing links against NVML, so memest builds and runs where it is absent
// (this build machine has none); Load then says why, and the probe notes it.
#ifndef MEMEST_KERNELS_NVML_H_
#define MEMEST_KERNELS_NVML_H_

#include <cstdint>
#include <memory>
#include <string>

#include "engine/ir/status.h"

namespace memest::kernels {

class Nvml {
 public:
  // dlopen("libnvidia-ml.so.1") and nvmlInit_v2; UNAVAILABLE with the reason where that fails.
  static StatusOr<std::unique_ptr<Nvml>> Load();
  ~Nvml();  // nvmlShutdown, dlclose
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // Bytes in use on the whole device (nvmlDeviceGetMemoryInfo's `used`). The device is named
  // by its PCI bus id, as cudaDeviceGetPCIBusId gives it ("0000:3B:00.0"): NVML's indices
  // need not follow CUDA's ordinals (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER).
  StatusOr<int64_t> DeviceUsedBytes(const std::string& pci_bus_id);

  // What NVML charges process `pid` on the device (nvmlDeviceGetComputeRunningProcesses_v3).
  // NOT_FOUND when the process is not listed: in a container NVML lists host pids, which do
  // not match the container's own. UNAVAILABLE when the figure is withheld.
  StatusOr<int64_t> ProcessUsedBytes(const std::string& pci_bus_id, unsigned int pid);

 private:
  struct Api;
  explicit Nvml(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

}  // namespace memest::kernels

#endif  // MEMEST_KERNELS_NVML_H_
