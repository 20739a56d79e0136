// The Linear modules of a built graph, as the libraries that rewrite them (PEFT's LoRA,
// transformers' bitsandbytes integration) find them: nn.Linear, Hugging Face Conv1D, and the
// bitsandbytes Linear4bit that replaces them.
#ifndef MEMEST_ENGINE_PASSES_LINEAR_MODULES_H_
#define MEMEST_ENGINE_PASSES_LINEAR_MODULES_H_

#include <string>
#include <string_view>
#include <vector>

#include "engine/ir/graph.h"

namespace memest {

// Which input of `op` is the data when it is a module's one weighted op: linear(x, W) and
// linear_4bit(x, W, ...) read x first; HF Conv1D's addmm(bias, x, W) second (its weight a
// parameter). -1: not such an op.
int LinearDataInput(const Graph& graph, const Op& op);
// The weight input of such an op (1 for linear and linear_4bit, 2 for addmm).
inline int LinearWeightInput(int data_input) { return data_input == 0 ? 1 : 2; }

// Ops a Linear or Conv1D module runs besides its weighted op: autocast's casts and Conv1D's
// views.
bool LinearPlumbing(std::string_view kind);

// The scopes whose ops hold exactly one weighted op and otherwise plumbing only, in forward
// order, each once.
std::vector<std::string> LinearModules(const Graph& graph);

// The output layer: the module of the last weighted op before the loss (the whole graph
// without one); "" when there is none. transformers' get_output_embeddings() for a causal LM,
// the lm_head, which PEFT's all-linear and transformers' bitsandbytes loading leave alone.
std::string OutputLayer(const Graph& graph);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_LINEAR_MODULES_H_
