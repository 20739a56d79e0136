// The engine's front door: a model and a run configuration in, a Report out.
//
// Estimate() is pure and thread-safe: it builds the graph of one micro-batch, applies the
// precision and checkpoint passes, schedules one training (or inference) step as PyTorch runs
// it, walks the schedule through the allocator model, and writes the report and advice.
#ifndef MEMEST_ENGINE_ESTIMATOR_H_
#define MEMEST_ENGINE_ESTIMATOR_H_

#include <memory>
#include <optional>

#include "engine/ir/budget.h"
#include "engine/ir/config.h"
#include "engine/ir/devices.h"
#include "engine/ir/nccl.h"
#include "engine/models/model.h"
#include "engine/passes/checkpoint.h"
#include "engine/passes/context_parallel.h"
#include "engine/passes/expert_parallel.h"
#include "engine/report/report.h"
#include "engine/step/liveness.h"
#include "engine/step/schedule.h"

namespace memest {

struct EstimateOptions {
  int64_t max_ops = 1'000'000;  // graphs with more ops are refused (RESOURCE_EXHAUSTED)
  bool advice = true;           // advice re-runs the estimate under alternatives; off is faster
  // What the request may spend (op steps, deadline, cancellation), shared by the estimate and its
  // advice; null: unlimited. A request whose one estimate cannot fit the budget is refused before
  // it is scheduled; advice that runs out of budget stops, and the report's notes say so.
  Budget* budget = nullptr;
  // With pipeline stages: estimate only the first and the last stage. A screen for planners: if
  // either does not fit, the split does not; the middle stages hold fewer micro-batches in
  // flight and neither the embeddings nor the head, but only the full estimate says which stage
  // needs the most. The report's pipeline.per_stage then lists the two, and no advice is made.
  bool end_stages_only = false;
};

// One step, planned: the graph as it runs (autocast casts inserted), its checkpoint regions,
// its schedule and the schedule's walk through the allocator. Estimate reports it; Validate
// replays its schedule on a device.
struct PlannedStep {
  const Graph* graph = nullptr;         // the built graph, or `owned` when a pass rewrote it
  std::unique_ptr<Graph> owned;
  std::optional<DeviceInfo> device;     // the device the config names, if any
  DeviceInfo fixed;                     // that device's fixed costs (a generic one's without)
  NcclMemory nccl;                      // NCCL's communicators on this rank (none on the CPU)
  CheckpointRegions regions;
  RankView rank;                        // the data-parallel rank estimated (world 1: none)
  // The tensor-parallel rank (graph points at its graph); null: no tensor parallelism.
  std::unique_ptr<TensorParallelView> tensor;
  // The context-parallel rank (applied before tensor parallelism); null: none.
  std::unique_ptr<ContextParallelView> context;
  // The expert-parallel rank (after tensor parallelism); null: none.
  std::unique_ptr<ExpertParallelView> expert;
  // An interleaved stage whose chunks' op ranges the passes above moved; null: the stage given.
  std::unique_ptr<PipelineStage> stage;
  Schedule schedule;
  Liveness live;
  // Serving: vLLM's fused-MoE workspace the graph holds (engine/passes/fused_moe_workspace.h).
  int64_t moe_workspace_bytes = 0;
};

// Plans the step of `built` (built for config.micro_batch()) under `config`, charging `budget`
// (null: unlimited). `built` must outlive the result. With pipeline stages, `built` is one
// stage's graph and `stage` says which (engine/passes/pipeline.h); a pipelined config without
// a stage is refused.
StatusOr<PlannedStep> PlanStep(const Graph& built, const RunConfig& config,
                               bool record_operands = false, Budget* budget = nullptr,
                               const PipelineStage* stage = nullptr);

// The report of a planned step (without advice).
Report ReportStep(const Graph& built, const RunConfig& config, const PlannedStep& step);

// What the front ends build one micro-batch of `config` with (its micro-batch, mode, dtypes,
// attention, device generation); the config validated first (ValidateRunConfig).
StatusOr<BuildContext> StepBuildContext(const RunConfig& config, int64_t max_ops,
                                        Budget* budget);

// Builds the graph of one micro-batch of `model` as `config` runs it; `budget` (null: none)
// can stop the build at its deadline or cancellation.
StatusOr<Graph> BuildStepGraph(const ModelSpec& model, const RunConfig& config,
                               int64_t max_ops = EstimateOptions{}.max_ops,
                               Budget* budget = nullptr);

StatusOr<Report> Estimate(const ModelSpec& model, const RunConfig& config,
                          const EstimateOptions& options = {});
// Estimate() past its build: `graph` is BuildStepGraph(model, config)'s (not a served model's,
// nor a quantized checkpoint's, which Estimate() routes elsewhere). Refuses a step that cannot
// afford its op steps within options.budget (RESOURCE_EXHAUSTED) before it is scheduled, then
// charges it, advice included.
StatusOr<Report> EstimateBuilt(const ModelSpec& model, const Graph& graph,
                               const RunConfig& config, const EstimateOptions& options = {});
// Whether Estimate(model, config) is EstimateBuilt(model, BuildGraph(model, StepBuildContext(
// config)), config): no served model, no quantized checkpoint, and none of BuildStepGraph's
// passes (fp8, quantization, adapters) rewrite the graph. A pass added to BuildStepGraph joins
// this test.
bool BuildsPlainGraph(const ModelSpec& model, const RunConfig& config);

// The device the estimate is for: a catalog entry (config.device), a bare capacity
// (config.device_capacity_bytes), or neither (nullopt: a generic device's fixed costs are used
// without a fit verdict). An unknown name is NOT_FOUND naming config.device_name.
StatusOr<std::optional<DeviceInfo>> ResolveDevice(const RunConfig& config);

// The same for a graph already built (what advice and inverse queries re-run).
StatusOr<Report> EstimateGraph(const Graph& graph, const RunConfig& config,
                               const EstimateOptions& options = {});

}  // namespace memest

#endif  // MEMEST_ENGINE_ESTIMATOR_H_
