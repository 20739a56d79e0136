// A quantized checkpoint as vLLM serves it: a pass over one rank's graph, after tensor
// parallelism (each rank quantizes, packs and scales its own shard).
//
// Every linear (nn.Linear's `linear`, tensor parallelism's `megatron_linear`) whose weight is a
// parameter of its own becomes vLLM's quantized linear, except the output layer (ParallelLMHead
// is an embedding to vLLM's quantization methods), mixture-of-experts routers (a module named
// "gate" or "shared_expert_gate": ReplicatedLinear or nn.Linear without a quantization method in
// vLLM's models), a weight another module reads too (tied), and config.quantization's
// skip_modules (a name, matched as transformers matches module names, or "re:PATTERN", matched
// from the start of the module's path as compressed-tensors' ignore list is: literal text, '.'
// for any character, '.*', '\.', and a final '$').
//
// What each rank keeps, after vLLM's process_weights_after_loading, for a linear of [out, in]:
//   w8a8-fp8   float8_e4m3 [out, in] (held as uint8); float32 scales: one per output channel,
//              one, or one per block_n x block_k block (weight_scale_inv); a static input's
//              float32 scale. On a GPU before sm_89 vLLM runs fp8 weight-only through Marlin
//              (prepare_fp8_layer_for_marlin): the same bytes, scales per channel (or per
//              block of inputs) in the model's dtype, Marlin's shapes.
//   w8a8-int8  int8 [out, in]; float32 scales, one per output channel (per-tensor ones too:
//              convert_to_channelwise); a static input's float32 scale (and int32 zero point);
//              with zero points for the inputs, azp_adj, int32 per output channel.
//   w4a16, w8a16  int32 [in * bits / 32, out]; scales [groups, out] in the model's dtype
//              (groups = in / group_size, or 1); zero points: Machete's pre-scaled ones,
//              [groups, out] in the model's dtype, or Marlin's packed int32 [groups, out * bits /
//              32]; a GPTQ checkpoint's qzeros and g_idx stay loaded where the kernel does not
//              replace them (gptq_layout); act-order: g_idx and its sorting indices, int32 [in]
//              each, and on a row-parallel shard the whole layer's groups of scales and zero
//              points (marlin_repeat_scales_on_all_ranks); Marlin's workspace, int32 per
//              multiprocessor. AllSpark: uint8 [ceil32(out), in], scales [1, out], and past
//              1024 tokens its kept dequantization workspace, k x n halves of the largest
//              merged layer (the linears that read one input), held from its first use.
// The kernel is vLLM 0.19's choice (choose_mp_linear_kernel): Machete on sm_90 for group sizes
// -1, 64 and 128, in % 64 == 0 and out % 128 == 0 (not with act-order on a row-parallel
// shard); AllSpark on sm_80-89 for 8-bit per-channel weights without zero points or
// act-order (in % 16 == 0, out % 8 == 0); else Marlin (sm_75 and later; group sizes -1, 32, 64,
// 128; out % 64 == 0, in % 128 == 0; zero points with 4 bits only). A shard none of them takes
// is refused (vLLM's Conch and ExLlama fallbacks are not modelled).
#ifndef MEMEST_ENGINE_PASSES_SERVED_QUANTIZE_H_
#define MEMEST_ENGINE_PASSES_SERVED_QUANTIZE_H_

#include <string>

#include "engine/ir/budget.h"
#include "engine/ir/config.h"
#include "engine/ir/devices.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"

namespace memest {

// `rank` (one rank's graph, in the served dtype) with its linears as `q` stores them on
// `device`. INVALID_ARGUMENT names config.quantization's field: a skip name that matches no
// linear (a pattern may: compressed-tensors writes its lists for a family), a pattern memest
// does not read, a shard no kernel takes, a GPU too old for the
// format, a model left with no linear to quantize.
StatusOr<Graph> ApplyServedQuantization(const Graph& rank, const QuantizationConfig& q,
                                        const DeviceInfo& device, Budget* budget = nullptr);

// Whether a skip_modules entry is one the pass reads: a name, or a "re:" pattern of the subset
// above.
bool ReadableSkipEntry(const std::string& entry);

// The report's note on the quantized linears of `graph` (ApplyServedQuantization's result).
std::string ServedQuantizationNote(const Graph& graph, const QuantizationConfig& q);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_SERVED_QUANTIZE_H_
