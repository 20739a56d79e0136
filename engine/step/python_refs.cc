#include "engine/step/python_refs.h"

namespace memest {
namespace {

// Appends each of `ids` not seen before; `seen` is indexed by id.
void AppendNew(const std::vector<int>& ids, std::vector<char>& seen, std::vector<int>* out) {
  for (int id : ids) {
    if (id < 0 || seen[id]) continue;
    seen[id] = 1;
    out->push_back(id);
  }
}

// ModelOutputs without the cache.
void ReturnedTensors(const Graph& g, Mode mode, std::vector<char>& seen, std::vector<int>* out) {
  if (!g.outputs.empty()) {
    AppendNew(g.outputs, seen, out);
    return;
  }
  const int n = static_cast<int>(g.ops.size());
  if (mode == Mode::kTraining && g.loss_begin > 0) {
    for (int i = g.loss_begin; i < n; ++i) {
      for (int t : g.ops[i].inputs) {
        const int p = g.tensors[t].producer;
        if (p >= 0 && p < g.loss_begin) AppendNew({t}, seen, out);
      }
    }
    if (!out->empty()) return;
  }
  if (n > 0) AppendNew(g.ops.back().outputs, seen, out);
}

}  // namespace

std::vector<int> ModelOutputs(const Graph& g, Mode mode, bool cache) {
  std::vector<char> seen(g.tensors.size(), 0);
  std::vector<int> out;
  ReturnedTensors(g, mode, seen, &out);
  if (cache) AppendNew(g.cache, seen, &out);
  return out;
}

bool OutputsHoldCache(const RunConfig& config) {
  return config.mode != Mode::kTraining ||
         config.checkpoint.policy != CheckpointPolicy::kEveryBlock;
}

PythonRefs PlanPythonRefs(const Graph& g, const std::vector<int>& base, Mode mode, bool cache) {
  PythonRefs refs;
  refs.release_after.resize(g.ops.size());
  for (const HeldTensor& h : g.held) {
    const int s = base[h.tensor];
    refs.release_after[h.until_op].push_back(s);
    refs.pinned.push_back(s);
  }
  std::vector<char> seen(g.tensors.size(), 0);
  std::vector<int> storages;
  for (int t : ModelOutputs(g, mode, cache)) storages.push_back(base[t]);
  AppendNew(storages, seen, &refs.outputs);
  for (int s : refs.outputs) {
    if (g.tensors[s].role == TensorRole::kActivation) refs.held_outputs.push_back(s);
  }
  return refs;
}

}  // namespace memest
