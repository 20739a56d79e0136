// 4-bit weights as transformers loads them with bitsandbytes: a pass over a built graph.
//
// from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True,
// bnb_4bit_quant_type, bnb_4bit_use_double_quant, bnb_4bit_compute_dtype)) replaces every
// nn.Linear and Conv1D but the skipped modules with a frozen bitsandbytes Linear4bit
// (transformers/integrations/bitsandbytes.py, _replace_with_bnb_linear). Its weight is stored
// as NF4 or FP4 values packed two to a byte, uint8 [(n+1)/2, 1] (bitsandbytes' quantize_4bit,
// blocksize 64), beside its QuantState: one absmax per 64 values (float32; with double
// quantization uint8, plus one float32 absmax per 256 of them, a float32 offset and the 256-value
// float32 map of that second quantization, per layer since bitsandbytes 0.46) and the
// 16-value float32 code of the 4-bit type. Linear4bit.forward casts its input to the compute
// dtype, runs linear_4bit (engine/rules/quantized.cc: the weight dequantized for the op and
// again in backward, nothing saved; under autocast its F.linear casts to half where the compute
// dtype is float32), and casts the output back to the input's dtype.
//
// With prepare_for_kbit_training, PEFT's prepare_model_for_kbit_training follows
// (peft/utils/other.py): every parameter frozen, and every float16 or bfloat16 parameter that is
// not 4-bit (embeddings, norms, the lm_head, biases) cast to float32, which the activations
// after them follow.
#ifndef MEMEST_ENGINE_PASSES_QUANTIZE_H_
#define MEMEST_ENGINE_PASSES_QUANTIZE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "engine/ir/budget.h"
#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"

namespace memest {

// The bytes bitsandbytes keeps for a 4-bit weight of `n` values: the packed values, the
// absmax (double quantized or not) and the QuantState's small tensors, as allocated.
int64_t Bnb4bitWeightBytes(int64_t n, bool double_quant);

// `graph` with its Linear modules stored as `quantization` says (see above); the packed weight
// of module M is the parameter "M.weight", its QuantState buffers "M.weight.quant_state.*".
// Refuses (INVALID_ARGUMENT, naming config.quantization's field) a skip_modules entry that
// matches no module, and a model with no Linear left to quantize; `budget` (null: none) can
// stop the rebuild. `loaded` (unset: each weight's dtype in `graph`) is the dtype the dense
// weights were loaded in, their QuantState's, where the graph was built in float32 because
// prepare_model_for_kbit_training leaves every other parameter, and so every activation, in
// float32 (BuildStepGraph does, so that the ops the builders fix a dtype for, a zeros or a
// `.to(dtype)` of the hidden states' dtype, follow).
StatusOr<Graph> ApplyQuantization(const Graph& graph, const QuantizationConfig& quantization,
                                  Budget* budget = nullptr,
                                  std::optional<DType> loaded = std::nullopt);

// The report's note on the 4-bit weights of `graph` (ApplyQuantization's result).
std::string QuantizationNote(const Graph& graph, const QuantizationConfig& quantization);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_QUANTIZE_H_
