#include "engine/sweep.h"

#include <algorithm>
#include <iterator>

namespace memest {

#if defined(__x86_64__) && defined(__linux__)
// A tripwire for the key: a field added to BuildContext changes its size here.
static_assert(sizeof(BuildContext) == 112,
              "BuildContext changed: GraphKeyOf (engine/models/model.h) must hold every field the "
              "front ends read, or sweeps share graphs they must not; then update this size");
#endif

SweepEstimator::SweepEstimator(const ModelSpec& model, const EstimateOptions& options)
    : model_(model), options_(options) {}

StatusOr<Report> SweepEstimator::Estimate(const RunConfig& config, Budget* budget) {
  EstimateOptions options = options_;
  options.budget = budget;
  if (!BuildsPlainGraph(model_, config)) return memest::Estimate(model_, config, options);
  if (budget != nullptr) MEMEST_RETURN_IF_ERROR(budget->status());
  // BuildStepGraph's first step: the config validated, its device resolved.
  MEMEST_ASSIGN_OR_RETURN(BuildContext context, StepBuildContext(config, options.max_ops, budget));
  const Key key = GraphKeyOf(context);
  auto kept = std::find_if(graphs_.begin(), graphs_.end(),
                           [&key](const auto& entry) { return entry.first == key; });
  std::shared_ptr<const Graph> graph;
  if (kept != graphs_.end()) {
    graph = kept->second;
    if (std::next(kept) != graphs_.end()) {  // the most recently used last
      auto entry = std::move(*kept);
      graphs_.erase(kept);
      graphs_.push_back(std::move(entry));
    }
  } else {
    MEMEST_ASSIGN_OR_RETURN(Graph built, BuildGraph(model_, context));
    ++graphs_built_;
    graph = std::make_shared<const Graph>(std::move(built));
    Keep(key, graph);
  }
  return EstimateBuilt(model_, *graph, config, options);
}

void SweepEstimator::Keep(const Key& key, std::shared_ptr<const Graph> graph) {
  const int64_t ops = static_cast<int64_t>(graph->ops.size());
  if (ops > kMaxCachedOps) return;
  while (!graphs_.empty() &&
         (static_cast<int>(graphs_.size()) >= kMaxGraphs || cached_ops_ + ops > kMaxCachedOps)) {
    cached_ops_ -= static_cast<int64_t>(graphs_.front().second->ops.size());
    graphs_.pop_front();
  }
  cached_ops_ += ops;
  graphs_.emplace_back(key, std::move(graph));
}

}  // namespace memest
