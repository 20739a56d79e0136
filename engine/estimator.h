// The engine's front door: a model and a run configuration in, a Report out.
//
// Estimate() is pure and thread-safe: it builds the graph of one micro-batch, applies the
// precision and checkpoint passes, schedules one training (or inference) step as PyTorch runs
// it, walks the schedule through the allocator model, and writes the report and advice.
#ifndef MEMEST_ENGINE_ESTIMATOR_H_
#define MEMEST_ENGINE_ESTIMATOR_H_

#include "engine/config.h"
#include "engine/model.h"
#include "engine/report.h"

namespace memest {

struct EstimateOptions {
  int64_t max_ops = 1'000'000;  // graphs with more ops are refused (RESOURCE_EXHAUSTED)
  bool advice = true;           // advice re-runs the estimate under alternatives; off is faster
};

StatusOr<Report> Estimate(const ModelSpec& model, const RunConfig& config,
                          const EstimateOptions& options = {});

// The same for a graph already built (what advice and inverse queries re-run).
StatusOr<Report> EstimateGraph(const Graph& graph, const RunConfig& config,
                               const EstimateOptions& options = {});

}  // namespace memest

#endif  // MEMEST_ENGINE_ESTIMATOR_H_
