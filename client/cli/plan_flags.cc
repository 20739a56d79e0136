#include "client/cli/plan_flags.h"

#include <utility>

#include "client/cli/capacity.h"

namespace memest::cli {

void AddPlanFlags(CLI::App* app, PlanFlags* f) {
  AddEstimateFlags(app, &f->model);
  const char* group = "Plan";
  app->add_option("--gpus", f->max_gpus,
                  "the GPU budget: counts tried are the powers of two up to it, and it "
                  "(default 8)")
      ->group(group)
      ->type_name("N");
  app->add_option("--devices", f->devices,
                  "GPU types to plan on (catalog names, comma-separated, or all; with or instead "
                  "of --device); per GPU count the smallest type that fits comes first")
      ->group(group)
      ->delimiter(',')
      ->type_name("NAMES");
  app->add_option("--max-plans", f->max_plans, "the most plans listed (default 20)")
      ->group(group)
      ->type_name("N");
  app->add_flag("--brief", f->brief,
                "each plan as one line (\"4 x h100-80gb: dp x tp x pp 4 x 1 x 1 fsdp2, "
                "micro-batch 1 x 4, needs 63.1 GiB a GPU\"), nothing else; for scripts")
      ->group(group);
  app->add_option("--host-memory-per-gpu", f->host_memory_per_gpu,
                  "host memory each GPU's rank may take for CPU offload (e.g. 200GiB: the "
                  "node's RAM for the job over its GPUs); where nothing fits on the GPUs alone, "
                  "plans with DeepSpeed's or FSDP's offload are tried (default: none)")
      ->group(group)
      ->type_name("SIZE");
}

StatusOr<v1::PlanRequest> BuildPlanRequest(const PlanFlags& flags) {
  MEMEST_ASSIGN_OR_RETURN(v1::EstimateRequest estimate, BuildEstimateRequest(flags.model));
  v1::PlanRequest request;
  *request.mutable_model() = std::move(*estimate.mutable_model());
  *request.mutable_config() = std::move(*estimate.mutable_config());
  for (const std::string& d : flags.devices) request.add_devices(d);
  if (flags.max_gpus < 0 || flags.max_plans < 0) {
    return InvalidArgument(flags.max_gpus < 0 ? "--gpus: must be positive"
                                              : "--max-plans: must be positive");
  }
  request.set_max_gpus(flags.max_gpus);
  request.set_max_plans(flags.max_plans);
  if (!flags.host_memory_per_gpu.empty()) {
    StatusOr<int64_t> bytes = ParseCapacity(flags.host_memory_per_gpu);
    if (!bytes.ok()) {
      return InvalidArgument("--host-memory-per-gpu: " + bytes.status().message());
    }
    request.set_host_memory_per_gpu_bytes(*bytes);
  }
  return request;
}

}  // namespace memest::cli
