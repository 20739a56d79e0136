// Tensor parallelism as one rank sees it (docs/parallelism.md): Megatron-LM's column- and
// row-parallel linears, with or without sequence parallelism, applied to any graph by a plan;
// or, with config.parallelism.tensor_layers = dtensor, the same plan as PyTorch's DTensor styles
// run it (tensor_parallel_dtensor.cc says how they differ).
//
// The plan names modules (config.parallelism.tensor_plan, or the default plan for the presets'
// module names, DefaultTensorPlan). A colwise linear keeps 1/t of its output features (weight
// rows, bias); a rowwise linear 1/t of its input features (weight columns; its bias stays
// whole); a rowwise embedding 1/t of the vocabulary. Every other parameter is replicated. An
// inference KV cache keeps the rank's key-value heads (one when there are fewer than t). In
// inference with fewer key-value heads than ranks (and enough query heads), the key and value
// projections are cut by heads, each rank holding one (vLLM's QKVParallelLinear replicates each
// over t / kv_heads ranks); the attention after them must be a fused kernel that takes grouped
// heads. Training refuses it, as Megatron does (num_query_groups % tensor_model_parallel_size).
//
// The pass rebuilds the graph with the rank's shapes. Which dim of each activation is split
// follows from the ops: what reads a column-parallel output (the GELU, the heads' views and
// attention, which then run on heads/t heads) keeps it split until a row-parallel linear reads
// it. A linear whose weight is sharded becomes `megatron_linear` (engine/rules/parallel.cc), as
// LinearWithGradAccumulationAndAsyncCommunication runs it; a row-parallel one is followed by
// its all-reduce. With sequence parallelism, the hidden state entering the first block (or, in
// a graph without blocks, the model's inputs) is split along the sequence, and so is every
// activation computed from it outside the parallel linears (norms, dropout, residual adds): a
// column-parallel linear all-gathers its input into Megatron's global memory buffer, a
// row-parallel one reduce-scatters its output. The sequence dim is the inputs' (the one of
// their first two the micro-batch is not), followed through the ops that make the hidden state
// (a transpose to Megatron's [s, b, h] moves it to dim 0). An interleaved stage's later model
// chunks have their received hidden states split too; a buffer indexed by position that meets
// the split sequence is read at the rank's positions. Megatron's MoE layer (its dispatch
// marks it) runs as tensor_parallel_moe.cc says: each rank routes its tokens, the tensor
// group gathers what it received, the experts are split without collectives of their own.
//
// Refused, naming the op and its scope: an op that would mix values across a split dim (a
// softmax, a norm or a reduction over the features a column-parallel linear split, a matmul
// contracting them outside a row-parallel linear, attention over a split sequence), a sharded
// dim that does not divide evenly by t, a plan that names no parameter, and ops the pass does
// not know how to split.
#ifndef MEMEST_ENGINE_PASSES_TENSOR_PARALLEL_H_
#define MEMEST_ENGINE_PASSES_TENSOR_PARALLEL_H_

#include <cstdint>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/status.h"
#include "engine/passes/passes.h"

namespace memest {

struct TensorParallelView {
  int64_t size = 1;                // ranks in the tensor-parallel group
  bool sequence_parallel = false;
  Graph graph;                     // the rank's graph
  // Megatron's GlobalMemoryBuffer "mpu" under sequence parallelism: the largest all-gathered
  // input, made at the first op that asks for it (first_gather_op) and kept for the process's
  // life. 0: none.
  int64_t global_buffer_bytes = 0;
  int first_gather_op = -1;
  // Under sequence parallelism, the replicated parameters the sequence-split activations use
  // (norms, row-parallel biases: Megatron's `sequence_parallel` attribute): finalize_model_grads
  // all-reduces their gradients across the group as one flat copy after backward.
  std::vector<int> sequence_parallel_params;
  // DTensor's layers (config.parallelism.tensor_layers): parameters whose .grad is larger than
  // the rank's share (a row-split embedding's whole table: its bytes), and the scratch the
  // optimizer's ops add while they update a parameter (DTensor redistributes a gradient whose
  // placement is not the parameter's at every op that reads it: the whole table's gradient to
  // the rank's rows, a norm's Partial gradient all-reduced; two at once).
  bool dtensor = false;
  struct ParamBytes {
    int param = -1;
    int64_t bytes = 0;
  };
  std::vector<ParamBytes> whole_grads;
  std::vector<ParamBytes> optimizer_scratch;
  int64_t sharded_params = 0;      // parameters the plan split
  int64_t collectives = 0;         // collectives the forward runs (notes)
  // Bytes each rank sends and receives through the group's collectives in one micro-batch's
  // forward and backward (ring algorithms: 2(t-1)/t of an all-reduce's buffer, (t-1)/t of a
  // gather's or scatter's whole tensor).
  int64_t communicated_bytes = 0;
  ReplayMap replay;                // where the whole graph's tensors and ops went
};

// The rank's view of `graph` under config.parallelism (tensor > 1). `graph` is the whole
// model's graph, as built for one micro-batch; `load` spreads a Megatron MoE layer's tokens
// over its experts (config.expert_load).
StatusOr<TensorParallelView> ShardTensorParallel(const Graph& graph, const ParallelismConfig& config,
                                                 ExpertLoad load = ExpertLoad::kDefault);

// The plan used when config.parallelism.tensor_plan is empty: Megatron's split of the presets'
// transformer modules (Hugging Face's names): q_proj, k_proj, v_proj, gate_proj, up_proj,
// c_attn, c_fc, lm_head, BERT's query, key, value and intermediate.dense, Mixtral's experts' w1
// and w3 (vLLM's stacked w13 too), Megatron's MoE layer's linear_fc1 (its experts' and shared
// experts') and DeepSeek's latent attention's q_b_proj and kv_b_proj (vLLM's; the latents'
// projections replicated) colwise;
// o_proj, down_proj, c_proj, BERT's output.dense, Mixtral's w2 and linear_fc2 rowwise (each
// expert split as vLLM's FusedMoE and Megatron's expert tensor parallelism split it); the token
// embeddings (wte, embed_tokens) rowwise, by vocabulary. gather_lm_head: lm_head
// kColwiseGathered (config.parallelism's gather_lm_head, vLLM's gathered logits).
const std::vector<TensorPlanEntry>& DefaultTensorPlan(bool gather_lm_head = false);

// Whether `pattern` matches module path `module` (TensorPlanEntry::module).
bool PlanMatches(std::string_view pattern, std::string_view module);

}  // namespace memest

#endif  // MEMEST_ENGINE_PASSES_TENSOR_PARALLEL_H_
