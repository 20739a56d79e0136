// The notes a step's report carries (engine/estimator.cc's ReportStep): what the estimate
// assumed and what each pass changed, in words.
#ifndef MEMEST_ENGINE_STEP_NOTES_H_
#define MEMEST_ENGINE_STEP_NOTES_H_

#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/passes/checkpoint.h"
#include "engine/passes/context_parallel.h"
#include "engine/passes/expert_parallel.h"
#include "engine/passes/tensor_parallel.h"
#include "engine/report/report.h"

namespace memest {

// The run's notes: holds, precision, quantization and adapters, serving's fused-MoE workspace
// (its bytes, PlanStep's; 0: none), checkpoint regions, the device.
void AddNotes(const Graph& graph, const RunConfig& config, const CheckpointRegions& regions,
              bool has_device, int64_t moe_workspace_bytes, Report* r);
// Tensor and context parallelism's (their bytes added to communicated_bytes_per_step).
void AddTensorParallelNotes(const RunConfig& config, const TensorParallelView& tp, Report* r);
void AddContextParallelNotes(const RunConfig& config, const ContextParallelView& cp, Report* r);
// Expert parallelism's: the rank estimated and the one that receives the least (also as
// report.expert_parallel).
void AddExpertParallelNotes(const RunConfig& config, const ExpertParallelView& ep, Report* r);

}  // namespace memest

#endif  // MEMEST_ENGINE_STEP_NOTES_H_
