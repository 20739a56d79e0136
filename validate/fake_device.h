// A Device in bookkeeping only, for the tests of everything above the kernels: it hands out
// addresses, rounds allocations to the driver's 2 MiB pages as cudaMalloc does, and checks that
// every Touch and every operand of every Run lies inside memory it handed out and still holds
// (so a wrong address map in the replay is an error, not a silent pass). Nothing is computed;
// a run takes a time derived from its arithmetic.
#ifndef MEMEST_VALIDATE_FAKE_DEVICE_H_
#define MEMEST_VALIDATE_FAKE_DEVICE_H_

#include <map>
#include <string>

#include "validate/device.h"

namespace memest::validate {

struct FakeDeviceOptions {
  std::string name = "memest fake device";
  int64_t total_bytes = int64_t{80} << 30;
  int64_t used_by_others = 0;              // another process's memory on the same card
  int64_t context_bytes = int64_t{512} << 20;
  int64_t cublas_handle_bytes = int64_t{8} << 20;
  int64_t cudnn_handle_bytes = int64_t{2} << 20;
  bool measures_context = true;            // false: as a device without NVML (-1)
  int64_t conv_workspace_bytes = int64_t{3} << 20;  // what every convolution asks for
  int fail_run_after = -1;                 // the run after this many fails (-1: never)
};

class FakeDevice : public Device {
 public:
  explicit FakeDevice(FakeDeviceOptions options = {}) : o_(std::move(options)) {}

  StatusOr<DeviceProbe> Probe() override;
  StatusOr<DeviceMemInfo> MemInfo() override;
  StatusOr<DevicePtr> Malloc(int64_t bytes) override;
  Status Free(DevicePtr ptr) override;
  Status Touch(DevicePtr ptr, int64_t bytes) override;
  StatusOr<int64_t> WorkspaceBytes(const Work& work) override;
  StatusOr<Timing> Run(const Work& work, int repeats) override;
  Status Synchronize() override { return Status::Ok(); }

  int64_t held_bytes() const { return held_; }           // bytes malloc'd and not freed
  int64_t peak_held_bytes() const { return peak_held_; }
  int64_t touched_bytes() const { return touched_; }
  int runs(WorkKind kind) const;
  int runs_with_workspace(WorkKind kind) const;

 private:
  // OK when [ptr, ptr + bytes) lies inside one live allocation.
  Status CheckRange(DevicePtr ptr, int64_t bytes, const std::string& what) const;

  FakeDeviceOptions o_;
  std::map<DevicePtr, int64_t> live_;  // base -> page-rounded size
  DevicePtr next_ = DevicePtr{1} << 32;
  int64_t held_ = 0, peak_held_ = 0, touched_ = 0;
  int run_count_ = 0;
  std::map<WorkKind, int> runs_, runs_with_workspace_;
};

}  // namespace memest::validate

#endif  // MEMEST_VALIDATE_FAKE_DEVICE_H_
