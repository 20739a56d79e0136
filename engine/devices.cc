// The device catalog.
//
// capacity_bytes is the total that cudaMemGetInfo (torch.cuda.mem_get_info()[1]) reports,
// which is less than the marketing size and less than nvidia-smi's total: the driver keeps
// some memory back. Figures marked "measured" were read on the device; those marked
// "estimated" are the nominal size minus the usual driver reservation of their generation and
// are to be replaced by measurements.
//
// cuda_context_bytes is a typical measured value of what a PyTorch 2.x process holds outside
// its caching allocator once CUDA is initialised and the first kernels have loaded (driver
// context, cuBLAS/cuDNN handles, kernel images loaded lazily with CUDA_MODULE_LOADING=LAZY).
// It varies with the driver, the CUDA version and the libraries loaded; validation (issue 5)
// measures it on the device at hand.
//
// cublas_workspace_bytes is PyTorch 2.x's default CUBLAS_WORKSPACE_CONFIG, allocated through
// the caching allocator per handle and stream: ":4096:8" (8 chunks of 4 MiB = 32 MiB) on sm_90
// and later, ":4096:2:16:8" (2 x 4 MiB + 8 x 16 KiB = 8 MiB + 128 KiB) on earlier GPUs.
#include "engine/devices.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "engine/text.h"

namespace memest {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kHopperWorkspace = 32 * kMiB;
constexpr int64_t kDefaultWorkspace = 8 * kMiB + 128 * 1024;

struct Alias {
  const char* alias;
  const char* name;
};

const std::vector<DeviceInfo>& Catalog() {
  static const auto* catalog = new std::vector<DeviceInfo>{
      // measured
      {"a100-40gb", "NVIDIA A100 40GB (SXM4/PCIe)", 42'505'273'344, 430 * kMiB, kDefaultWorkspace,
       80},
      {"a100-80gb", "NVIDIA A100 80GB (SXM4/PCIe)", 85'051'572'224, 430 * kMiB, kDefaultWorkspace,
       80},
      {"h100-80gb", "NVIDIA H100 80GB HBM3 (SXM)", 85'031'714'816, 500 * kMiB, kHopperWorkspace,
       90},
      {"h200-141gb", "NVIDIA H200 141GB HBM3e", 150'754'820'096, 500 * kMiB, kHopperWorkspace, 90},
      {"l4", "NVIDIA L4 24GB", 23'580'639'232, 380 * kMiB, kDefaultWorkspace, 89},
      {"rtx-4090", "NVIDIA GeForce RTX 4090 24GB", 25'393'692'672, 380 * kMiB, kDefaultWorkspace,
       89},
      // estimated
      {"v100-32gb", "NVIDIA V100 32GB (SXM2/PCIe)", 34'089'730'048, 310 * kMiB, kDefaultWorkspace,
       70},
      {"a10g", "NVIDIA A10G 24GB (AWS g5)", 23'836'098'560, 350 * kMiB, kDefaultWorkspace, 86},
      {"l40s", "NVIDIA L40S 48GB", 47'697'362'944, 380 * kMiB, kDefaultWorkspace, 89},
      {"rtx-3090", "NVIDIA GeForce RTX 3090 24GB", 25'447'170'048, 350 * kMiB, kDefaultWorkspace,
       86},
  };
  return *catalog;
}

constexpr Alias kAliases[] = {
    {"a100", "a100-80gb"},   {"a100-80g", "a100-80gb"}, {"a100-40g", "a100-40gb"},
    {"h100", "h100-80gb"},   {"h100-sxm", "h100-80gb"}, {"h200", "h200-141gb"},
    {"4090", "rtx-4090"},    {"rtx4090", "rtx-4090"},   {"3090", "rtx-3090"},
    {"rtx3090", "rtx-3090"}, {"v100", "v100-32gb"},     {"l40", "l40s"},
};

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

const std::vector<DeviceInfo>& ListDevices() { return Catalog(); }

StatusOr<DeviceInfo> FindDevice(std::string_view name) {
  std::string key = Lower(name);
  for (const Alias& a : kAliases) {
    if (key == a.alias) key = a.name;
  }
  std::string names;
  for (const DeviceInfo& d : Catalog()) {
    if (d.name == key) return d;
    names += (names.empty() ? "" : ", ") + d.name;
  }
  return NotFound("unknown device " + Quote(name) + "; known: " + names +
                  " (or give device_capacity_bytes)");
}

DeviceInfo BareDevice(int64_t capacity_bytes) {
  DeviceInfo d;
  d.name = "bare";
  d.description = "a device of " + std::to_string(capacity_bytes) +
                  " bytes with the fixed costs of a current datacenter GPU (H100-class)";
  d.capacity_bytes = capacity_bytes;
  d.cuda_context_bytes = 500 * kMiB;
  d.cublas_workspace_bytes = kHopperWorkspace;
  d.compute_capability = 90;
  return d;
}

}  // namespace memest
