#include "engine/ir/devices.h"

#include <gtest/gtest.h>

#include <cctype>
#include <set>
#include <string>
#include <vector>

namespace memest {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// Capacities as cudaMemGetInfo reports the total on each GPU (bytes).
struct CapacityCase {
  std::string name;
  int64_t capacity;
  int compute_capability;
};

TEST(DevicesTest, CatalogCapacities) {
  const std::vector<CapacityCase> cases = {
      {"a100-40gb", 42'505'273'344, 80}, {"a100-80gb", 85'051'572'224, 80},
      {"h100-80gb", 85'031'714'816, 90}, {"h200-141gb", 150'109'880'320, 90},
      {"l4", 23'580'639'232, 89},        {"rtx-4090", 25'393'692'672, 89},
      // torch.cuda.get_device_properties(0).total_memory as printed (MiB), docs/devices.md
      {"t4", 15109 * kMiB, 75},          {"a6000", 48676 * kMiB, 86},
      {"h100-pcie", 81008 * kMiB, 90},   {"b200", 182631 * kMiB, 100},
      {"mi300x", 196592 * kMiB, 0},      {"rtx-6000-ada", 50'865'307'648, 89},
      // estimated
      {"h100-nvl", 95363 * kMiB, 90},    {"l40", 47'697'362'944, 89},
  };
  for (const CapacityCase& c : cases) {
    StatusOr<DeviceInfo> d = FindDevice(c.name);
    ASSERT_TRUE(d.ok()) << c.name;
    EXPECT_EQ(d->name, c.name);
    EXPECT_EQ(d->capacity_bytes, c.capacity) << c.name;
    EXPECT_EQ(d->compute_capability, c.compute_capability) << c.name;
  }
  // H100 80GB: 85,031,714,816 bytes = 79.19 GiB.
  EXPECT_NEAR(FindDevice("h100-80gb")->capacity_bytes / double(int64_t{1} << 30), 79.19, 0.005);
}

TEST(DevicesTest, FixedCostsFollowTheArchitecture) {
  // PyTorch 2.x CUBLAS_WORKSPACE_CONFIG defaults: ":4096:8" on sm_90 (8 x 4 MiB), otherwise
  // ":4096:2:16:8" (2 x 4 MiB + 8 x 16 KiB). The MI300X (ROCm) takes the Hopper figure.
  for (const DeviceInfo& d : ListDevices()) {
    SCOPED_TRACE(d.name);
    if (d.compute_capability >= 90 || !d.cuda) {
      EXPECT_EQ(d.cublas_workspace_bytes, 32 * kMiB);
    } else {
      EXPECT_EQ(d.cublas_workspace_bytes, 8 * kMiB + 128 * 1024);
    }
    // A CUDA context with PyTorch's kernels loaded lazily: a few hundred MiB.
    EXPECT_GE(d.cuda_context_bytes, 256 * kMiB);
    EXPECT_LE(d.cuda_context_bytes, 1024 * kMiB);
    EXPECT_GT(d.capacity_bytes, d.cuda_context_bytes);
    EXPECT_FALSE(d.description.empty());
  }
}

TEST(DevicesTest, NamesAreUniqueAndLowerCase) {
  std::set<std::string> names;
  for (const DeviceInfo& d : ListDevices()) {
    EXPECT_TRUE(names.insert(d.name).second) << d.name;
    for (char c : d.name) EXPECT_FALSE(std::isupper(static_cast<unsigned char>(c))) << d.name;
  }
  EXPECT_GE(names.size(), 6u);
}

TEST(DevicesTest, AliasesAndCaseAreAccepted) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"H100", "h100-80gb"},      {"h100", "h100-80gb"}, {"a100", "a100-80gb"},
      {"A100-40GB", "a100-40gb"}, {"4090", "rtx-4090"},  {"RTX-4090", "rtx-4090"},
      {"h200", "h200-141gb"},     {"L4", "l4"},
  };
  for (const auto& [alias, name] : cases) {
    StatusOr<DeviceInfo> d = FindDevice(alias);
    ASSERT_TRUE(d.ok()) << alias;
    EXPECT_EQ(d->name, name) << alias;
  }
}

// The names schedulers use: NVML's (nvidia-smi), Kubernetes GPU feature discovery's
// nvidia.com/gpu.product labels (time-sliced: "-SHARED"), Slurm GRES specifications.
TEST(DevicesTest, SchedulerNamesAreAccepted) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"NVIDIA A100-SXM4-80GB", "a100-80gb"},   {"NVIDIA-A100-SXM4-80GB", "a100-80gb"},
      {"NVIDIA-A100-SXM4-40GB", "a100-40gb"},   {"NVIDIA-A100-80GB-PCIe", "a100-80gb"},
      {"NVIDIA-H100-80GB-HBM3", "h100-80gb"},   {"NVIDIA-H100-80GB-HBM3-SHARED", "h100-80gb"},
      {"NVIDIA H100 PCIe", "h100-pcie"},        {"NVIDIA-H100-NVL", "h100-nvl"},
      {"NVIDIA-H200", "h200-141gb"},            {"Tesla-T4", "t4"},
      {"Tesla T4", "t4"},                       {"Tesla-V100-SXM2-32GB", "v100-32gb"},
      {"NVIDIA-L40S", "l40s"},                  {"NVIDIA-L40", "l40"},
      {"NVIDIA-RTX-A6000", "a6000"},            {"NVIDIA-GeForce-RTX-4090", "rtx-4090"},
      {"NVIDIA B200", "b200"},                  {"AMD Instinct MI300X", "mi300x"},
      {"AMD_Instinct_MI300X", "mi300x"},        {"NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"},
      {"gpu:a100:4", "a100-80gb"},              {"gpu:a100_80gb", "a100-80gb"},
      {"gpu:h100", "h100-80gb"},                {"gpu:rtx_a6000:2", "a6000"},
      {"gpu:t4", "t4"},                         {"gpu:l40s:8", "l40s"},
  };
  for (const auto& [alias, name] : cases) {
    StatusOr<DeviceInfo> d = FindDevice(alias);
    ASSERT_TRUE(d.ok()) << alias << ": " << d.status().message();
    EXPECT_EQ(d->name, name) << alias;
  }
  StatusOr<DeviceInfo> mig = FindDevice("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb");
  ASSERT_FALSE(mig.ok());
  EXPECT_NE(mig.status().message().find("MIG slice"), std::string::npos);
}

// MI300X runs PyTorch through ROCm: estimated with its capacity, never validated.
TEST(DevicesTest, Mi300xIsNotCuda) {
  const DeviceInfo d = FindDevice("mi300x").value();
  EXPECT_FALSE(d.cuda);
  EXPECT_EQ(AttentionCapability(d), 90);
  EXPECT_EQ(AttentionCapability(FindDevice("t4").value()), 75);
  for (const DeviceInfo& g : ListDevices()) EXPECT_EQ(g.cuda, g.name != "mi300x") << g.name;
}

// Eager module loading adds what pytorch/pytorch#86509 measured (1.13, CUDA 11.7): 666,632,192
// - 287,047,680 bytes.
TEST(DevicesTest, EagerModuleLoadingGrowsTheContext) {
  const DeviceInfo d = FindDevice("a100").value();
  EXPECT_EQ(CudaContextBytes(d, ModuleLoading::kLazy), 430 * kMiB);
  EXPECT_EQ(CudaContextBytes(d, ModuleLoading::kEager), 430 * kMiB + 379'584'512);
}

// CUBLAS_WORKSPACE_CONFIG as PyTorch's CublasHandlePool parses it: SIZE KiB x COUNT summed.
TEST(DevicesTest, CublasWorkspaceConfigIsParsedAsPyTorchDoes) {
  EXPECT_EQ(CublasWorkspaceBytes(":4096:8", "f").value(), 32 * 1024 * 1024);
  EXPECT_EQ(CublasWorkspaceBytes(":4096:2:16:8", "f").value(), 8 * 1024 * 1024 + 128 * 1024);
  EXPECT_EQ(CublasWorkspaceBytes(":16:8", "f").value(), 128 * 1024);
  EXPECT_EQ(CublasWorkspaceBytes(":0:8", "f").value(), 0);
  for (const char* bad : {"", "4096:8", ":4096", ":4096:8:", ":4096:x", ": 4096:8", ":-1:8",
                          ":1099511627777:1", ":1048576:1048577"}) {
    StatusOr<int64_t> b = CublasWorkspaceBytes(bad, "config.cublas_workspace_config");
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().message().rfind("config.cublas_workspace_config: ", 0), 0u) << bad;
  }
}

TEST(DevicesTest, UnknownDeviceIsNotFoundAndListsTheCatalog) {
  StatusOr<DeviceInfo> d = FindDevice("tpu-v5");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(d.status().message().rfind("unknown device 'tpu-v5'", 0), 0u);
  for (const DeviceInfo& info : ListDevices()) {
    EXPECT_NE(d.status().message().find(info.name), std::string::npos) << info.name;
  }
}

TEST(DevicesTest, BareDevice) {
  DeviceInfo d = BareDevice(int64_t{16} << 30);
  EXPECT_EQ(d.capacity_bytes, int64_t{16} << 30);
  EXPECT_GT(d.cuda_context_bytes, 0);
  EXPECT_GT(d.cublas_workspace_bytes, 0);
  EXPECT_FALSE(d.name.empty());
}

}  // namespace
}  // namespace memest
