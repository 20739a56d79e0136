// LoRA adapters as PEFT adds them: a pass over a built graph.
//
// get_peft_model(model, LoraConfig(r, lora_alpha, lora_dropout, target_modules,
// modules_to_save)) (peft/tuners/lora/layer.py, Linear.forward; peft/utils/other.py,
// ModulesToSaveWrapper) freezes every parameter of the model and wraps each target module:
//
//   result = base_layer(x)                       # the frozen Linear or Conv1D, as before
//   x = x.to(lora_A.weight.dtype)                # a copy where the dtypes differ
//   result = result + lora_B(lora_A(dropout(x))) * scaling
//   result = result.to(torch_result_dtype)       # back, where the sum promoted
//
// lora_A is a Linear(in, r) and lora_B a Linear(r, out), both without bias, in the base
// weight's dtype, or float32 where that is float16 or bfloat16 and autocast_adapter_dtype
// (PEFT's default) is on. Under torch.autocast their linears cast as every linear does.
// The memory follows from the ops: a frozen base saves its input for nothing (only for the
// input's gradient, which needs the weight), no gradient or optimizer state for the base, the
// adapters' saved inputs (the dropout mask, the dropout output or input, the low-rank
// intermediate), and their gradients and optimizer state.
#ifndef MEMEST_ENGINE_PASSES_LORA_H_
#define MEMEST_ENGINE_PASSES_LORA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/ir/budget.h"
#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"

namespace memest {

// `graph` with config.lora's adapters (see above): lora_A and lora_B of module M are the
// parameters "M.lora_A.default.weight" and "M.lora_B.default.weight", a saved module's copies
// "M.modules_to_save.default.<name>", as PEFT names them.
// Refuses (INVALID_ARGUMENT, naming config.lora's field) a target that matches no module or a
// module that is not a Linear or Conv1D, a modules_to_save entry that matches no module, and
// (RESOURCE_EXHAUSTED) a result of more than `max_ops` ops; `budget` (null: none) can stop the
// rebuild at its deadline or cancellation.
StatusOr<Graph> ApplyLora(const Graph& graph, const LoraConfig& lora, int64_t max_ops,
                          Budget* budget = nullptr);

// The report's note on the adapters in `graph` (ApplyLora's result under `lora`): how many
// modules, of what rank and dtype, and what trains.
std::string LoraNote(const Graph& graph, const LoraConfig& lora);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_LORA_H_
