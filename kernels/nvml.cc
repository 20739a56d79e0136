#include "kernels/nvml.h"

#include <dlfcn.h>

#include <vector>

namespace memest::kernels {

namespace {

// The few NVML declarations used, as nvml.h has them (NVML API 11+); there is no nvml.h to
// include here, and the library's ABI for these is stable.
using nvmlReturn_t = int;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr nvmlReturn_t NVML_ERROR_INSUFFICIENT_SIZE = 7;
constexpr unsigned long long NVML_VALUE_NOT_AVAILABLE = ~0ull;
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlProcessInfo_t {  // nvmlProcessInfo_v2_t, what the _v3 query fills
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

}  // namespace

struct Nvml::Api {
  void* lib = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*handle_by_pci)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*memory_info)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*compute_processes)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_t*) = nullptr;
  bool initialized = false;

  std::string Error(const char* call, nvmlReturn_t r) const {
    return std::string(call) + ": " + (error_string != nullptr ? error_string(r) : "error") +
           " (NVML " + std::to_string(r) + ")";
  }

  StatusOr<nvmlDevice_t> Device(const std::string& pci_bus_id) const {
    nvmlDevice_t d = nullptr;
    const nvmlReturn_t r = handle_by_pci(pci_bus_id.c_str(), &d);
    if (r != NVML_SUCCESS) {
      return Unavailable(Error("nvmlDeviceGetHandleByPciBusId_v2", r) + " for " + pci_bus_id);
    }
    return d;
  }
};

namespace {

template <typename F>
bool Resolve(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  return *fn != nullptr;
}

}  // namespace

Nvml::Nvml(std::unique_ptr<Api> api) : api_(std::move(api)) {}

Nvml::~Nvml() {
  if (api_->initialized) (void)api_->shutdown();
  if (api_->lib != nullptr) dlclose(api_->lib);
}

StatusOr<std::unique_ptr<Nvml>> Nvml::Load() {
  auto api = std::make_unique<Api>();
  api->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (api->lib == nullptr) {
    const char* why = dlerror();
    return Unavailable(std::string("dlopen(libnvidia-ml.so.1): ") +
                       (why != nullptr ? why : "not found"));
  }
  // From here the Nvml owns the library, so every return path closes it.
  std::unique_ptr<Nvml> nvml(new Nvml(std::move(api)));
  Api& a = *nvml->api_;
  if (!Resolve(a.lib, "nvmlInit_v2", &a.init) || !Resolve(a.lib, "nvmlShutdown", &a.shutdown) ||
      !Resolve(a.lib, "nvmlErrorString", &a.error_string) ||
      !Resolve(a.lib, "nvmlDeviceGetHandleByPciBusId_v2", &a.handle_by_pci) ||
      !Resolve(a.lib, "nvmlDeviceGetMemoryInfo", &a.memory_info) ||
      !Resolve(a.lib, "nvmlDeviceGetComputeRunningProcesses_v3", &a.compute_processes)) {
    return Unavailable("libnvidia-ml.so.1 lacks a function memest needs (driver older than "
                       "NVML API 11?)");
  }
  const nvmlReturn_t r = a.init();
  if (r != NVML_SUCCESS) return Unavailable(a.Error("nvmlInit_v2", r));
  a.initialized = true;
  return nvml;
}

StatusOr<int64_t> Nvml::DeviceUsedBytes(const std::string& pci_bus_id) {
  MEMEST_ASSIGN_OR_RETURN(nvmlDevice_t device, api_->Device(pci_bus_id));
  nvmlMemory_t mem{};
  const nvmlReturn_t r = api_->memory_info(device, &mem);
  if (r != NVML_SUCCESS) return Unavailable(api_->Error("nvmlDeviceGetMemoryInfo", r));
  return static_cast<int64_t>(mem.used);
}

StatusOr<int64_t> Nvml::ProcessUsedBytes(const std::string& pci_bus_id, unsigned int pid) {
  MEMEST_ASSIGN_OR_RETURN(nvmlDevice_t device, api_->Device(pci_bus_id));
  std::vector<nvmlProcessInfo_t> procs(64);
  unsigned int count = 0;
  nvmlReturn_t r = NVML_ERROR_INSUFFICIENT_SIZE;
  // The list can grow between the calls; a few tries with the size NVML asked for.
  for (int tries = 0; tries < 4 && r == NVML_ERROR_INSUFFICIENT_SIZE; ++tries) {
    count = static_cast<unsigned int>(procs.size());
    r = api_->compute_processes(device, &count, procs.data());
    if (r == NVML_ERROR_INSUFFICIENT_SIZE) procs.resize(count + 16);
  }
  if (r != NVML_SUCCESS) {
    return Unavailable(api_->Error("nvmlDeviceGetComputeRunningProcesses_v3", r));
  }
  for (unsigned int i = 0; i < count && i < procs.size(); ++i) {
    if (procs[i].pid != pid) continue;
    if (procs[i].usedGpuMemory == NVML_VALUE_NOT_AVAILABLE) {
      return Unavailable("NVML lists this process but withholds its memory use");
    }
    return static_cast<int64_t>(procs[i].usedGpuMemory);
  }
  return NotFound("NVML does not list pid " + std::to_string(pid) + " on " + pci_bus_id);
}

}  // namespace memest::kernels
