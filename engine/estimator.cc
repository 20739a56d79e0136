#include "engine/estimator.h"

#include <map>
#include <string>

#include "engine/ir/devices.h"
#include "engine/ir/text.h"
#include "engine/passes/checkpoint.h"
#include "engine/passes/context_parallel.h"
#include "engine/passes/expert_parallel.h"
#include "engine/passes/lora.h"
#include "engine/passes/pipeline.h"
#include "engine/models/hf_quantization.h"
#include "engine/passes/fused_moe_workspace.h"
#include "engine/passes/passes.h"
#include "engine/passes/fp8_te.h"
#include "engine/passes/quantize.h"
#include "engine/passes/rnn_expand.h"
#include "engine/passes/served_lora.h"
#include "engine/passes/served_quantize.h"
#include "engine/passes/tensor_parallel.h"
#include "engine/report/advice.h"
#include "engine/report/serving.h"
#include "engine/step_notes.h"
#include "engine/step/liveness.h"
#include "engine/step/python_refs.h"
#include "engine/step/schedule.h"

namespace memest {

StatusOr<PlannedStep> PlanStep(const Graph& built, const RunConfig& config,
                               bool record_operands, Budget* budget, const PipelineStage* stage) {
  MEMEST_RETURN_IF_ERROR(ValidateRunConfig(config));
  if (config.parallelism.pipeline > 1 && stage == nullptr) {
    return InvalidArgument("config.parallelism.pipeline: this query runs one GPU's whole step; "
                           "a pipeline's stages are estimated each on its own (Estimate)");
  }
  PlannedStep step;
  MEMEST_ASSIGN_OR_RETURN(step.device, ResolveDevice(config));
  step.fixed = step.device ? *step.device : BareDevice(0);
  step.fixed.cuda_context_bytes = CudaContextBytes(step.fixed, config.module_loading);
  if (!config.cublas_workspace_config.empty()) {
    MEMEST_ASSIGN_OR_RETURN(step.fixed.cublas_workspace_bytes,
                            CublasWorkspaceBytes(config.cublas_workspace_config,
                                                 "config.cublas_workspace_config"));
  }
  const bool cpu = config.runtime == Runtime::kCpuTorch113;
  if (cpu) step.fixed.cuda_context_bytes = step.fixed.cublas_workspace_bytes = 0;  // no such thing
  if (!cpu) {  // gloo on the CPU keeps its buffers in host memory
    // Megatron's embedding group: the first and last stages of a tied model.
    const bool embedding_group = stage != nullptr && stage->holds_tied_embedding &&
                                 IsMegatron(config.parallelism.sharding);
    const bool moe = HasExpertDispatch(built);  // the router's loss matters only then
    MEMEST_ASSIGN_OR_RETURN(step.nccl,
                            NcclMemoryOf(config.parallelism, step.fixed, embedding_group,
                                         moe, moe && HasRouterAuxLoss(built)));
  }

  // Estimate() builds under autocast already; a graph built without it is replayed.
  const DType half = IsAutocast(config.precision) ? ComputeDType(config.precision) : DType::kFloat32;
  if (built.autocast != DType::kFloat32 && built.autocast != half) {
    return FailedPrecondition(std::string("config.precision: the graph was built under ") +
                              std::string(DTypeName(built.autocast)) + " autocast, not " +
                              PrecisionName(config.precision));
  }
  // The fused attention's output layout is the runtime's (engine/rules/attention.cc): a graph
  // built for one runtime is not the other's.
  if (built.runtime != config.runtime) {
    for (const Op& op : built.ops) {
      if (op.kind != "scaled_dot_product_attention") continue;
      const StatusOr<int64_t> fused = IntAttr(op.attrs, "fused", 0, "");
      if (fused.ok() && *fused != 0) {
        return FailedPrecondition(std::string("config.runtime: the graph was built for ") +
                                  RuntimeName(built.runtime) + ", whose fused attention lays out " +
                                  "its output otherwise; build it for " +
                                  RuntimeName(config.runtime) + " (GraphBuilder::SetRuntime)");
      }
    }
  }
  step.graph = &built;
  if (half != built.autocast) {
    MEMEST_ASSIGN_OR_RETURN(Graph autocast, ApplyAutocast(built, half));
    step.owned = std::make_unique<Graph>(std::move(autocast));
    step.graph = step.owned.get();
  }
  if (cpu && HasRecurrent(*step.graph)) {  // 1.13's CPU path runs them as separate aten ops
    MEMEST_ASSIGN_OR_RETURN(Graph expanded, ExpandRecurrentForCpu(*step.graph));
    step.owned = std::make_unique<Graph>(std::move(expanded));
    step.graph = step.owned.get();
  }
  if (config.parallelism.context > 1) {
    MEMEST_ASSIGN_OR_RETURN(ContextParallelView cp,
                            ShardContextParallel(*step.graph, config.parallelism.context));
    step.context = std::make_unique<ContextParallelView>(std::move(cp));
    step.graph = &step.context->graph;
  }
  if (config.parallelism.tensor > 1) {
    MEMEST_ASSIGN_OR_RETURN(TensorParallelView tp, ShardTensorParallel(*step.graph, config.parallelism,
                                                                       config.expert_load));
    step.tensor = std::make_unique<TensorParallelView>(std::move(tp));
    step.graph = &step.tensor->graph;
  }
  if (config.parallelism.expert > 1 && (stage == nullptr || HasExpertDispatch(*step.graph))) {
    MEMEST_ASSIGN_OR_RETURN(ExpertParallelView ep,
                            ShardExpertParallel(*step.graph, config.parallelism,
                                                config.expert_load, budget));
    step.expert = std::make_unique<ExpertParallelView>(std::move(ep));
    step.graph = &step.expert->graph;
  }
  if (config.serving.enabled && config.lora.rank > 0) {
    // vLLM's adapter slots: each rank's, in the model's dtype (engine/passes/served_lora.h).
    MEMEST_ASSIGN_OR_RETURN(Graph adapted,
                            ApplyServedLora(*step.graph, ServedLoraOf(config), budget));
    step.owned = std::make_unique<Graph>(std::move(adapted));
    step.graph = step.owned.get();
  }
  if (IsServedWeightFormat(config.quantization.format)) {
    // vLLM quantizes each rank's shard: after tensor parallelism (engine/passes/served_quantize.h).
    MEMEST_ASSIGN_OR_RETURN(Graph quantized,
                            ApplyServedQuantization(*step.graph, config.quantization, step.fixed,
                                                    budget));
    step.owned = std::make_unique<Graph>(std::move(quantized));
    step.graph = step.owned.get();
  }
  if (config.serving.enabled) {
    // vLLM's FusedMoE takes its workspace once and keeps it (engine/passes/fused_moe_workspace.h).
    MEMEST_ASSIGN_OR_RETURN(FusedMoeWorkspace workspace, FindFusedMoeWorkspace(*step.graph));
    step.moe_workspace_bytes = workspace.bytes;
    if (workspace.bytes > 0) {
      MEMEST_ASSIGN_OR_RETURN(Graph with, AddFusedMoeWorkspace(*step.graph, workspace, budget));
      step.owned = std::make_unique<Graph>(std::move(with));
      step.graph = step.owned.get();
    }
  }
  const bool rebuilt = step.context || step.tensor || step.expert;
  if (stage != nullptr && stage->chunks.size() > 1 && rebuilt) {
    // The passes rebuilt the stage's graph: its chunks' ops and sent tensors moved with it.
    auto moved = std::make_unique<PipelineStage>();
    moved->stage = stage->stage;
    moved->stages = stage->stages;
    moved->first_block = stage->first_block;
    moved->last_block = stage->last_block;
    moved->actions = stage->actions;
    moved->keep_outputs = stage->keep_outputs;
    moved->fold = stage->fold;
    moved->chunks = stage->chunks;
    for (const ReplayMap* m : {step.context ? &step.context->replay : nullptr,
                               step.tensor ? &step.tensor->replay : nullptr,
                               step.expert ? &step.expert->replay : nullptr}) {
      if (m == nullptr) continue;
      for (StageChunk& c : moved->chunks) {
        c.first_op = m->first_op[c.first_op];
        c.last_op = m->last_op[c.last_op];
        c.sent = m->tensors[c.sent];
      }
    }
    step.stage = std::move(moved);
    stage = step.stage.get();
  }
  if (config.mode == Mode::kTraining) {
    MEMEST_ASSIGN_OR_RETURN(step.regions, PlanCheckpoints(*step.graph, config.checkpoint));
  }
  if (config.mode == Mode::kTraining && step.graph->loss < 0) {
    return InvalidArgument("model: training needs a loss (a scalar to call backward on)");
  }
  MEMEST_ASSIGN_OR_RETURN(step.rank, PlanDataParallel(*step.graph, config));
  ScheduleOptions options{step.fixed.cublas_workspace_bytes, record_operands, budget,
                          &step.rank, stage, step.tensor.get()};
  if (step.fixed.multiprocessors > 0) options.gpu.multiprocessors = step.fixed.multiprocessors;
  options.gpu.max_threads_per_multiprocessor =
      MaxThreadsPerMultiprocessor(step.fixed.compute_capability);
  MEMEST_ASSIGN_OR_RETURN(step.schedule,
                          BuildSchedule(*step.graph, config, step.regions, options));
  MEMEST_ASSIGN_OR_RETURN(step.live,
                          WalkSchedule(step.schedule, *step.graph, config.expandable_segments,
                                       cpu ? Accounting::kExact : Accounting::kCachingAllocator,
                                       budget));
  return step;
}

Report ReportStep(const Graph& built, const RunConfig& config, const PlannedStep& step) {
  const Liveness& live = step.live;
  Report r;
  r.parameter_count = built.ParameterCount();
  r.trainable_parameter_count = built.TrainableParameterCount();
  r.micro_batch = config.micro_batch();
  r.op_count = static_cast<int64_t>(step.graph->ops.size());
  r.peak = live.peak;
  r.peak_reserved_bytes = live.peak_reserved;
  r.phases = live.phases;
  r.layers = step.schedule.layers;
  r.breakdown = live.peak.by_category;
  r.saved_for_backward_bytes = step.schedule.saved_for_backward_bytes;
  r.end_of_step = live.at_end;
  int64_t counted = 0;
  for (int64_t b : r.breakdown) counted += b;
  r.breakdown[static_cast<int>(Category::kAllocatorOverhead)] =
      std::max<int64_t>(0, live.reserved_at_peak - counted);
  r.breakdown[static_cast<int>(Category::kCudaContext)] = step.fixed.cuda_context_bytes;
  r.breakdown[static_cast<int>(Category::kNccl)] = step.nccl.bytes;
  if (step.device) {
    DeviceFit fit;
    fit.device = step.device->name;
    fit.capacity_bytes = step.device->capacity_bytes;
    // Both 0 on the CPU; NCCL's bytes are bounded (engine/ir/nccl.h), the sum does not overflow.
    fit.required_bytes = live.peak_reserved + step.fixed.cuda_context_bytes + step.nccl.bytes;
    fit.fits = fit.required_bytes <= fit.capacity_bytes;
    fit.headroom_bytes = fit.capacity_bytes - fit.required_bytes;
    r.fit = fit;
  }
  AddNotes(*step.graph, config, step.regions, step.device.has_value(), step.moe_workspace_bytes,
           &r);
  if (config.serving.enabled && config.lora.rank > 0) {  // EstimateServing fills in the rest
    r.serving.emplace();
    r.serving->lora_bytes = ServedLoraBytes(*step.graph);
  }
  if (step.nccl.bytes > 0) r.notes.push_back(NcclNote(step.nccl));
  int64_t recomputed = 0;
  for (const auto& [first, last] : step.regions) recomputed += last - first + 1;
  if (!step.graph->ops.empty()) {
    r.recompute_fraction = static_cast<double>(recomputed) / static_cast<double>(step.graph->ops.size());
  }
  r.communicated_bytes_per_step = CommunicatedBytesPerStep(*step.graph, config);
  if (step.tensor) AddTensorParallelNotes(config, *step.tensor, &r);
  if (step.context) AddContextParallelNotes(config, *step.context, &r);
  if (step.expert) AddExpertParallelNotes(config, *step.expert, &r);
  if (!step.expert && config.expert_load != ExpertLoad::kDefault && HasExpertDispatch(*step.graph)) {
    // An op graph's recorded routing stands on one expert-parallel rank.
    r.notes.push_back("config.expert_load applies to the tokens expert-parallel ranks receive; "
                      "with one expert-parallel rank the graph's recorded routing (its split "
                      "sizes) stands, and the load changes nothing");
  }
  if (config.parallelism.sharding != DataSharding::kNone) {
    r.data_parallel = DataParallelReportOf(step.rank);
    AddDataParallelNotes(config, step.rank, &r);
  }
  if (step.device && !step.device->cuda) {
    r.notes.push_back(step.device->name + " runs PyTorch through ROCm: estimated with its "
                      "capacity and the caching allocator's rules (shared with CUDA), with "
                      "sm_90's attention kernels and an H100-class context; Validate refuses it");
  }
  return r;
}

namespace {

// Every stage estimated on its own; the report is the stage that needs the most, with every
// stage's peak.
StatusOr<Report> EstimatePipeline(const Graph& built, const RunConfig& config, Budget* budget,
                                  bool end_stages_only) {
  if (config.parallelism.expert > 1 && !HasExpertDispatch(built)) {
    // The pass's refusal: the model has no MoE layer to split (a stage may have none).
    return ShardExpertParallel(built, config.parallelism, config.expert_load, budget).status();
  }
  PipelineReport pipeline;
  pipeline.stages = config.parallelism.pipeline;
  pipeline.micro_batches = config.grad_accum_steps;
  std::optional<Report> worst;
  size_t worst_row = 0;
  for (int64_t s = 0; s < config.parallelism.pipeline; ++s) {
    if (end_stages_only && s > 0 && s + 1 < config.parallelism.pipeline) continue;
    MEMEST_ASSIGN_OR_RETURN(PipelineStage stage, PlanPipelineStage(built, config, s));
    MEMEST_ASSIGN_OR_RETURN(PlannedStep step, PlanStep(stage.graph, config, false, budget, &stage));
    Report r = ReportStep(stage.graph, config, step);
    PipelineStageReport row;
    row.stage = s;
    row.first_block = stage.first_block;
    row.last_block = stage.last_block;
    row.peak_allocated_bytes = r.peak.allocated_bytes;
    row.peak_reserved_bytes = r.peak_reserved_bytes;
    row.peak_phase = r.peak.phase;
    row.parameter_count = r.parameter_count;
    pipeline.per_stage.push_back(row);
    if (!worst || r.peak_reserved_bytes > worst->peak_reserved_bytes) {
      worst = std::move(r);
      pipeline.worst_stage = s;
      worst_row = pipeline.per_stage.size() - 1;
    }
  }
  const PipelineStageReport& w = pipeline.per_stage[worst_row];
  const int64_t v = config.parallelism.pipeline_virtual_stages;
  const int64_t per_chunk = static_cast<int64_t>(built.blocks.size()) / (pipeline.stages * v);
  worst->parameter_count = built.ParameterCount();
  worst->trainable_parameter_count = built.TrainableParameterCount();
  worst->notes.push_back(
      "pipeline of " + std::to_string(pipeline.stages) + " stages, " +
      std::to_string(pipeline.micro_batches) + " micro-batches, " +
      (config.parallelism.pipeline_schedule == PipelineSchedule::kGPipe ? "GPipe" : "1F1B") +
      (v > 1 ? " interleaved over " + std::to_string(v) + " model chunks per stage" : "") +
      ": this is stage " + std::to_string(w.stage) +
      (v > 1 ? " (chunks of " + std::to_string(per_chunk) + " blocks at virtual stages " +
                   std::to_string(w.stage) + ", " + std::to_string(w.stage + pipeline.stages) +
                   ", ...: blocks " + std::to_string(w.first_block) + " to " +
                   std::to_string(w.last_block) + ")"
             : " (blocks " + std::to_string(w.first_block) + "-" + std::to_string(w.last_block) + ")") +
      ", the one that needs the most; each stage holds the activations of the micro-batches "
      "its schedule keeps in flight" +
      (config.parallelism.pipeline_keep_outputs
           ? ", and each sent output until its backward"
           : "; a sent output is freed once sent (Megatron's deallocate_output_tensor)") +
      "; the parameter counts above are the whole model's, the layer table the stage's");
  worst->pipeline = std::move(pipeline);
  return std::move(*worst);
}

}  // namespace

StatusOr<std::optional<DeviceInfo>> ResolveDevice(const RunConfig& config) {
  if (!config.device.empty()) {
    StatusOr<DeviceInfo> d = FindDevice(config.device);
    if (!d.ok()) return d.status().Prefixed("config.device_name: ");
    return std::optional<DeviceInfo>(*d);
  }
  if (config.device_capacity_bytes > 0) {
    return std::optional<DeviceInfo>(BareDevice(config.device_capacity_bytes));
  }
  return std::optional<DeviceInfo>();
}

StatusOr<Report> EstimateGraph(const Graph& built, const RunConfig& config,
                               const EstimateOptions& options) {
  if (options.budget != nullptr) MEMEST_RETURN_IF_ERROR(options.budget->status());
  if (config.parallelism.pipeline > 1) {
    MEMEST_RETURN_IF_ERROR(ValidateRunConfig(config));
    return EstimatePipeline(built, config, options.budget, options.end_stages_only);
  }
  MEMEST_ASSIGN_OR_RETURN(PlannedStep step, PlanStep(built, config, false, options.budget));
  return ReportStep(built, config, step);
}

StatusOr<BuildContext> StepBuildContext(const RunConfig& config, int64_t max_ops,
                                        Budget* budget) {
  MEMEST_RETURN_IF_ERROR(ValidateRunConfig(config));
  BuildContext ctx;
  ctx.micro_batch = config.micro_batch();
  ctx.mode = config.mode;
  ctx.param_dtype = ParameterDType(config.precision);
  ctx.generate_tokens = config.generate_tokens;
  ctx.max_ops = max_ops;
  ctx.budget = budget;
  if (IsAutocast(config.precision)) ctx.autocast = ComputeDType(config.precision);
  ctx.attention = ResolveAttention(config);
  ctx.runtime = config.runtime;
  ctx.expert_load = config.expert_load;
  ctx.megatron = IsMegatron(config.parallelism.sharding);
  MEMEST_ASSIGN_OR_RETURN(std::optional<DeviceInfo> device, ResolveDevice(config));
  ctx.compute_capability = device ? AttentionCapability(*device) : 90;
  if (device) ctx.multiprocessors = device->multiprocessors;
  return ctx;
}

StatusOr<Graph> BuildStepGraph(const ModelSpec& model, const RunConfig& config, int64_t max_ops,
                               Budget* budget) {
  MEMEST_ASSIGN_OR_RETURN(BuildContext ctx, StepBuildContext(config, max_ops, budget));
  // prepare_model_for_kbit_training leaves every parameter that is not 4-bit in float32, and the
  // activations follow: the model is built in float32, its 4-bit weights loaded in the
  // precision's dtype (engine/passes/quantize.h).
  std::optional<DType> loaded;
  if (KbitPrepared(config) &&
      (ctx.param_dtype == DType::kFloat16 || ctx.param_dtype == DType::kBFloat16)) {
    loaded = ctx.param_dtype;
    ctx.param_dtype = DType::kFloat32;
  }
  MEMEST_ASSIGN_OR_RETURN(Graph graph, BuildGraph(model, ctx));
  if (config.fp8.recipe != Fp8Recipe::kNone) {  // neither quantization nor adapters (ValidateFp8)
    MEMEST_ASSIGN_OR_RETURN(std::optional<DeviceInfo> device, ResolveDevice(config));
    const int capability = device ? device->compute_capability : 90;  // 0: not CUDA
    if (capability < 89) {
      return InvalidArgument("config.fp8: TransformerEngine's fp8 GEMMs need an NVIDIA GPU of "
                             "compute capability 8.9 or later (Ada, Hopper, Blackwell); " +
                             std::string(device ? device->name : "") + " is " +
                             (capability == 0 ? std::string("not one")
                                              : std::to_string(capability / 10) + "." +
                                                    std::to_string(capability % 10)));
    }
    return ApplyTeFp8(graph, config.fp8, capability, budget);
  }
  if (config.quantization.format == WeightFormat::kTorchaoInt4) {
    MEMEST_ASSIGN_OR_RETURN(std::optional<DeviceInfo> device, ResolveDevice(config));
    if (device && (device->compute_capability < 90 || device->compute_capability >= 100)) {
      return InvalidArgument("config.quantization.format: torchao-int4's kernel "
                             "(mslk.bf16i4bf16_rowwise) runs on sm_90 (H100, H200); " +
                             device->name + " is not one");
    }
  }
  if (config.quantization.format != WeightFormat::kDense) {
    MEMEST_ASSIGN_OR_RETURN(
        graph, ApplyQuantization(graph, PreparedQuantization(config), budget, loaded));
  }
  if (config.lora.rank == 0) {
    if (config.quantization.format != WeightFormat::kDense && config.mode == Mode::kTraining &&
        graph.TrainableParameterCount() == 0) {
      // loss.backward() would raise: nothing requires grad.
      return InvalidArgument("config.quantization: in training, the quantized model has no "
                             "parameter left to train (its Linears are frozen" +
                             std::string(KbitPrepared(config)
                                             ? ", prepare_model_for_kbit_training froze the rest"
                                             : "") +
                             "); add adapters (config.lora), or estimate inference");
    }
    return graph;
  }
  LoraConfig lora = config.lora;
  // DeepSpeed's engine casts the whole module to its bf16 or fp16 dtype
  // (_configure_distributed_model: module.bfloat16() / half()), PEFT's float32 adapters too.
  if (IsDeepSpeed(config.parallelism.sharding)) lora.autocast_adapter_dtype = false;
  return ApplyLora(graph, lora, max_ops, budget);
}

// A config.json with a quantization_config: the checkpoint's quantization as config.quantization
// (engine/models/hf_quantization.h), which the request leaves unset, and the model built
// without it.
StatusOr<Report> EstimateQuantizedCheckpoint(const ModelSpec& model, const RunConfig& config,
                                             const EstimateOptions& options) {
  RunConfig quantized = config;
  MEMEST_ASSIGN_OR_RETURN(ModelSpec plain, ResolveCheckpointQuantization(model, &quantized));
  MEMEST_ASSIGN_OR_RETURN(Report report, Estimate(plain, quantized, options));
  report.notes.push_back(std::string("quantization ") +
                         WeightFormatName(quantized.quantization.format) +
                         " from the config's quantization_config (quant_method " +
                         HfQuantMethod(std::get<HfConfigSpec>(model.source).config) + ")");
  return report;
}

namespace {

bool QuantizedCheckpoint(const ModelSpec& model) {
  const auto* hf = std::get_if<HfConfigSpec>(&model.source);
  return hf != nullptr && hf->config.Find("quantization_config") != nullptr;
}

}  // namespace

bool BuildsPlainGraph(const ModelSpec& model, const RunConfig& config) {
  // Estimate() routes these elsewhere; BuildStepGraph's passes rewrite the graph for the rest.
  return !QuantizedCheckpoint(model) && !config.serving.enabled &&
         config.fp8.recipe == Fp8Recipe::kNone &&
         config.quantization.format == WeightFormat::kDense && config.lora.rank == 0;
}

StatusOr<Report> Estimate(const ModelSpec& model, const RunConfig& config,
                          const EstimateOptions& options) {
  if (options.budget != nullptr) MEMEST_RETURN_IF_ERROR(options.budget->status());
  if (QuantizedCheckpoint(model)) return EstimateQuantizedCheckpoint(model, config, options);
  if (config.serving.enabled) return EstimateServing(model, config, options);
  MEMEST_ASSIGN_OR_RETURN(Graph graph,
                          BuildStepGraph(model, config, options.max_ops, options.budget));
  return EstimateBuilt(model, graph, config, options);
}

StatusOr<Report> EstimateBuilt(const ModelSpec& model, const Graph& graph,
                               const RunConfig& config, const EstimateOptions& options) {
  Budget unlimited;
  Budget* budget = options.budget != nullptr ? options.budget : &unlimited;
  // Every op runs forward at least once per micro-batch simulated: a step that cannot afford
  // that much is refused before it is scheduled. A pipeline's stages simulate their folds
  // (engine/passes/pipeline.h), the stage that simulates the fewest bounding every other.
  int64_t micro_batches = config.mode == Mode::kTraining && config.grad_accum_steps > 1 ? 2 : 1;
  if (config.parallelism.pipeline > 1) {
    micro_batches = config.grad_accum_steps;
    for (int64_t s = 0; s < config.parallelism.pipeline; ++s) {
      micro_batches = std::min(micro_batches, SimulatedMicroBatches(config, s));
    }
  }
  const int64_t least = static_cast<int64_t>(graph.ops.size()) * micro_batches;
  if (!budget->Affords(least)) {
    return ResourceExhausted("model: one step of its " + std::to_string(graph.ops.size()) +
                             " ops needs at least " + std::to_string(least) +
                             " op steps, more than the " +
                             std::to_string(budget->max_op_steps() - budget->spent()) +
                             " left of this request's budget");
  }
  EstimateOptions charged = options;
  charged.budget = budget;
  MEMEST_ASSIGN_OR_RETURN(Report report, EstimateGraph(graph, config, charged));
  if (options.advice && !options.end_stages_only) {
    MEMEST_ASSIGN_OR_RETURN(report.advice, MakeAdvice(model, graph, config, report, budget));
    if (budget->spent_out()) {
      report.notes.push_back("advice cut short: this request's budget of " +
                             std::to_string(budget->max_op_steps()) +
                             " op steps was spent before every alternative was measured (" +
                             std::to_string(report.advice.size()) +
                             " listed); ask with skip_advice for the estimate alone");
    }
  }
  return report;
}

}  // namespace memest
