#include "server/convert.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "engine/ir/text.h"
#include "server/explicit_settings.h"

namespace memest {
namespace {

// A byte count or element count for an unsigned proto field. The engine never produces a
// negative one; should it, 0 is less wrong on the wire than a wrapped 2^64 - n.
uint64_t Unsigned(int64_t value) { return value < 0 ? 0 : static_cast<uint64_t>(value); }

Status Unknown(const std::string& field, int value) {
  return InvalidArgument(field + ": unknown value " + std::to_string(value));
}

Status NotFinite(const std::string& field, double value) {
  return InvalidArgument(field + ": must be a finite number, got " + std::to_string(value));
}

StatusOr<DType> DTypeFromProto(const std::string& name, const std::string& field) {
  if (name.empty()) return DType::kFloat32;
  StatusOr<DType> dtype = ParseDType(name);
  if (!dtype.ok()) return dtype.status().Prefixed(field + ": ");
  return dtype;
}

// CheckNameSize for each of `names`, naming "<field>[i]".
Status CheckNamesSize(const google::protobuf::RepeatedPtrField<std::string>& names,
                      const std::string& field) {
  for (int i = 0; i < names.size(); ++i) {
    MEMEST_RETURN_IF_ERROR(CheckNameSize(names.Get(i), field + "[" + std::to_string(i) + "]"));
  }
  return Status::Ok();
}

StatusOr<AttrValue> AttrFromProto(const v1::AttrValue& value, const std::string& field) {
  switch (value.value_case()) {
    case v1::AttrValue::kI:
      return AttrValue(int64_t{value.i()});
    case v1::AttrValue::kF:
      if (!std::isfinite(value.f())) return NotFinite(field, value.f());
      return AttrValue(value.f());
    case v1::AttrValue::kInts:
      return AttrValue(
          std::vector<int64_t>(value.ints().values().begin(), value.ints().values().end()));
    case v1::AttrValue::kS:
      MEMEST_RETURN_IF_ERROR(CheckNameSize(value.s(), field));
      return AttrValue(value.s());
    case v1::AttrValue::VALUE_NOT_SET:
      break;
  }
  return InvalidArgument(field + ": no value set (expected one of i, f, ints, s)");
}

// `context` is the owner's path, e.g. "model.layers[3]"; errors name "<context>.attrs.<name>".
StatusOr<Attrs> AttrsFromProto(const google::protobuf::Map<std::string, v1::AttrValue>& attrs,
                               const std::string& context) {
  // Sorted, so that the first error reported does not depend on hash order.
  std::vector<const std::string*> names;
  names.reserve(attrs.size());
  for (const auto& [name, value] : attrs) names.push_back(&name);
  std::sort(names.begin(), names.end(),
            [](const std::string* a, const std::string* b) { return *a < *b; });
  Attrs out;
  for (const std::string* name : names) {
    MEMEST_RETURN_IF_ERROR(CheckNameSize(*name, context + ".attrs"));
    MEMEST_ASSIGN_OR_RETURN(AttrValue value,
                            AttrFromProto(attrs.at(*name), context + ".attrs." + Escape(*name)));
    out.emplace(*name, std::move(value));
  }
  return out;
}

StatusOr<LayerModelSpec> LayerModelFromProto(const v1::LayerModel& model) {
  LayerModelSpec spec;
  spec.input_shape.assign(model.input_shape().begin(), model.input_shape().end());
  MEMEST_ASSIGN_OR_RETURN(spec.input_dtype,
                          DTypeFromProto(model.input_dtype(), "model.input_dtype"));
  spec.layers.reserve(model.layers_size());
  for (int i = 0; i < model.layers_size(); ++i) {
    const v1::Layer& layer = model.layers(i);
    const std::string field = "model.layers[" + std::to_string(i) + "]";
    MEMEST_RETURN_IF_ERROR(CheckNameSize(layer.name(), field + ".name"));
    LayerSpec& out = spec.layers.emplace_back();
    out.kind = layer.kind();
    out.name = layer.name();
    MEMEST_ASSIGN_OR_RETURN(out.attrs, AttrsFromProto(layer.attrs(), field));
  }
  if (!model.loss().empty()) spec.loss = model.loss();
  return spec;
}

StatusOr<OpGraphSpec> OpGraphFromProto(const v1::OpGraph& graph) {
  OpGraphSpec spec;
  spec.tensors.reserve(graph.tensors_size());
  for (int i = 0; i < graph.tensors_size(); ++i) {
    const v1::TensorDecl& tensor = graph.tensors(i);
    const std::string field = "model.tensors[" + std::to_string(i) + "]";
    MEMEST_RETURN_IF_ERROR(CheckNameSize(tensor.name(), field + ".name"));
    TensorSpec& out = spec.tensors.emplace_back();
    out.name = tensor.name();
    out.shape.assign(tensor.shape().begin(), tensor.shape().end());
    MEMEST_ASSIGN_OR_RETURN(out.dtype, DTypeFromProto(tensor.dtype(), field + ".dtype"));
    MEMEST_ASSIGN_OR_RETURN(out.role, TensorRoleFromProto(tensor.role(), field + ".role"));
    out.batch_dim = tensor.batch_dim();
    out.requires_grad = !tensor.frozen();
    out.input_requires_grad = tensor.requires_grad();
  }
  spec.ops.reserve(graph.ops_size());
  for (int i = 0; i < graph.ops_size(); ++i) {
    const v1::OpDecl& op = graph.ops(i);
    const std::string field = "model.ops[" + std::to_string(i) + "]";
    MEMEST_RETURN_IF_ERROR(CheckNamesSize(op.inputs(), field + ".inputs"));
    MEMEST_RETURN_IF_ERROR(CheckNamesSize(op.outputs(), field + ".outputs"));
    MEMEST_RETURN_IF_ERROR(CheckNameSize(op.scope(), field + ".scope"));
    OpSpec& out = spec.ops.emplace_back();
    out.kind = op.kind();
    out.inputs.assign(op.inputs().begin(), op.inputs().end());
    out.outputs.assign(op.outputs().begin(), op.outputs().end());
    MEMEST_ASSIGN_OR_RETURN(out.attrs, AttrsFromProto(op.attrs(), field));
    out.scope = op.scope();
  }
  MEMEST_RETURN_IF_ERROR(CheckNameSize(graph.loss(), "model.loss"));
  MEMEST_RETURN_IF_ERROR(CheckNamesSize(graph.blocks(), "model.blocks"));
  spec.loss = graph.loss();
  spec.blocks.assign(graph.blocks().begin(), graph.blocks().end());
  spec.traced_batch = graph.traced_batch();
  for (const v1::CheckpointRegion& c : graph.checkpoints()) {
    spec.checkpoints.push_back({c.first_op(), c.last_op(), c.non_reentrant()});
  }
  for (int k = 0; k < graph.held_size(); ++k) {
    const v1::HeldTensor& h = graph.held(k);
    MEMEST_RETURN_IF_ERROR(
        CheckNameSize(h.tensor(), "model.held[" + std::to_string(k) + "].tensor"));
    spec.held.push_back({h.tensor(), h.until_op()});
  }
  MEMEST_RETURN_IF_ERROR(CheckNamesSize(graph.outputs(), "model.outputs"));
  spec.outputs.assign(graph.outputs().begin(), graph.outputs().end());
  return spec;
}

void CategoriesToProto(const CategoryBytes& bytes, v1::MemoryByCategory* out) {
  auto at = [&bytes](Category c) { return Unsigned(bytes[static_cast<int>(c)]); };
  out->set_parameters(at(Category::kParameters));
  out->set_gradients(at(Category::kGradients));
  out->set_optimizer_state(at(Category::kOptimizerState));
  out->set_master_and_casts(at(Category::kMasterAndCasts));
  out->set_activations(at(Category::kActivations));
  out->set_temporaries(at(Category::kTemporaries));
  out->set_inputs(at(Category::kInputs));
  out->set_kv_cache(at(Category::kKvCache));
  out->set_workspace(at(Category::kWorkspace));
  out->set_allocator_overhead(at(Category::kAllocatorOverhead));
  out->set_cuda_context(at(Category::kCudaContext));
  out->set_nccl(at(Category::kNccl));
  out->set_communication(at(Category::kCommunication));
  static_assert(kNumCategories == 13, "a new Category needs a field in MemoryByCategory");
}

void PeakToProto(const PeakPoint& peak, v1::Peak* out) {
  out->set_phase(PhaseToProto(peak.phase));
  out->set_allocated_bytes(Unsigned(peak.allocated_bytes));
  out->set_reserved_bytes(Unsigned(peak.reserved_bytes));
  CategoriesToProto(peak.by_category, out->mutable_by_category());
  out->set_op(peak.op);
  out->set_scope(peak.scope);
  out->set_micro_batch(peak.micro_batch);
  out->set_recompute(peak.recompute);
}

}  // namespace

StatusOr<Mode> ModeFromProto(int value, const std::string& field) {
  switch (value) {
    case v1::MODE_UNSPECIFIED:
    case v1::MODE_TRAINING:
      return Mode::kTraining;
    case v1::MODE_INFERENCE:
      return Mode::kInference;
  }
  return Unknown(field, value);
}

StatusOr<Precision> PrecisionFromProto(int value, const std::string& field) {
  switch (value) {
    case v1::PRECISION_UNSPECIFIED:
    case v1::PRECISION_FP32:
      return Precision::kFp32;
    case v1::PRECISION_FP16_AMP:
      return Precision::kFp16Amp;
    case v1::PRECISION_BF16_AMP:
      return Precision::kBf16Amp;
    case v1::PRECISION_BF16_PURE:
      return Precision::kBf16Pure;
    case v1::PRECISION_FP16_PURE:
      return Precision::kFp16Pure;
  }
  return Unknown(field, value);
}

StatusOr<OptimizerKind> OptimizerKindFromProto(int value, const std::string& field) {
  switch (value) {
    case v1::OPTIMIZER_KIND_UNSPECIFIED:
    case v1::OPTIMIZER_KIND_ADAMW:
      return OptimizerKind::kAdamW;
    case v1::OPTIMIZER_KIND_SGD:
      return OptimizerKind::kSgd;
    case v1::OPTIMIZER_KIND_SGD_MOMENTUM:
      return OptimizerKind::kSgdMomentum;
    case v1::OPTIMIZER_KIND_ADAM:
      return OptimizerKind::kAdam;
    case v1::OPTIMIZER_KIND_ADAGRAD:
      return OptimizerKind::kAdagrad;
    case v1::OPTIMIZER_KIND_RMSPROP:
      return OptimizerKind::kRmsprop;
    case v1::OPTIMIZER_KIND_LION:
      return OptimizerKind::kLion;
    case v1::OPTIMIZER_KIND_ADAFACTOR:
      return OptimizerKind::kAdafactor;
    case v1::OPTIMIZER_KIND_HF_ADAMW:
      return OptimizerKind::kHfAdamW;
    case v1::OPTIMIZER_KIND_HF_ADAFACTOR:
      return OptimizerKind::kHfAdafactor;
    case v1::OPTIMIZER_KIND_BNB_ADAMW_8BIT:
      return OptimizerKind::kBnbAdamW8bit;
    case v1::OPTIMIZER_KIND_BNB_PAGED_ADAMW_8BIT:
      return OptimizerKind::kBnbPagedAdamW8bit;
    case v1::OPTIMIZER_KIND_BNB_PAGED_ADAMW_32BIT:
      return OptimizerKind::kBnbPagedAdamW32bit;
  }
  return Unknown(field, value);
}

StatusOr<OptimizerImpl> OptimizerImplFromProto(int value, const std::string& field) {
  switch (value) {
    case v1::OPTIMIZER_IMPL_UNSPECIFIED:
    case v1::OPTIMIZER_IMPL_FOREACH:
      return OptimizerImpl::kForeach;
    case v1::OPTIMIZER_IMPL_FOR_LOOP:
      return OptimizerImpl::kForLoop;
    case v1::OPTIMIZER_IMPL_FUSED:
      return OptimizerImpl::kFused;
  }
  return Unknown(field, value);
}

StatusOr<CheckpointPolicy> CheckpointPolicyFromProto(int value, const std::string& field) {
  switch (value) {
    case v1::CHECKPOINT_POLICY_UNSPECIFIED:
    case v1::CHECKPOINT_POLICY_NONE:
      return CheckpointPolicy::kNone;
    case v1::CHECKPOINT_POLICY_EVERY_BLOCK:
      return CheckpointPolicy::kEveryBlock;
    case v1::CHECKPOINT_POLICY_EVERY_K_BLOCKS:
      return CheckpointPolicy::kEveryKBlocks;
    case v1::CHECKPOINT_POLICY_SQRT_BLOCKS:
      return CheckpointPolicy::kSqrtBlocks;
    case v1::CHECKPOINT_POLICY_ATTENTION_CORE:
      return CheckpointPolicy::kAttentionCore;
    case v1::CHECKPOINT_POLICY_SCOPES:
      return CheckpointPolicy::kScopes;
  }
  return Unknown(field, value);
}

StatusOr<StepKind> StepKindFromProto(int value, const std::string& field) {
  switch (value) {
    case v1::STEP_KIND_UNSPECIFIED:
    case v1::STEP_KIND_STEADY_STATE:
      return StepKind::kSteadyState;
    case v1::STEP_KIND_FIRST_STEP:
      return StepKind::kFirstStep;
  }
  return Unknown(field, value);
}

StatusOr<Runtime> RuntimeFromProto(int value, const std::string& field) {
  switch (value) {
    case v1::RUNTIME_UNSPECIFIED:
    case v1::RUNTIME_CUDA:
      return Runtime::kCuda;
    case v1::RUNTIME_CPU_TORCH_1_13:
      return Runtime::kCpuTorch113;
  }
  return Unknown(field, value);
}

StatusOr<AttentionImpl> AttentionFromProto(int value, const std::string& field) {
  switch (value) {
    case v1::ATTENTION_UNSPECIFIED:
      return AttentionImpl::kDefault;
    case v1::ATTENTION_EAGER:
      return AttentionImpl::kEager;
    case v1::ATTENTION_SDPA:
      return AttentionImpl::kSdpa;
    case v1::ATTENTION_FLASH:
      return AttentionImpl::kFlash;
    case v1::ATTENTION_MEM_EFFICIENT:
      return AttentionImpl::kMemEfficient;
    case v1::ATTENTION_CUDNN:
      return AttentionImpl::kCudnn;
  }
  return Unknown(field, value);
}

StatusOr<ModuleLoading> ModuleLoadingFromProto(int value, const std::string& field) {
  switch (value) {
    case v1::CUDA_MODULE_LOADING_UNSPECIFIED:
    case v1::CUDA_MODULE_LOADING_LAZY:
      return ModuleLoading::kLazy;
    case v1::CUDA_MODULE_LOADING_EAGER:
      return ModuleLoading::kEager;
  }
  return Unknown(field, value);
}

StatusOr<ExpertLoad> ExpertLoadFromProto(int value, const std::string& field) {
  switch (value) {
    case v1::EXPERT_LOAD_UNSPECIFIED:
      return ExpertLoad::kDefault;
    case v1::EXPERT_LOAD_WORST:
      return ExpertLoad::kWorst;
    case v1::EXPERT_LOAD_BALANCED:
      return ExpertLoad::kBalanced;
  }
  return Unknown(field, value);
}

StatusOr<CpuIsa> CpuIsaFromProto(int value, const std::string& field) {
  switch (value) {
    case v1::CPU_ISA_UNSPECIFIED:
    case v1::CPU_ISA_AVX512:
      return CpuIsa::kAvx512;
    case v1::CPU_ISA_AVX2:
      return CpuIsa::kAvx2;
  }
  return Unknown(field, value);
}

StatusOr<TensorRole> TensorRoleFromProto(int value, const std::string& field) {
  switch (value) {
    case v1::TENSOR_ROLE_UNSPECIFIED:
    case v1::TENSOR_ROLE_INPUT:
      return TensorRole::kInput;
    case v1::TENSOR_ROLE_ACTIVATION:
      return TensorRole::kActivation;
    case v1::TENSOR_ROLE_TARGET:
      return TensorRole::kTarget;
    case v1::TENSOR_ROLE_PARAMETER:
      return TensorRole::kParameter;
    case v1::TENSOR_ROLE_BUFFER:
      return TensorRole::kBuffer;
  }
  return Unknown(field, value);
}

v1::Phase PhaseToProto(Phase phase) {
  switch (phase) {
    case Phase::kData:
      return v1::PHASE_DATA;
    case Phase::kForward:
      return v1::PHASE_FORWARD;
    case Phase::kLoss:
      return v1::PHASE_LOSS;
    case Phase::kBackward:
      return v1::PHASE_BACKWARD;
    case Phase::kOptimizerStep:
      return v1::PHASE_OPTIMIZER_STEP;
    case Phase::kCount:
      break;
  }
  return v1::PHASE_UNSPECIFIED;
}

StatusOr<ModelSpec> ModelFromProto(const v1::Model& model) {
  switch (model.source_case()) {
    case v1::Model::kPreset: {
      PresetSpec spec;
      spec.name = model.preset().name();
      spec.params.insert(model.preset().params().begin(), model.preset().params().end());
      return ModelSpec{std::move(spec)};
    }
    case v1::Model::kLayers: {
      MEMEST_ASSIGN_OR_RETURN(LayerModelSpec spec, LayerModelFromProto(model.layers()));
      return ModelSpec{std::move(spec)};
    }
    case v1::Model::kOps: {
      MEMEST_ASSIGN_OR_RETURN(OpGraphSpec spec, OpGraphFromProto(model.ops()));
      return ModelSpec{std::move(spec)};
    }
    case v1::Model::kHfConfig: {
      MEMEST_ASSIGN_OR_RETURN(HfConfigSpec spec, HfConfigFromProto(model.hf_config()));
      return ModelSpec{std::move(spec)};
    }
    case v1::Model::SOURCE_NOT_SET:
      break;
  }
  return InvalidArgument(
      "model: no model source set (expected one of preset, layers, ops, hf_config)");
}

StatusOr<RunConfig> RunConfigFromProto(const v1::RunConfig& config) {
  RunConfig out;
  MEMEST_ASSIGN_OR_RETURN(out.mode, ModeFromProto(config.mode(), "config.mode"));
  out.batch_size = config.batch_size();
  if (config.has_serving()) {
    // A server runs inference: an unset mode is taken as it (an explicit training is refused).
    if (config.mode() == v1::MODE_UNSPECIFIED) out.mode = Mode::kInference;
    MEMEST_ASSIGN_OR_RETURN(out.serving, ServingFromProto(config));
    out.batch_size = 1;
  }
  if (config.has_grad_accum_steps()) out.grad_accum_steps = config.grad_accum_steps();
  MEMEST_ASSIGN_OR_RETURN(out.precision,
                          PrecisionFromProto(config.precision(), "config.precision"));

  const v1::Optimizer& optimizer = config.optimizer();
  MEMEST_ASSIGN_OR_RETURN(out.optimizer.kind,
                          OptimizerKindFromProto(optimizer.kind(), "config.optimizer.kind"));
  MEMEST_ASSIGN_OR_RETURN(out.optimizer.impl,
                          OptimizerImplFromProto(optimizer.impl(), "config.optimizer.impl"));
  if (!std::isfinite(optimizer.weight_decay())) {
    return NotFinite("config.optimizer.weight_decay", optimizer.weight_decay());
  }
  out.optimizer.weight_decay = optimizer.weight_decay();

  out.zero_grad_set_to_none = !config.zero_grad_keep_grads();

  const v1::Checkpoint& checkpoint = config.checkpoint();
  MEMEST_ASSIGN_OR_RETURN(
      out.checkpoint.policy,
      CheckpointPolicyFromProto(checkpoint.policy(), "config.checkpoint.policy"));
  if (checkpoint.has_every_k()) out.checkpoint.every_k = checkpoint.every_k();
  MEMEST_RETURN_IF_ERROR(CheckNamesSize(checkpoint.scopes(), "config.checkpoint.scopes"));
  out.checkpoint.scopes.assign(checkpoint.scopes().begin(), checkpoint.scopes().end());
  out.checkpoint.non_reentrant = checkpoint.non_reentrant();

  MEMEST_ASSIGN_OR_RETURN(out.step, StepKindFromProto(config.step(), "config.step"));

  switch (config.device_case()) {
    case v1::RunConfig::kDeviceName:
      out.device = config.device_name();
      break;
    case v1::RunConfig::kDeviceCapacityBytes:
      if (config.device_capacity_bytes() == 0) {
        return InvalidArgument("config.device_capacity_bytes: must be positive, got 0");
      }
      if (config.device_capacity_bytes() > static_cast<uint64_t>(kMaxBytes)) {
        return InvalidArgument("config.device_capacity_bytes: must be at most 2^62 bytes, got " +
                               std::to_string(config.device_capacity_bytes()));
      }
      out.device_capacity_bytes = static_cast<int64_t>(config.device_capacity_bytes());
      break;
    case v1::RunConfig::DEVICE_NOT_SET:
      break;
  }
  out.generate_tokens = config.generate_tokens();
  out.expandable_segments = config.expandable_segments();
  if (config.has_hold_outputs()) out.hold_outputs = config.hold_outputs();
  MEMEST_ASSIGN_OR_RETURN(out.runtime, RuntimeFromProto(config.runtime(), "config.runtime"));
  MEMEST_ASSIGN_OR_RETURN(out.cpu_isa, CpuIsaFromProto(config.cpu_isa(), "config.cpu_isa"));
  if (config.cpu_isa() != v1::CPU_ISA_UNSPECIFIED && out.runtime != Runtime::kCpuTorch113) {
    return InvalidArgument(
        "config.cpu_isa: applies to the cpu-1.13 runtime only; the step runs "
        "on " +
        std::string(RuntimeName(out.runtime)));
  }
  // Past kMaxCpuCacheBytes a uint64 would not survive the cast: refused here, the rest in
  // ValidateRunConfig.
  if (config.cpu_l1_cache_bytes() > static_cast<uint64_t>(kMaxCpuCacheBytes) ||
      config.cpu_l2_cache_bytes() > static_cast<uint64_t>(kMaxCpuCacheBytes)) {
    return InvalidArgument(std::string("config.") +
                           (config.cpu_l1_cache_bytes() > static_cast<uint64_t>(kMaxCpuCacheBytes)
                                ? "cpu_l1_cache_bytes"
                                : "cpu_l2_cache_bytes") +
                           ": at most " + std::to_string(kMaxCpuCacheBytes) + " bytes");
  }
  out.cpu_l1_bytes = static_cast<int64_t>(config.cpu_l1_cache_bytes());
  out.cpu_l2_bytes = static_cast<int64_t>(config.cpu_l2_cache_bytes());
  if (config.has_attention()) {
    MEMEST_ASSIGN_OR_RETURN(out.attention,
                            AttentionFromProto(config.attention(), "config.attention"));
  }
  if (config.has_cuda_module_loading()) {
    if (out.runtime != Runtime::kCuda) {
      return InvalidArgument(
          "config.cuda_module_loading: applies to the CUDA runtime only; the "
          "step runs on " +
          std::string(RuntimeName(out.runtime)));
    }
    MEMEST_ASSIGN_OR_RETURN(
        out.module_loading,
        ModuleLoadingFromProto(config.cuda_module_loading(), "config.cuda_module_loading"));
  }
  if (config.has_cublas_workspace_config()) {
    MEMEST_RETURN_IF_ERROR(
        CheckNameSize(config.cublas_workspace_config(), "config.cublas_workspace_config"));
    if (out.runtime != Runtime::kCuda) {
      return InvalidArgument(
          "config.cublas_workspace_config: applies to the CUDA runtime only; "
          "the step runs on " +
          std::string(RuntimeName(out.runtime)));
    }
    MEMEST_RETURN_IF_ERROR(
        CublasWorkspaceBytes(config.cublas_workspace_config(), "config.cublas_workspace_config")
            .status());
    out.cublas_workspace_config = config.cublas_workspace_config();
  }
  if (config.has_parallelism()) {
    MEMEST_ASSIGN_OR_RETURN(out.parallelism, ParallelismFromProto(config.parallelism()));
  }
  MEMEST_ASSIGN_OR_RETURN(out.expert_load,
                          ExpertLoadFromProto(config.expert_load(), "config.expert_load"));
  if (config.has_fp8()) {
    const v1::Fp8& fp8 = config.fp8();
    switch (fp8.recipe()) {
      case v1::FP8_RECIPE_DELAYED:
        out.fp8.recipe = Fp8Recipe::kDelayed;
        break;
      case v1::FP8_RECIPE_CURRENT:
        out.fp8.recipe = Fp8Recipe::kCurrent;
        break;
      case v1::FP8_RECIPE_UNSPECIFIED:
        return InvalidArgument(
            "config.fp8.recipe: required when config.fp8 is set "
            "(FP8_RECIPE_DELAYED or FP8_RECIPE_CURRENT)");
      default:
        return InvalidArgument("config.fp8.recipe: unknown value " +
                               std::to_string(static_cast<int>(fp8.recipe())));
    }
    if (fp8.has_amax_history_len()) out.fp8.amax_history_len = fp8.amax_history_len();
  }
  if (config.has_lora()) {
    MEMEST_ASSIGN_OR_RETURN(out.lora, LoraFromProto(config.lora()));
  }
  if (config.has_quantization()) {
    MEMEST_ASSIGN_OR_RETURN(out.quantization, QuantizationFromProto(config.quantization()));
  }
  MEMEST_RETURN_IF_ERROR(CheckExplicitSettings(config));
  return out;
}

StatusOr<RunConfig> RunConfigForModel(const ModelSpec& model, const v1::RunConfig& proto,
                                      std::vector<std::string>* notes) {
  MEMEST_ASSIGN_OR_RETURN(RunConfig config, RunConfigFromProto(proto));
  MEMEST_RETURN_IF_ERROR(ApplyModelHints(model, proto, &config, notes));
  MEMEST_RETURN_IF_ERROR(ApplyServingDtype(model, proto, &config, notes));
  return config;
}

StatusOr<EstimateInput> EstimateInputFromProto(const v1::EstimateRequest& request,
                                               int64_t max_ops) {
  EstimateInput input;
  MEMEST_ASSIGN_OR_RETURN(input.model, ModelFromProto(request.model()));
  MEMEST_ASSIGN_OR_RETURN(input.config,
                          RunConfigForModel(input.model, request.config(), &input.notes));
  input.options.max_ops = max_ops;
  input.options.advice = !request.skip_advice();
  return input;
}

void ReportToProto(const Report& report, v1::EstimateResponse* out) {
  out->Clear();
  CategoriesToProto(report.breakdown, out->mutable_breakdown());
  PeakToProto(report.peak, out->mutable_peak());
  out->set_peak_reserved_bytes(Unsigned(report.peak_reserved_bytes));
  for (const PeakPoint& phase : report.phases) PeakToProto(phase, out->add_phases());
  for (const LayerRow& row : report.layers) {
    v1::LayerRow* layer = out->add_layers();
    layer->set_scope(row.scope);
    layer->set_parameter_bytes(Unsigned(row.parameter_bytes));
    layer->set_saved_bytes(Unsigned(row.saved_bytes));
    layer->set_output_bytes(Unsigned(row.output_bytes));
    layer->set_temporary_bytes(Unsigned(row.temporary_bytes));
  }
  if (report.fit.has_value()) {
    v1::DeviceFit* fit = out->mutable_fit();
    fit->set_device(report.fit->device);
    fit->set_capacity_bytes(Unsigned(report.fit->capacity_bytes));
    fit->set_required_bytes(Unsigned(report.fit->required_bytes));
    fit->set_fits(report.fit->fits);
    fit->set_headroom_bytes(report.fit->headroom_bytes);
  }
  for (const Advice& advice : report.advice) {
    v1::Advice* a = out->add_advice();
    a->set_kind(advice.kind);
    a->set_message(advice.message);
    a->set_saving_bytes(Unsigned(advice.saving_bytes));
    a->set_scope(advice.scope);
  }
  for (const std::string& note : report.notes) out->add_notes(note);
  if (report.data_parallel)
    DataParallelToProto(*report.data_parallel, out->mutable_data_parallel());
  if (report.pipeline) PipelineToProto(*report.pipeline, out->mutable_pipeline());
  if (report.serving) ServingToProto(*report.serving, out->mutable_serving());
  if (report.expert_parallel) {
    const ExpertParallelReport& ep = *report.expert_parallel;
    v1::ExpertParallelRanks* e = out->mutable_expert_parallel();
    e->set_size(ep.size);
    e->set_rank(ep.rank);
    e->set_local_experts(ep.local_experts);
    e->set_received_rows(ep.received_rows);
    e->set_least_rank(ep.least_rank);
    e->set_least_received_rows(ep.least_received_rows);
  }
  out->set_recompute_fraction(report.recompute_fraction);
  out->set_communicated_bytes_per_step(Unsigned(report.communicated_bytes_per_step));
  out->set_parameter_count(Unsigned(report.parameter_count));
  out->set_trainable_parameter_count(Unsigned(report.trainable_parameter_count));
  out->set_micro_batch(Unsigned(report.micro_batch));
  out->set_op_count(Unsigned(report.op_count));
  out->set_saved_for_backward_bytes(Unsigned(report.saved_for_backward_bytes));
  CategoriesToProto(report.end_of_step, out->mutable_end_of_step());
}

void PresetInfoToProto(const PresetInfo& preset, v1::PresetInfo* out) {
  out->Clear();
  out->set_name(preset.name);
  out->set_family(preset.family);
  out->set_description(preset.description);
  for (const PresetParam& param : preset.params) {
    v1::PresetParam* p = out->add_params();
    p->set_name(param.name);
    p->set_default_value(param.default_value);
    p->set_description(param.description);
  }
}

void DeviceInfoToProto(const DeviceInfo& device, v1::DeviceInfo* out) {
  out->Clear();
  out->set_name(device.name);
  out->set_description(device.description);
  out->set_capacity_bytes(Unsigned(device.capacity_bytes));
  out->set_cuda_context_bytes(Unsigned(device.cuda_context_bytes));
  out->set_cublas_workspace_bytes(Unsigned(device.cublas_workspace_bytes));
  out->set_compute_capability(device.compute_capability);
  out->set_rocm(!device.cuda);
  out->set_capacity_measured(device.measured);
}

void PresetsToProto(const std::vector<PresetInfo>& presets, v1::ListPresetsResponse* out) {
  out->Clear();
  for (const PresetInfo& preset : presets) PresetInfoToProto(preset, out->add_presets());
}

void DevicesToProto(const std::vector<DeviceInfo>& devices, v1::ListDevicesResponse* out) {
  out->Clear();
  for (const DeviceInfo& device : devices) DeviceInfoToProto(device, out->add_devices());
}

}  // namespace memest
