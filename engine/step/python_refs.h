// What the Python program holds: references that keep a storage alive after the graph is done
// with it.
//
// PyTorch frees a tensor when its last reference dies; the step simulator frees a storage when
// no later op reads it and autograd does not hold it. Two kinds of reference outlive both:
//   - locals of the model's code (a hand-written attention's `dot`, a module's input held by
//     its caller until the module returns): Graph::held, each until an op has run;
//   - the training loop's variable for the model's outputs (`outputs = model(**batch)`), which
//     keeps them through backward and the optimizer step until the next forward returns new
//     ones (RunConfig::hold_outputs).
// This plans both as pins per storage; the step simulator (engine/step/forward.cc) applies them.
#ifndef MEMEST_ENGINE_STEP_PYTHON_REFS_H_
#define MEMEST_ENGINE_STEP_PYTHON_REFS_H_

#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"

namespace memest {

// The tensors the model's forward returns: Graph::outputs when the graph names them; otherwise,
// in training, the tensors made before the loss (ops before Graph::loss_begin) that the loss's
// ops read (the logits a loss function is given), and in inference (or a graph whose loss has
// no ops of its own) the last op's outputs; with `cache`, Graph::cache after them. In graph
// order, each once.
std::vector<int> ModelOutputs(const Graph& graph, Mode mode, bool cache = false);

// Whether the model's outputs hold Graph::cache in a step under `config`: in inference (the
// prompt's cache, which generation goes on from), and in training unless every block is
// checkpointed, as Hugging Face's gradient_checkpointing_enable() does, which makes its models
// run with use_cache=False in training (they warn and return no cache). Checkpointing every k
// blocks or sqrt(L) blocks is not something that method does: the model's flag stays off and it
// returns its cache.
bool OutputsHoldCache(const RunConfig& config);

struct PythonRefs {
  // Per op index: storages whose Python reference dies right after that op has run. Every
  // storage listed here is pinned from the start of the forward (`pinned`, once per entry).
  std::vector<std::vector<int>> release_after;
  std::vector<int> pinned;
  // The storages of the model's outputs (ModelOutputs), each once.
  std::vector<int> outputs;
  // The storages of the outputs that are activations (what a loop holding the outputs keeps
  // beyond the micro-batch; inputs and parameters live on anyway), each once.
  std::vector<int> held_outputs;
};

// Plans the references of `graph` for a step in `mode`. `base[t]` is the storage of tensor t
// (its own id, or that of the tensor it views or shares). Graph::held entries must name a
// tensor and an op of the graph (BuildOpGraph and ReplayGraph keep them so).
// `cache`: the outputs hold Graph::cache (OutputsHoldCache).
PythonRefs PlanPythonRefs(const Graph& graph, const std::vector<int>& base, Mode mode,
                          bool cache = false);

}  // namespace memest

#endif  // MEMEST_ENGINE_STEP_PYTHON_REFS_H_
