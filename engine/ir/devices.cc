// The device catalog. docs/devices.md gives the source of every figure.
//
// capacity_bytes is the total that cudaMemGetInfo (torch.cuda.mem_get_info()[1], the same as
// get_device_properties().total_memory) reports, which is less than the marketing size and
// less than nvidia-smi's total: the driver keeps some memory back. `measured` entries were read
// on the device (or printed by PyTorch there, in MiB); the others are estimated from nvidia-smi's
// total less what the driver keeps back on a sibling, and are to be replaced by measurements.
//
// cuda_context_bytes is what a PyTorch 2.x process holds outside its caching allocator once
// CUDA is initialised and the first kernels have loaded, with lazy module loading: published
// figures are about 300 to 430 MiB (docs/devices.md); eager loading adds the kernel images of
// every library at initialisation (kEagerLoadingExtra, measured for PyTorch 1.13 / CUDA 11.7).
// Validation (issue 5) measures it on the device at hand.
//
// cublas_workspace_bytes is PyTorch 2.x's default CUBLAS_WORKSPACE_CONFIG, allocated through
// the caching allocator per handle and stream: ":4096:8" (8 chunks of 4 MiB = 32 MiB) on sm_90
// and later, ":4096:2:16:8" (2 x 4 MiB + 8 x 16 KiB = 8 MiB + 128 KiB) on earlier GPUs.
#include "engine/ir/devices.h"

#include "engine/ir/shape.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "engine/ir/text.h"

namespace memest {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kHopperWorkspace = 32 * kMiB;
constexpr int64_t kDefaultWorkspace = 8 * kMiB + 128 * 1024;
// pytorch/pytorch#86509 (PyTorch 1.13, CUDA 11.7): total - free after one small tensor was
// 287,047,680 bytes lazily and 666,632,192 bytes with CUDA_MODULE_LOADING=DEFAULT (eager).
constexpr int64_t kEagerLoadingExtra = 666'632'192 - 287'047'680;
// Measured on an H200 (driver 580, PyTorch 2.11.0+cu130): total - free - reserved once CUDA is
// initialised and a float32 matmul has run forward and backward (docs/gpu-records.md).
constexpr int64_t kH200Context = 785'186'816;

struct Alias {
  const char* alias;
  const char* name;
};

// `sms`: streaming multiprocessors (AMD: compute units), from each GPU's data sheet.
DeviceInfo Gpu(const char* name, const char* description, int64_t capacity, int64_t context,
               int cc, int sms, bool measured) {
  DeviceInfo d;
  d.multiprocessors = sms;
  d.name = name;
  d.description = description;
  d.capacity_bytes = capacity;
  d.cuda_context_bytes = context;
  d.cublas_workspace_bytes = cc >= 90 ? kHopperWorkspace : kDefaultWorkspace;
  d.compute_capability = cc;
  d.measured = measured;
  return d;
}

const std::vector<DeviceInfo>& Catalog() {
  static const auto* catalog = [] {
    auto* c = new std::vector<DeviceInfo>{
        // measured
        Gpu("a100-40gb", "NVIDIA A100 40GB (SXM4/PCIe)", 42'505'273'344, 430 * kMiB, 80, 108, true),
        Gpu("a100-80gb", "NVIDIA A100 80GB (SXM4/PCIe)", 85'051'572'224, 430 * kMiB, 80, 108, true),
        Gpu("h100-80gb", "NVIDIA H100 80GB HBM3 (SXM)", 85'031'714'816, 500 * kMiB, 90, 132, true),
        Gpu("h100-pcie", "NVIDIA H100 PCIe 80GB", 81008 * kMiB, 500 * kMiB, 90, 114, true),
        Gpu("h200-141gb", "NVIDIA H200 141GB HBM3e", 150'109'880'320, kH200Context, 90, 132, true),
        Gpu("b200", "NVIDIA B200 180GB HBM3e", 182631 * kMiB, 500 * kMiB, 100, 148, true),
        Gpu("l4", "NVIDIA L4 24GB", 23'580'639'232, 380 * kMiB, 89, 58, true),
        Gpu("t4", "NVIDIA Tesla T4 16GB", 15109 * kMiB, 310 * kMiB, 75, 40, true),
        Gpu("a6000", "NVIDIA RTX A6000 48GB", 48676 * kMiB, 350 * kMiB, 86, 84, true),
        Gpu("rtx-6000-ada", "NVIDIA RTX 6000 Ada Generation 48GB", 50'865'307'648, 426 * kMiB, 89,
            142, true),
        Gpu("rtx-4090", "NVIDIA GeForce RTX 4090 24GB", 25'393'692'672, 380 * kMiB, 89, 128, true),
        Gpu("mi300x", "AMD Instinct MI300X 192GB (ROCm: estimated, never validated)",
            196592 * kMiB, 500 * kMiB, 0, 304, true),
        // estimated
        Gpu("h100-nvl", "NVIDIA H100 NVL 94GB", 95363 * kMiB, 500 * kMiB, 90, 132, false),
        Gpu("v100-32gb", "NVIDIA V100 32GB (SXM2/PCIe)", 34'089'730'048, 310 * kMiB, 70, 80, false),
        Gpu("a10g", "NVIDIA A10G 24GB (AWS g5)", 23'836'098'560, 350 * kMiB, 86, 80, false),
        Gpu("l40", "NVIDIA L40 48GB", 47'697'362'944, 380 * kMiB, 89, 142, false),
        Gpu("l40s", "NVIDIA L40S 48GB", 47'697'362'944, 380 * kMiB, 89, 142, false),
        Gpu("rtx-3090", "NVIDIA GeForce RTX 3090 24GB", 25'447'170'048, 350 * kMiB, 86, 82, false),
    };
    for (DeviceInfo& d : *c) {
      if (d.name == "mi300x") {
        d.cuda = false;
        d.cublas_workspace_bytes = kHopperWorkspace;  // hipBLASLt's, through the allocator
      }
    }
    return c;
  }();
  return *catalog;
}

// Keys are normalized (Normalize below): lower case, '-' for spaces and '_', the "gpu:" of a
// GRES and its count removed, and a leading "nvidia-", "tesla-", "geforce-", "amd-instinct-"
// removed.
constexpr Alias kAliases[] = {
    // short names
    {"a100", "a100-80gb"},
    {"a100-80g", "a100-80gb"},
    {"a100-40g", "a100-40gb"},
    {"h100", "h100-80gb"},
    {"h100-sxm", "h100-80gb"},
    {"h100-sxm5", "h100-80gb"},
    {"h100-80g", "h100-80gb"},
    {"h200", "h200-141gb"},
    {"h200-sxm", "h200-141gb"},
    {"4090", "rtx-4090"},
    {"rtx4090", "rtx-4090"},
    {"3090", "rtx-3090"},
    {"rtx3090", "rtx-3090"},
    {"v100", "v100-32gb"},
    {"a10", "a10g"},
    {"rtx-a6000", "a6000"},
    {"rtxa6000", "a6000"},
    {"rtx6000ada", "rtx-6000-ada"},
    {"rtx-6000-ada-generation", "rtx-6000-ada"},
    {"mi300", "mi300x"},
    {"b200-180gb", "b200"},
    // NVML names (nvidia-smi --query-gpu=name), and so GPU feature discovery's labels
    {"a100-sxm4-40gb", "a100-40gb"},
    {"a100-pcie-40gb", "a100-40gb"},
    {"a100-sxm4-80gb", "a100-80gb"},
    {"a100-80gb-pcie", "a100-80gb"},
    {"h100-80gb-hbm3", "h100-80gb"},
    {"h100-sxm5-80gb", "h100-80gb"},
    {"h100-80gb-pcie", "h100-pcie"},
    {"h100-pcie-80gb", "h100-pcie"},
    {"h200-141gb-hbm3e", "h200-141gb"},
    {"v100-sxm2-32gb", "v100-32gb"},
    {"v100-pcie-32gb", "v100-32gb"},
    {"v100s-pcie-32gb", "v100-32gb"},
    {"rtx-4090-24gb", "rtx-4090"},
    // Slurm GRES type names in common use
    {"a100-80gb-sxm", "a100-80gb"},
    {"a100-40gb-sxm", "a100-40gb"},
    {"h100-94gb", "h100-nvl"},
    {"t4-16gb", "t4"},
    {"a6000-48gb", "a6000"},
    {"l40s-48gb", "l40s"},
    {"l40-48gb", "l40"},
};

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

bool StripPrefix(std::string* s, std::string_view prefix) {
  if (s->size() <= prefix.size() || s->compare(0, prefix.size(), prefix) != 0) return false;
  s->erase(0, prefix.size());
  return true;
}

bool StripSuffix(std::string* s, std::string_view suffix) {
  if (s->size() <= suffix.size() ||
      s->compare(s->size() - suffix.size(), suffix.size(), suffix) != 0) {
    return false;
  }
  s->resize(s->size() - suffix.size());
  return true;
}

std::string Normalize(std::string_view name) {
  std::string key = Lower(name);
  // Slurm: "gpu:<type>[:<count>]".
  if (StripPrefix(&key, "gpu:")) {
    const size_t colon = key.find(':');
    if (colon != std::string::npos) key.resize(colon);
  }
  for (char& c : key) {
    if (c == ' ' || c == '_') c = '-';
  }
  StripSuffix(&key, "-shared");  // GPU feature discovery's label of a time-sliced GPU
  for (std::string_view vendor : {"nvidia-", "tesla-", "geforce-", "amd-instinct-", "amd-"}) {
    StripPrefix(&key, vendor);
  }
  StripPrefix(&key, "geforce-");  // "NVIDIA GeForce RTX 4090"
  return key;
}

}  // namespace

const std::vector<DeviceInfo>& ListDevices() { return Catalog(); }

StatusOr<DeviceInfo> FindDevice(std::string_view name) {
  std::string key = Normalize(name);
  if (key.find("-mig-") != std::string::npos) {
    return NotFound("device " + Quote(name) +
                    " is a MIG slice, which the catalog does not list; give its memory as "
                    "device_capacity_bytes");
  }
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
  d.multiprocessors = kDatacenterMultiprocessors;
  return d;
}

int64_t CudaContextBytes(const DeviceInfo& device, ModuleLoading loading) {
  if (loading == ModuleLoading::kLazy || device.cuda_context_bytes == 0) {
    return device.cuda_context_bytes;
  }
  return device.cuda_context_bytes + kEagerLoadingExtra;
}

int AttentionCapability(const DeviceInfo& device) {
  return device.cuda ? device.compute_capability : 90;
}

StatusOr<int64_t> CublasWorkspaceBytes(const std::string& config, const std::string& field) {
  // getChosenWorkspaceSize: std::regex ":[0-9]+:[0-9]+" over the variable; each match adds
  // size * 1024 * count. memest takes only text made of such pairs (anything else there is a
  // typo PyTorch would skip silently).
  const auto bad = [&](const std::string& why) {
    return InvalidArgument(field + ": " + why + "; CUBLAS_WORKSPACE_CONFIG is \":SIZE_KIB:COUNT\" "
                           "pairs, e.g. \":4096:8\" (32 MiB) or \":4096:2:16:8\" (8 MiB + 128 KiB)");
  };
  if (config.size() > 256) return bad("longer than 256 characters");
  size_t i = 0;
  int64_t total = 0;
  while (i < config.size()) {
    int64_t numbers[2] = {0, 0};
    for (int64_t& n : numbers) {
      if (config[i] != ':') return bad("expected ':' at character " + std::to_string(i));
      ++i;
      const size_t start = i;
      while (i < config.size() && config[i] >= '0' && config[i] <= '9') {
        if (n > (int64_t{1} << 40)) return bad("a number too large");
        n = 10 * n + (config[i] - '0');
        ++i;
      }
      if (i == start) return bad("expected a number at character " + std::to_string(start));
      if (i < config.size() && config[i] != ':') return bad("unexpected '" + config.substr(i, 1) + "'");
    }
    StatusOr<int64_t> bytes = CheckedMul(numbers[0] * 1024, numbers[1]);  // numbers < 2^44
    if (bytes.ok()) bytes = CheckedAdd(total, *bytes);
    if (!bytes.ok() || *bytes > (int64_t{1} << 40)) return bad("more than 1 TiB of workspace");
    total = *bytes;
  }
  if (config.empty()) return bad("empty");
  return total;
}

}  // namespace memest
