// vLLM's LoRA serving (--enable-lora): a pass over one served rank's graph, after tensor
// parallelism and before quantization (the slots are in the model's dtype whatever the base
// weights are).
//
// At load time vLLM's LoRA manager (lora/model_manager.py, _create_lora_modules) wraps every
// module the model class supports (its linears, and embed_tokens and lm_head where the class
// lists embedding_modules), restricted to LoRAConfig.target_modules' suffixes, and each wrapper
// makes its stacked slots, zeros of the model's dtype (lora_dtype auto), inside the memory
// profiler of load_model: they come out of gpu_memory_utilization before the KV cache. For
// max_loras L and max_lora_rank R (lora/layers/*.py, create_lora_weights), per vLLM slice (a
// Hugging Face projection: q_proj, k_proj and v_proj are qkv_proj's three, gate_proj and up_proj
// gate_up_proj's two; Phi-3's fused ones are one each):
//   a column-parallel linear of the rank's [out/t, in]:   A [L, 1, R, in], B [L, 1, out/t, R]
//   a row-parallel linear of the rank's [out, in/t]:      A [L, 1, R, in/t], B [L, 1, out, R]
//   a replicated linear:                                  A [L, 1, R, in],  B [L, 1, out, R]
//   embed_tokens (VocabParallelEmbeddingWithLoRA):        A [L, vocab, R],  B [L, 1, hidden, R]
//   lm_head's logits (LogitsProcessorWithLoRA):           A [L, 1, R, hidden], B [L, 1, vocab, R]
// With fully_sharded_loras a column linear's A keeps R/t rows and a row linear's B out/t. The
// logits wrapper with t > 1 keeps the int64 [vocab] map from the gathered logits to token ids
// (its padded rows, a multiple of 64) and reindexes the logits into a new tensor. The punica
// wrapper's index tensors (punica_wrapper/punica_base.py, punica_gpu.py,
// ops/triton_ops/lora_kernel_metadata.py): int64 [T] x 3 and [2, T], int64 [B] x 3, and twice
// int32 [T] x 2, [L + 1] x 2 and [L + 2], for T max_num_batched_tokens and B max_num_seqs.
// The profile run activates no adapter, but every wrapped module still runs vLLM's kernels:
// after each module's output a punica_lora_ op (engine/rules/served_lora.cc) with the shrink's
// float32 buffer; the embedding's A rows looked up first (an int64 copy of the ids, then [tokens,
// R]); the logits' reindexed copy with t > 1.
#ifndef MEMEST_ENGINE_PASSES_SERVED_LORA_H_
#define MEMEST_ENGINE_PASSES_SERVED_LORA_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/ir/budget.h"
#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"

namespace memest {

struct ServedLora {
  int64_t max_loras = 1;
  int64_t rank = 0;  // max_lora_rank
  bool fully_sharded = false;
  std::vector<std::string> targets;  // vLLM's module suffixes; empty: every module
  ServedLoraLayout layout;
  int64_t tensor = 1;  // the tensor-parallel ranks the graph is one of
  int64_t max_num_batched_tokens = 0;
  int64_t max_num_seqs = 0;
};

// The ServedLora a serving config asks for (config.lora with config.serving, its defaults
// filled in by EstimateServing).
ServedLora ServedLoraOf(const RunConfig& config);

// `rank` with vLLM's adapter slots and kernels (see above); a target that names none of the
// model's modules is ignored, as vLLM ignores it (ServedLoraNote says so). INVALID_ARGUMENT
// naming config.lora's field: a rank fully_sharded_loras cannot divide by the tensor ranks, a
// vocabulary over 258048 with lm_head wrapped (vLLM's limit).
StatusOr<Graph> ApplyServedLora(const Graph& rank, const ServedLora& lora,
                                Budget* budget = nullptr);

// The bytes of `graph`'s adapter slots and index tensors (ApplyServedLora's leaves).
int64_t ServedLoraBytes(const Graph& graph);

// The report's note on the slots of `graph` (ApplyServedLora's result).
std::string ServedLoraNote(const Graph& graph, const ServedLora& lora);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_SERVED_LORA_H_
