// The flags of `memest plan` (the model and the run as for estimate, plus the GPU budget) and
// the PlanRequest they make.
#ifndef MEMEST_CLIENT_CLI_PLAN_FLAGS_H_
#define MEMEST_CLIENT_CLI_PLAN_FLAGS_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "client/cli/flags.h"
#include "engine/ir/status.h"
#include "memest/v1/memest.pb.h"

namespace memest::cli {

struct PlanFlags {
  EstimateFlags model;               // --batch is the global batch
  std::vector<std::string> devices;  // --devices a,b (besides --device)
  int64_t max_gpus = 0;              // 0: the server's default (8)
  int64_t max_plans = 0;             // 0: the server's default (20)
  std::string host_memory_per_gpu;   // --host-memory-per-gpu 200GiB: offload plans allowed
  bool brief = false;                // --brief: each plan as one line, nothing else
};

void AddPlanFlags(CLI::App* app, PlanFlags* flags);
StatusOr<v1::PlanRequest> BuildPlanRequest(const PlanFlags& flags);

}  // namespace memest::cli

#endif  // MEMEST_CLIENT_CLI_PLAN_FLAGS_H_
