// Estimates of one model under many run configurations: a scheduler's sweep of batch sizes,
// precisions, optimizers, devices and parallel splits, the Sweep RPC.
//
// Each estimate is the report Estimate(model, config, options) gives, byte for byte. What a
// sweep saves is the graph: a run configuration shapes the graph only through the BuildContext
// it resolves to (its micro-batch, mode, dtypes, attention kernel, device generation, ...:
// GraphKeyOf in engine/models/model.h), so configurations that differ in what the step does
// with the graph (optimizer, checkpointing, data parallelism and sharding, the device's
// capacity, the step kind) share one. Graphs are kept for the configurations after them, the
// most recently used few (kMaxGraphs, kMaxCachedOps); a configuration with adapters,
// quantization or fp8 (passes that rewrite the graph) or served by vLLM is estimated as
// Estimate() does it (BuildsPlainGraph, engine/estimator.h).
#ifndef MEMEST_ENGINE_SWEEP_H_
#define MEMEST_ENGINE_SWEEP_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <utility>

#include "engine/estimator.h"

namespace memest {

class SweepEstimator {
 public:
  static constexpr int kMaxGraphs = 8;
  // The ops of the graphs kept, together (about a kilobyte each); a larger graph is not kept.
  static constexpr int64_t kMaxCachedOps = 50'000;

  // `model` must outlive the estimator. options.budget is not used: each Estimate names its own.
  SweepEstimator(const ModelSpec& model, const EstimateOptions& options);

  // Estimate(model, config, options) with `budget` (null: unlimited) as options.budget: the
  // same report, or the same refusal (a bad config naming its field, an unknown device, a step
  // its budget cannot afford, the budget's deadline or cancellation).
  StatusOr<Report> Estimate(const RunConfig& config, Budget* budget);

  // Graphs built so far (a configuration estimated as Estimate() does it builds its own, not
  // counted).
  int64_t graphs_built() const { return graphs_built_; }

 private:
  using Key = decltype(GraphKeyOf(BuildContext{}));
  void Keep(const Key& key, std::shared_ptr<const Graph> graph);

  const ModelSpec& model_;
  const EstimateOptions options_;
  std::deque<std::pair<Key, std::shared_ptr<const Graph>>> graphs_;  // least recently used first
  int64_t cached_ops_ = 0;
  int64_t graphs_built_ = 0;
};

}  // namespace memest

#endif  // MEMEST_ENGINE_SWEEP_H_
