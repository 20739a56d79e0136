#include "validate/fake_device.h"

#include "engine/report/report.h"

namespace memest::validate {
namespace {
constexpr int64_t kPage = int64_t{2} << 20;
int64_t Pages(int64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }
}  // namespace

StatusOr<DeviceProbe> FakeDevice::Probe() {
  DeviceProbe p;
  p.name = o_.name;
  p.compute_capability = 90;
  p.driver_version = "fake";
  p.runtime_version = "fake";
  p.total_bytes = o_.total_bytes;
  MEMEST_ASSIGN_OR_RETURN(DeviceMemInfo m, MemInfo());
  p.free_bytes = m.free_bytes;
  if (o_.measures_context) {
    p.context_bytes = o_.context_bytes;
    p.cublas_handle_bytes = o_.cublas_handle_bytes;
    p.cudnn_handle_bytes = o_.cudnn_handle_bytes;
  } else {
    p.notes.push_back("NVML is not available: the CUDA context's footprint is not measured");
  }
  return p;
}

StatusOr<DeviceMemInfo> FakeDevice::MemInfo() {
  const int64_t used = o_.used_by_others + o_.context_bytes + o_.cublas_handle_bytes +
                       o_.cudnn_handle_bytes + held_;
  return DeviceMemInfo{o_.total_bytes, std::max<int64_t>(0, o_.total_bytes - used)};
}

StatusOr<DevicePtr> FakeDevice::Malloc(int64_t bytes) {
  if (bytes <= 0) return InvalidArgument("cudaMalloc: size must be positive, got " + std::to_string(bytes));
  MEMEST_ASSIGN_OR_RETURN(DeviceMemInfo m, MemInfo());
  const int64_t size = Pages(bytes);
  if (size > m.free_bytes) {
    return ResourceExhausted("cudaMalloc(" + FormatBytes(bytes) + "): out of memory (" +
                             FormatBytes(m.free_bytes) + " free)");
  }
  const DevicePtr p = next_;
  next_ += static_cast<DevicePtr>(size + kPage);  // never adjacent: overruns are caught
  live_[p] = size;
  held_ += size;
  peak_held_ = std::max(peak_held_, held_);
  return p;
}

Status FakeDevice::Free(DevicePtr ptr) {
  auto it = live_.find(ptr);
  if (it == live_.end()) return InvalidArgument("cudaFree: not an allocation");
  held_ -= it->second;
  live_.erase(it);
  return Status::Ok();
}

Status FakeDevice::CheckRange(DevicePtr ptr, int64_t bytes, const std::string& what) const {
  auto it = live_.upper_bound(ptr);
  if (it == live_.begin()) return Internal(what + ": address outside any allocation");
  --it;
  if (ptr + static_cast<DevicePtr>(bytes) > it->first + static_cast<DevicePtr>(it->second)) {
    return Internal(what + ": " + std::to_string(bytes) + " bytes run past the allocation");
  }
  return Status::Ok();
}

Status FakeDevice::Touch(DevicePtr ptr, int64_t bytes) {
  MEMEST_RETURN_IF_ERROR(CheckRange(ptr, bytes, "touch"));
  touched_ += bytes;
  return Status::Ok();
}

StatusOr<int64_t> FakeDevice::WorkspaceBytes(const Work& work) {
  const bool conv = work.kind == WorkKind::kConvForward || work.kind == WorkKind::kConvBackwardData ||
                    work.kind == WorkKind::kConvBackwardFilter;
  return conv ? o_.conv_workspace_bytes : 0;
}

StatusOr<Timing> FakeDevice::Run(const Work& work, int repeats) {
  if (o_.fail_run_after >= 0 && run_count_ >= o_.fail_run_after) {
    return Internal("fake device fault (fail_run_after)");
  }
  ++run_count_;
  const WorkBytes need = BytesNeeded(work);
  if (work.inputs.size() != need.inputs.size()) {
    return Internal(std::string(WorkKindName(work.kind)) + ": " + std::to_string(work.inputs.size()) +
                    " operands, expected " + std::to_string(need.inputs.size()));
  }
  for (size_t k = 0; k < work.inputs.size(); ++k) {
    MEMEST_RETURN_IF_ERROR(CheckRange(work.inputs[k], need.inputs[k],
                                      std::string(WorkKindName(work.kind)) + " input " + std::to_string(k)));
  }
  MEMEST_RETURN_IF_ERROR(CheckRange(work.output, need.output,
                                    std::string(WorkKindName(work.kind)) + " output"));
  if (work.workspace_bytes > 0) {
    MEMEST_RETURN_IF_ERROR(CheckRange(work.workspace, work.workspace_bytes, "workspace"));
    ++runs_with_workspace_[work.kind];
  }
  ++runs_[work.kind];
  // A nominal 100 TFLOP/s for GEMMs and 2 TB/s for everything else.
  double ms = 0;
  if (work.kind == WorkKind::kGemm) {
    ms = 2.0 * work.gemm.batch * work.gemm.m * work.gemm.n * work.gemm.k / 1e14 * 1e3;
  } else {
    int64_t bytes = need.output;
    for (int64_t b : need.inputs) bytes += b;
    ms = static_cast<double>(bytes) / 2e12 * 1e3;
  }
  return Timing{ms, repeats};
}

int FakeDevice::runs(WorkKind kind) const {
  auto it = runs_.find(kind);
  return it == runs_.end() ? 0 : it->second;
}

int FakeDevice::runs_with_workspace(WorkKind kind) const {
  auto it = runs_with_workspace_.find(kind);
  return it == runs_with_workspace_.end() ? 0 : it->second;
}

}  // namespace memest::validate
