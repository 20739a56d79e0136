// The Linear modules of a built graph, as the libraries that rewrite them (PEFT's LoRA,
// transformers' bitsandbytes integration) find them: nn.Linear, Hugging Face Conv1D, and the
// bitsandbytes Linear4bit that replaces them.
#ifndef MEMEST_ENGINE_PASSES_LINEAR_MODULES_H_
#define MEMEST_ENGINE_PASSES_LINEAR_MODULES_H_

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "engine/ir/graph.h"

namespace memest {

// Which input of `op` is the data when it is a module's one weighted op: linear(x, W),
// linear_4bit(x, W, ...) and linear_8bit(x, W, ...) read x first; HF Conv1D's addmm(bias, x, W)
// second (its weight a parameter). -1: not such an op.
int LinearDataInput(const Graph& graph, const Op& op);
// The weight input of such an op (1 for linear, linear_4bit and linear_8bit, 2 for addmm).
inline int LinearWeightInput(int data_input) { return data_input == 0 ? 1 : 2; }
// Its bias input, -1: none (linear's and linear_4bit's third, linear_8bit's sixth, addmm's
// first).
int LinearBiasInput(const Op& op, int data_input);

// Ops a Linear or Conv1D module runs besides its weighted op: autocast's casts and Conv1D's
// views.
bool LinearPlumbing(std::string_view kind);
// The ops of bitsandbytes' Linear8bitLt besides linear_8bit (engine/rules/quantized_int8.cc).
bool Int8LinearPart(std::string_view kind);

// The scopes whose ops hold exactly one weighted op and otherwise plumbing only, in forward
// order, each once.
std::vector<std::string> LinearModules(const Graph& graph);

// One call of a Linear module: ops [first, last], one run of its scope; its weighted op; and
// the tensors it was given (its input, weight and bias, -1: none), found back through the
// module's own casts and views.
struct LinearCall {
  int first = -1;
  int last = -1;
  int op = -1;
  int input = -1;
  int weight = -1;
  int bias = -1;
};
// The calls of the modules whose scopes `is_module` accepts, in forward order.
template <typename Accept>
std::vector<LinearCall> LinearCalls(const Graph& graph, const Accept& is_module);

// `t` back through the casts and views ops from `first` on made of it (LinearPlumbing): what
// a module whose ops start at `first` was given.
int BeforePlumbing(const Graph& graph, int t, int first = 0);

// An op outside `modules` that reads one of `weights` (by tensor id), directly or through
// plumbing: a weight tied to another module's.
struct TiedRead {
  int op = -1;
  int weight = -1;
};
// The first such op, or nullopt.
std::optional<TiedRead> ReadOutside(const Graph& graph, const std::vector<bool>& weights,
                                    const std::set<std::string, std::less<>>& modules);

// The output layer: the module of the last weighted op before the loss (the whole graph
// without one); "" when there is none. transformers' get_output_embeddings() for a causal LM,
// the lm_head, which PEFT's all-linear and transformers' bitsandbytes loading leave alone.
std::string OutputLayer(const Graph& graph);

template <typename Accept>
std::vector<LinearCall> LinearCalls(const Graph& g, const Accept& is_module) {
  std::vector<LinearCall> calls;
  const int n = static_cast<int>(g.ops.size());
  for (int first = 0; first < n;) {
    int last = first;
    while (last + 1 < n && g.ops[last + 1].scope == g.ops[first].scope) ++last;
    for (int i = first; i <= last && is_module(g.ops[first].scope); ++i) {
      const Op& op = g.ops[i];
      const int in = LinearDataInput(g, op);
      if (in < 0) continue;
      LinearCall call{first, last, i, BeforePlumbing(g, op.inputs[in], first),
                      BeforePlumbing(g, op.inputs[LinearWeightInput(in)], first), -1};
      const int bias = LinearBiasInput(op, in);
      if (bias >= 0) call.bias = BeforePlumbing(g, op.inputs[bias], first);
      calls.push_back(call);
    }
    first = last + 1;
  }
  return calls;
}

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_LINEAR_MODULES_H_
