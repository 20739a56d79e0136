// torchao's weight-only formats as transformers loads them (engine/passes/quantize.h runs these
// for config.quantization's torchao-int4 and torchao-int8), read in torchao 0.19 (36027d8,
// 2026-08) and transformers' quantizers/quantizer_torchao.py:
//
//   torchao-int4   TorchAoConfig(Int4WeightOnlyConfig(group_size)), version 2, the default
//                  plain packing (quantize_/workflows/int4/int4_tensor.py Int4Tensor): qdata,
//                  two int4 values a byte, int8 [out, in / 2]; scale and zero_point per group,
//                  [in / group_size, out] in the weight's dtype (bfloat16: the mslk kernel's).
//                  F.linear runs mslk.bf16i4bf16_rowwise on x [rows, in]: the output alone, no
//                  dequantized weight; a bias is added out of place (`res + bias`).
//   torchao-int8   TorchAoConfig(Int8WeightOnlyConfig()), per row (int8/int8_tensor.py
//                  Int8Tensor): qdata int8 [out, in], a float32 scale and an int8 zero point per
//                  row ([out, 1]). F.linear dequantizes nothing but casts the whole weight to
//                  x's dtype for torch.mm (`w_vals_int8_t.to(output_dtype)`, [in, out] per
//                  call), then `m * scale.to(m.dtype)` makes the output; a bias is added in
//                  place.
//
// transformers quantizes nn.Linear weights only (Conv1D stays dense), leaves the output layer
// (get_modules_to_not_convert) and modules_to_not_convert alone, and with int4 skips a weight
// whose input features group_size does not divide. Inference only (a weight-only tensor
// subclass has no gradient; training is QAT's). Eager mode: torch.compile, which torchao
// recommends, fuses the int8 cast away.
#ifndef MEMEST_ENGINE_PASSES_QUANTIZE_TORCHAO_H_
#define MEMEST_ENGINE_PASSES_QUANTIZE_TORCHAO_H_

#include <string>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"

namespace memest {

// `leaf`, a Linear's dense weight of [out, in], as the format's qdata.
void PackTorchaoWeight(const QuantizationConfig& q, const Shape& out_in, Tensor* leaf);

// One call of a quantized Linear on `x` (the builder's scope is the module's); `weight` the
// packed qdata (PackTorchaoWeight), `bias` -1 for none; `state` the module's scale and zero
// point, made on its first call (empty until then). Returns the output.
int EmitTorchaoLinear(GraphBuilder& b, const QuantizationConfig& q, int x, int weight, int bias,
                      std::vector<int>* state);

// The report's note on the weights of `graph`, quantized by the pass.
std::string TorchaoNote(const Graph& graph, const QuantizationConfig& q);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_QUANTIZE_TORCHAO_H_
