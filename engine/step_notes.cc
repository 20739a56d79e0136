// The notes a step's report carries (engine/step_notes.h).
#include "engine/step_notes.h"

#include <string>
#include <string_view>

#include "engine/ir/text.h"
#include "engine/passes/lora.h"
#include "engine/passes/fp8_te.h"
#include "engine/passes/quantize.h"
#include "engine/passes/served_lora.h"
#include "engine/passes/served_quantize.h"
#include "engine/step/python_refs.h"

namespace memest {

using namespace std::string_view_literals;  // kind == "linear"sv: lengths first
namespace {

// The bytes of the distinct storages of `tensors` that are activations (a view's is its base's).
int64_t HeldStorageBytes(const Graph& graph, const std::vector<int>& tensors) {
  std::vector<char> seen(graph.tensors.size(), 0);
  int64_t bytes = 0;
  for (int t : tensors) {
    while (graph.tensors[t].alias_of >= 0) t = graph.tensors[t].alias_of;
    const Tensor& base = graph.tensors[t];
    if (seen[t] || base.role != TensorRole::kActivation) continue;
    seen[t] = 1;
    // Alive together in the walked step, whose totals stay within kMaxBytes: no overflow.
    if (!AddBytes(&bytes, Bytes(base.shape, base.dtype))) break;
  }
  return bytes;
}

}  // namespace

void AddNotes(const Graph& graph, const RunConfig& config, const CheckpointRegions& regions,
              bool has_device, int64_t moe_workspace_bytes, Report* r) {
  if (config.runtime == Runtime::kCpuTorch113) {
    r->notes.push_back("runtime cpu-1.13: PyTorch 1.13 on the CPU, tensors counted at their own "
                       "size (no caching allocator, no CUDA context, no cuBLAS workspace)");
  } else {
    r->notes.push_back("CUDA caching allocator rounding and segments modelled (PyTorch 2.x); "
                       "reserved memory assumes no other allocations in the process");
  }
  bool attention = false, conv = false;
  std::map<std::string, int> fused;  // SDPA calls by the kernel that runs them
  for (const Op& op : graph.ops) {
    conv |= op.kind == "conv1d"sv || op.kind == "conv2d"sv;
    // The math form keeps its scores: a softmax in an attention core (autocast's casts of the
    // fused kernel's inputs sit in the core too), or SDPA's math form.
    if (op.kind == "softmax"sv) attention |= op.scope.find(".core") != std::string::npos;
    if (op.kind != "scaled_dot_product_attention"sv) continue;
    StatusOr<int64_t> fused_attr = IntAttr(op.attrs, "fused", 0, "");
    StatusOr<std::string> backend = StringAttr(op.attrs, "backend", "", "");
    const bool op_fused = fused_attr.ok() && *fused_attr != 0;
    if (op_fused || HasAttr(op.attrs, "backend")) {
      ++fused[backend.ok() ? *backend : std::string()];
    }
    attention |= !op_fused && !HasAttr(op.attrs, "backend");
  }
  const std::string impl = AttentionImplName(ResolveAttention(config));
  if (attention) {
    r->notes.push_back("attention in its math form (eager): the [T, T] scores and "
                       "probabilities are kept for backward; flash / memory-efficient SDPA "
                       "kernels would not keep them (config.attention)");
  }
  if (!fused.empty()) {
    std::string kernels;
    for (const auto& [backend, calls] : fused) {
      kernels += (kernels.empty() ? "" : ", ") + std::to_string(calls) + " " +
                 (backend.empty() ? "chosen as on sm_90" : backend);
    }
    const bool math = fused.count("math") > 0;
    r->notes.push_back("scaled_dot_product_attention (config.attention " + impl +
                       ") as PyTorch 2.x dispatches it: " + kernels +
                       "; the fused kernels keep a float32 logsumexp per query (cuDNN its "
                       "softmax statistics), not the [T, T] scores" +
                       (math ? "; the math kernel keeps them" : ""));
  }
  if (conv && config.runtime == Runtime::kCpuTorch113) {
    r->notes.push_back(std::string("CPU convolutions: the scratch of the kernels PyTorch 1.13 picks "
                                   "with one thread (oneDNN on ") +
                       CpuIsaName(config.cpu_isa) +
                       ", or native im2col) is included for float32 and float64; more threads "
                       "change the kernels");
  } else if (conv) {
    r->notes.push_back("cuDNN convolution workspace is chosen at run time and not included");
  }
  if (config.mode == Mode::kTraining) {
    const bool bnb = IsBitsandbytes(config.optimizer.kind);
    r->notes.push_back(std::string("optimizer: ") + OptimizerKindName(config.optimizer.kind) + " (" +
                       (bnb ? "one kernel per parameter, no scratch"
                            : OptimizerImplName(config.optimizer.impl)) +
                       "), " +
                       (config.step == StepKind::kFirstStep ? "first step: state created inside it"
                                                            : "steady state: state exists") +
                       (config.zero_grad_set_to_none ? "; zero_grad(set_to_none=True)"
                                                     : "; zero_grad(set_to_none=False) keeps grads"));
    if (config.optimizer.kind == OptimizerKind::kBnbPagedAdamW8bit ||
        config.optimizer.kind == OptimizerKind::kBnbPagedAdamW32bit) {
      r->notes.push_back("paged optimizer: the states of parameters of 100,000 elements or more "
                         "are cudaMallocManaged, outside PyTorch's allocator "
                         "(torch.cuda.memory_allocated does not show them); counted here as "
                         "resident, which they are while the step runs, though the driver can "
                         "evict them to host memory under pressure");
    }
    int non_reentrant = 0;
    for (bool b : graph.checkpoint_non_reentrant) non_reentrant += b;
    if (!graph.checkpoints.empty()) {
      r->notes.push_back("checkpointing in the model's code (torch.utils.checkpoint): " +
                         std::to_string(regions.size()) + " regions recomputed in backward (" +
                         std::to_string(non_reentrant) + " with use_reentrant=False)");
    } else if (!regions.empty()) {
      r->notes.push_back(std::string("checkpointing (") +
                         CheckpointPolicyName(config.checkpoint.policy) + (config.checkpoint.non_reentrant ? ", use_reentrant=False" : "") + "): " +
                         std::to_string(regions.size()) + " regions recomputed in backward");
    }
    if (config.hold_outputs && config.parallelism.pipeline == 1) {  // a schedule's own loop
      const bool cache = OutputsHoldCache(config) && !graph.cache.empty();
      const int64_t bytes = HeldStorageBytes(graph, ModelOutputs(graph, config.mode, cache));
      std::string note = "the loop holds the model's outputs (" + FormatBytes(bytes) +
                         ") through backward and the optimizer step, as `outputs = "
                         "model(**batch)` does; a steady-state step starts with the previous "
                         "step's (hold_outputs=false: a loop that lets them go once the loss "
                         "exists, as Hugging Face's Trainer and Lightning do)";
      if (cache) {
        note += "; of them " + FormatBytes(HeldStorageBytes(graph, graph.cache)) +
                " are every layer's keys and values, which the forward returns in "
                "past_key_values under use_cache (true in Hugging Face's configs): "
                "use_cache=False in training, or checkpointing every block "
                "(gradient_checkpointing_enable()), returns none";
      }
      r->notes.push_back(note);
    }
    if (config.precision == Precision::kFp16Amp) {
      r->notes.push_back("fp16 autocast: GradScaler's scalars are negligible and not listed");
    }
  }
  if (moe_workspace_bytes > 0) {
    r->notes.push_back("serving: vLLM's fused mixture-of-experts workspace, " +
                       FormatBytes(moe_workspace_bytes) + ", taken at the first MoE block and "
                       "kept to the end of the profile run");
  }
  if (IsServedWeightFormat(config.quantization.format)) {
    r->notes.push_back(ServedQuantizationNote(graph, config.quantization));
  } else if (config.quantization.format != WeightFormat::kDense) {
    r->notes.push_back(QuantizationNote(graph, PreparedQuantization(config)));
  }
  if (config.fp8.recipe != Fp8Recipe::kNone) r->notes.push_back(TeFp8Note(graph, config.fp8));
  if (config.lora.rank > 0) {
    r->notes.push_back(config.serving.enabled ? ServedLoraNote(graph, ServedLoraOf(config))
                                              : LoraNote(graph, config.lora));
  }
  if (!graph.held.empty()) {
    r->notes.push_back(std::to_string(graph.held.size()) +
                       " tensors stay referenced by the model's code past their last use "
                       "(Python locals, model.held), each until an op of the graph has run");
  }
  if (!has_device && config.runtime == Runtime::kCuda) {
    r->notes.push_back("no device given: CUDA context of a generic H100-class GPU");
  }
  if (config.runtime == Runtime::kCuda) {
    r->notes.push_back(config.module_loading == ModuleLoading::kLazy
                           ? "CUDA context with lazy module loading (CUDA_MODULE_LOADING=LAZY, "
                             "PyTorch's default since 1.13 with CUDA >= 11.7)"
                           : "CUDA context with every kernel image loaded at initialisation "
                             "(CUDA_MODULE_LOADING=EAGER, or CUDA before 11.7)");
  }
}

namespace {

// A pass's bytes per micro-batch over the step's micro-batches, added to the report's
// communicated_bytes_per_step (saturating at kMaxBytes).
void AddCommunicated(const RunConfig& config, int64_t per_micro_batch, Report* r) {
  int64_t sent = 0;
  for (int64_t m = 0; m < config.grad_accum_steps; ++m) {
    if (!AddBytes(&sent, per_micro_batch)) sent = kMaxBytes;
  }
  if (!AddBytes(&r->communicated_bytes_per_step, sent)) r->communicated_bytes_per_step = kMaxBytes;
}

}  // namespace

// What tensor parallelism changed, and what it sends (added to communicated_bytes_per_step).
void AddTensorParallelNotes(const RunConfig& config, const TensorParallelView& tp, Report* r) {
  const ParallelismConfig& p = config.parallelism;
  AddCommunicated(config, tp.communicated_bytes, r);
  std::string whole_grads;
  for (const TensorParallelView::ParamBytes& g : tp.whole_grads) {
    whole_grads += (whole_grads.empty() ? "; the .grad of " : ", ") + Quote(tp.graph.tensors[g.param].name) +
                   " is the whole table on every rank (" + FormatBytes(g.bytes) + ")";
  }
  r->notes.push_back(
      "tensor parallelism over " + std::to_string(p.tensor) + " ranks (" +
      (tp.dtensor ? "DTensor's parallelize_module styles, as torchtitan runs them"
                  : "Megatron-LM's column- and row-parallel linears") +
      (p.sequence_parallel ? ", with sequence parallelism" : "") + "; " +
      (p.tensor_plan.empty() ? "the default plan" : "the given plan") + " splits " +
      std::to_string(tp.sharded_params) + " parameters): this is one rank, whose layer table, "
      "saved bytes and model states are its shares; the parameter counts are the whole model's; " +
      std::to_string(tp.collectives) + " collectives per forward" +
      (tp.global_buffer_bytes > 0 ? ", and Megatron's global buffer of " +
                                        FormatBytes(tp.global_buffer_bytes) + " for the gathers"
                                  : std::string()) +
      whole_grads);
}

void AddContextParallelNotes(const RunConfig& config, const ContextParallelView& cp, Report* r) {
  AddCommunicated(config, cp.communicated_bytes, r);
  r->notes.push_back(
      "context parallelism over " + std::to_string(config.parallelism.context) +
      " ranks (TransformerEngine's ring attention, as Megatron-LM runs it): each holds 1/" +
      std::to_string(config.parallelism.context) + " of every sequence, and its " +
      std::to_string(cp.attentions) + " attention calls pass the keys and values round the ring "
      "(every rank's copy alive in forward, a double buffer of them and their gradients in "
      "backward); parameters and optimizer are each rank's whole");
}

void AddExpertParallelNotes(const RunConfig& config, const ExpertParallelView& ep, Report* r) {
  AddCommunicated(config, ep.communicated_bytes, r);
  r->expert_parallel = ExpertParallelReport{ep.size,          ep.rank,
                                            ep.local_experts, ep.received_rows,
                                            ep.least_rank,    ep.least_received_rows};
  const std::string rows = std::to_string(ep.received_rows);
  r->notes.push_back(
      "expert parallelism over " + std::to_string(ep.size) + " ranks (Megatron-LM's MoELayer with "
      "the all-to-all token dispatcher): each rank holds " + std::to_string(ep.local_experts) +
      " experts of each of the " + std::to_string(ep.layers) + " mixture-of-experts layers and "
      "sends its tokens' choices to their experts' ranks; this is rank " +
      std::to_string(ep.rank) + " of the group, whose experts compute on " + rows +
      " token choices per layer, the most any rank receives (" +
      (ep.least_received_rows == ep.received_rows
           ? std::string("every rank the same")
           : "rank " + std::to_string(ep.least_rank) + " receives " +
                 std::to_string(ep.least_received_rows)) +
      ", under the " + (config.expert_load == ExpertLoad::kBalanced ? "balanced" : "worst") +
      " expert load); the layer table and model states are its share, the parameter counts the "
      "whole model's");
}

}  // namespace memest
