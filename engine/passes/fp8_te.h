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
// workspace, once per device. convert_model returns from a module's children at the first
// Linear whose dims are not multiples of 16: its later siblings (taken in forward order for
// registration order) and everything under them stay PyTorch's.
#ifndef MEMEST_ENGINE_PASSES_FP8_TE_H_
#define MEMEST_ENGINE_PASSES_FP8_TE_H_

#include <string>

#include "engine/ir/budget.h"
#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"

namespace memest {

// TE's cuBLAS workspace (cpp_extensions/gemm.py): 32 MiB + 1024 B from sm_90, 4 MiB before.
int64_t TeWorkspaceBytes(int compute_capability);
// Whether TE makes fp8 transposes on the GPU: fp8 GEMMs take the TN layout only on sm_89,
// sm_9x and sm_12x (common/transformer_engine.cpp is_non_tn_fp8_gemm_supported).
bool TeMakesTransposes(int compute_capability);

// `graph` with its nn.Linear calls as te.Linear under fp8_autocast (`fp8`'s recipe) on a GPU of
// `compute_capability` (89 or more). Refuses a model with no Linear to convert, a tied output
// layer (accelerate unties it and leaves the copy out of the optimizer) and a model with
// nn.LayerNorm (accelerate makes it a te.LayerNorm, which runs in bf16 and keeps a bf16 copy of
// its input: not modelled). `budget` (null: none) can stop the rebuild.
StatusOr<Graph> ApplyTeFp8(const Graph& graph, const Fp8Config& fp8, int compute_capability,
                           Budget* budget = nullptr);

// The report's note on the converted graph.
std::string TeFp8Note(const Graph& graph, const Fp8Config& fp8);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_FP8_TE_H_
