// FP8 training with TransformerEngine as Hugging Face accelerate runs it
// (`Accelerator(mixed_precision="fp8")` with the TE backend): a pass over a built graph.
//
// accelerate's convert_model (utils/transformer_engine.py) replaces every nn.Linear whose
// weight's dims are multiples of 16 with a te.Linear of the same dtype (params_dtype), and wraps
// the model's forward in te.fp8_autocast with its recipe (DelayedScaling from TERecipeKwargs:
// HYBRID, e4m3 forward and e5m2 backward, an amax history of 1024 by default). Each te.Linear
// becomes one `te_linear` op (engine/rules/fp8_te.cc: the fp8 copies of x and of the weight,
// what backward keeps of them, the e5m2 gradient); with delayed scaling each module keeps its
// fp8_meta: amax histories [history, 3] (forward: input, weight, output) and [history, 2]
// (backward: grad_output, grad_input) and their scales, float32 (module/base.py,
// quantization.py DelayedScalingRecipeState). The first te.Linear call makes TE's cuBLAS
// workspace, 32 MiB + 1 KiB on sm_90 (cpp_extensions/gemm.py), once per device.
#ifndef MEMEST_ENGINE_PASSES_FP8_TE_H_
#define MEMEST_ENGINE_PASSES_FP8_TE_H_

#include <string>

#include "engine/ir/budget.h"
#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"

namespace memest {

// TE's cuBLAS workspace on sm_90 and later: 32 MiB + 1024 B.
inline constexpr int64_t kTeWorkspaceBytes = (int64_t{32} << 20) + 1024;

// `graph` with its nn.Linear calls as te.Linear under fp8_autocast (`fp8`'s recipe); refuses a
// model with no Linear to convert. `budget` (null: none) can stop the rebuild.
StatusOr<Graph> ApplyTeFp8(const Graph& graph, const Fp8Config& fp8, Budget* budget = nullptr);

// The report's note on the converted graph.
std::string TeFp8Note(const Graph& graph, const Fp8Config& fp8);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_FP8_TE_H_
