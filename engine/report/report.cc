#include "engine/report/report.h"

#include <cstdio>
#include <iterator>

namespace memest {

const char* CategoryName(Category c) {
  switch (c) {
    case Category::kParameters: return "parameters";
    case Category::kGradients: return "gradients";
    case Category::kOptimizerState: return "optimizer_state";
    case Category::kMasterAndCasts: return "master_and_cast_copies";
    case Category::kActivations: return "activations";
    case Category::kTemporaries: return "temporaries";
    case Category::kInputs: return "inputs";
    case Category::kKvCache: return "kv_cache";
    case Category::kWorkspace: return "workspace";
    case Category::kCommunication: return "communication";
    case Category::kAllocatorOverhead: return "allocator_overhead";
    case Category::kCudaContext: return "cuda_context";
    case Category::kNccl: return "nccl";
    case Category::kCount: break;
  }
  return "?";
}

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kData: return "data";
    case Phase::kForward: return "forward";
    case Phase::kLoss: return "loss";
    case Phase::kBackward: return "backward";
    case Phase::kOptimizerStep: return "optimizer_step";
    case Phase::kCount: break;
  }
  return "?";
}

namespace {

// Three significant figures: 1.23, 12.3, 123.
std::string ThreeFigures(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), value < 10 ? "%.2f" : value < 100 ? "%.1f" : "%.0f", value);
  return buf;
}

}  // namespace

std::string FormatBytes(int64_t bytes) {
  if (bytes < 0) return "-" + FormatBytes(bytes == INT64_MIN ? INT64_MAX : -bytes);
  if (bytes < 1024) return std::to_string(bytes) + " B";
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  // Move up a unit before rounding could print "1024 KiB".
  while (value >= 999.5 && unit + 1 < static_cast<int>(std::size(kUnits))) {
    value /= 1024.0;
    ++unit;
  }
  return ThreeFigures(value) + " " + kUnits[unit];
}

std::string NcclNote(const NcclMemory& nccl) {
  std::string text = "NCCL: " + FormatBytes(nccl.bytes) +
                     " outside PyTorch's allocator, for the communicators of this rank's groups (";
  for (size_t i = 0; i < nccl.communicators.size(); ++i) {
    const NcclCommunicator& c = nccl.communicators[i];
    text += (i > 0 ? "; " : "") + c.group + ": " + std::to_string(c.ranks) + " ranks, " +
            (c.local_ranks == c.ranks ? "on one node" : std::to_string(c.local_ranks) + " per node") +
            (c.p2p_peers > 0 ? ", send/recv to " + std::to_string(c.p2p_peers) + " peer(s)" : "") +
            ", " + FormatBytes(c.bytes);
  }
  return text + "): NCCL 2.22-2.27's defaults (NCCL_BUFFSIZE 4 MiB, cuMem), as connected once "
                "each group has run its collectives (docs/nccl.md)";
}

}  // namespace memest
