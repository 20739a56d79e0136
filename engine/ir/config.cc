#include "engine/ir/config.h"

#include <cmath>
#include <string>
#include <utility>

#include "engine/ir/shape.h"
#include "engine/ir/text.h"

namespace memest {

Status ValidateRunConfig(const RunConfig& c) {
  if (c.batch_size <= 0) {
    return InvalidArgument("config.batch_size: must be positive, got " +
                           std::to_string(c.batch_size));
  }
  if (c.grad_accum_steps <= 0) {
    return InvalidArgument("config.grad_accum_steps: must be positive, got " +
                           std::to_string(c.grad_accum_steps));
  }
  if (c.batch_size % c.grad_accum_steps != 0) {
    return InvalidArgument("config.grad_accum_steps: " + std::to_string(c.grad_accum_steps) +
                           " does not divide batch_size " + std::to_string(c.batch_size));
  }
  if (c.mode == Mode::kInference && c.grad_accum_steps != 1) {
    return InvalidArgument("config.grad_accum_steps: gradient accumulation needs training mode");
  }
  if (c.parallelism.pipeline_virtual_stages > 1 &&
      c.grad_accum_steps % c.parallelism.pipeline != 0) {
    return InvalidArgument("config.grad_accum_steps: the interleaved schedule runs micro-batches "
                           "in groups of the " + std::to_string(c.parallelism.pipeline) +
                           " stages; " + std::to_string(c.grad_accum_steps) + " is not a multiple");
  }
  if (c.grad_accum_steps > 1 && c.parallelism.fsdp_cpu_offload &&
      c.parallelism.sharding == DataSharding::kFsdp1) {
    // _flat_param.py prepare_gradient_for_backward: "Gradient accumulation outside `no_sync()`
    // does not work with CPU offloading" (each micro-batch's copy_ into _cpu_grad overwrites
    // the last), and no_sync() keeps every unit's unsharded gradient, which is not modelled.
    return InvalidArgument("config.grad_accum_steps: FSDP1's CPU offload cannot accumulate "
                           "gradients across micro-batches (PyTorch overwrites the offloaded "
                           "gradient; no_sync() is not modelled): use 1, or fsdp2");
  }
  if (!std::isfinite(c.optimizer.weight_decay) || c.optimizer.weight_decay < 0) {
    return InvalidArgument("config.optimizer.weight_decay: must be finite and non-negative, got " +
                           std::to_string(c.optimizer.weight_decay));
  }
  if (c.checkpoint.policy == CheckpointPolicy::kEveryKBlocks && c.checkpoint.every_k <= 0) {
    return InvalidArgument("config.checkpoint.every_k: must be positive, got " +
                           std::to_string(c.checkpoint.every_k));
  }
  if (c.checkpoint.policy == CheckpointPolicy::kScopes && c.checkpoint.scopes.empty()) {
    return InvalidArgument("config.checkpoint.scopes: the scopes policy needs at least one scope");
  }
  for (size_t k = 0; k < c.checkpoint.scopes.size(); ++k) {
    MEMEST_RETURN_IF_ERROR(CheckNameSize(c.checkpoint.scopes[k],
                                         "config.checkpoint.scopes[" + std::to_string(k) + "]"));
  }
  if (c.device_capacity_bytes < 0 || c.device_capacity_bytes > kMaxBytes) {
    return InvalidArgument("config.device_capacity_bytes: must be from 0 to 2^62, got " +
                           std::to_string(c.device_capacity_bytes));
  }
  if (c.generate_tokens < 0) {
    return InvalidArgument("config.generate_tokens: must be non-negative, got " +
                           std::to_string(c.generate_tokens));
  }
  if (c.generate_tokens > kMaxGenerateTokens) {
    return InvalidArgument("config.generate_tokens: must be at most " +
                           std::to_string(kMaxGenerateTokens) + ", got " +
                           std::to_string(c.generate_tokens));
  }
  if (c.optimizer.impl == OptimizerImpl::kFused &&
      !(c.optimizer.kind == OptimizerKind::kAdam || c.optimizer.kind == OptimizerKind::kAdamW ||
        c.optimizer.kind == OptimizerKind::kSgd || c.optimizer.kind == OptimizerKind::kSgdMomentum ||
        c.optimizer.kind == OptimizerKind::kAdagrad)) {
    return InvalidArgument(std::string("config.optimizer.impl: torch.optim has no fused ") +
                           OptimizerKindName(c.optimizer.kind));
  }
  if (IsBitsandbytes(c.optimizer.kind) && c.runtime != Runtime::kCuda) {
    return InvalidArgument(std::string("config.optimizer.kind: ") +
                           OptimizerKindName(c.optimizer.kind) +
                           " runs on CUDA; the step runs on " + RuntimeName(c.runtime));
  }
  for (size_t i = 0; i < c.checkpoint.scopes.size(); ++i) {
    if (c.checkpoint.scopes[i].empty()) {
      return InvalidArgument("config.checkpoint.scopes[" + std::to_string(i) +
                             "]: must name a module scope, got an empty name");
    }
  }
  MEMEST_RETURN_IF_ERROR(ValidateParallelism(c.parallelism));
  MEMEST_RETURN_IF_ERROR(ValidateLora(c));
  MEMEST_RETURN_IF_ERROR(ValidateQuantization(c));
  MEMEST_RETURN_IF_ERROR(ValidateFp8(c));
  MEMEST_RETURN_IF_ERROR(ValidateServing(c));
  MEMEST_RETURN_IF_ERROR(ValidateSettingsApply(c));
  return Status::Ok();
}

Status ValidateSettingsApply(const RunConfig& c) {
  const bool inference = c.mode == Mode::kInference;
  if (!inference && c.generate_tokens > 0) {
    return InvalidArgument(
        "config.generate_tokens: applies to inference only (tokens generated after the prompt); "
        "a training step generates none");
  }
  if (inference && !c.zero_grad_set_to_none) {
    return InvalidArgument(
        "config.zero_grad_keep_grads: applies to training only; inference has no gradients to "
        "keep");
  }
  if (inference && c.step == StepKind::kFirstStep) {
    return InvalidArgument(
        "config.step: the first step is the one that creates the optimizer state, which "
        "inference does not have; leave it unset");
  }
  const bool deepspeed = IsDeepSpeed(c.parallelism.sharding);
  if (deepspeed && IsAutocast(c.precision)) {
    return InvalidArgument(std::string("config.precision: ") + PrecisionName(c.precision) +
                           " is torch.autocast; DeepSpeed keeps the model in 16 bits itself "
                           "(its bf16 / fp16 sections) with fp32 master weights in its "
                           "optimizer: use bf16-pure or fp16-pure, or fp32");
  }
  if (deepspeed && !c.zero_grad_set_to_none) {
    return InvalidArgument("config.zero_grad_keep_grads: DeepSpeed's ZeRO optimizer frees the "
                           "gradients itself once they are reduced; there are none to keep");
  }
  if (IsMegatron(c.parallelism.sharding)) MEMEST_RETURN_IF_ERROR(ValidateMegatron(c));
  if (deepspeed && c.runtime != Runtime::kCuda) {
    return InvalidArgument("config.parallelism.data_parallel: DeepSpeed ZeRO runs on CUDA; the "
                           "cpu-1.13 runtime has no DeepSpeed");
  }
  if (c.parallelism.sharding == DataSharding::kFsdp2 && c.runtime != Runtime::kCuda) {
    return InvalidArgument("config.parallelism.data_parallel: FSDP2 (fully_shard) is PyTorch "
                           "2.x's; the cpu-1.13 runtime has no FSDP2");
  }
  if (c.parallelism.sharding == DataSharding::kFsdp1 && c.runtime != Runtime::kCuda) {
    return InvalidArgument("config.parallelism.data_parallel: FSDP1 is modelled as PyTorch 2.x "
                           "runs it on CUDA; the cpu-1.13 runtime's FSDP does not import on "
                           "Python 3.11 and is not modelled");
  }
  if (c.parallelism.fsdp_mixed_precision && c.precision != Precision::kBf16Pure &&
      c.precision != Precision::kFp16Pure) {
    return InvalidArgument(std::string("config.parallelism.fsdp_mixed_precision: the policy's "
                                       "param_dtype is the precision's 16-bit dtype; use "
                                       "bf16-pure or fp16-pure, not ") +
                           PrecisionName(c.precision));
  }
  if (inference && c.parallelism.context > 1) {
    return InvalidArgument("config.parallelism.context: context parallelism is modelled for a "
                           "training step; an inference replica is estimated without it");
  }
  if (inference && c.parallelism.pipeline > 1) {
    return InvalidArgument("config.parallelism.pipeline: a pipeline splits a training step's "
                           "micro-batches; inference is not modelled with one");
  }
  if (inference && c.parallelism.sharding != DataSharding::kNone) {
    return InvalidArgument(
        "config.parallelism: data parallelism splits a training step; an inference replica is "
        "its own single-GPU estimate");
  }
  if (!c.checkpoint.scopes.empty() && c.checkpoint.policy != CheckpointPolicy::kScopes) {
    return InvalidArgument(std::string("config.checkpoint.scopes: apply to the scopes policy "
                                       "only; the policy is ") +
                           CheckpointPolicyName(c.checkpoint.policy));
  }
  if (c.checkpoint.non_reentrant && c.checkpoint.policy == CheckpointPolicy::kNone) {
    return InvalidArgument(
        "config.checkpoint.non_reentrant: applies to the regions a checkpoint policy makes, and "
        "no policy is set");
  }
  for (const auto& [field, bytes] : {std::pair<const char*, int64_t>{"cpu_l1_cache_bytes", c.cpu_l1_bytes},
                                     {"cpu_l2_cache_bytes", c.cpu_l2_bytes}}) {
    if (bytes < 0 || bytes > kMaxCpuCacheBytes) {
      return InvalidArgument(std::string("config.") + field + ": must be in [0, " +
                             std::to_string(kMaxCpuCacheBytes) + "] bytes (0: oneDNN's default), got " +
                             std::to_string(bytes));
    }
    if (bytes > 0 && c.runtime != Runtime::kCpuTorch113) {
      return InvalidArgument(std::string("config.") + field +
                             ": the cache oneDNN blocks the CPU's convolutions by; applies to the "
                             "cpu-1.13 runtime only");
    }
  }
  if (c.runtime == Runtime::kCpuTorch113) {
    if (c.expandable_segments) {
      return InvalidArgument(
          "config.expandable_segments: a setting of the CUDA caching allocator; the cpu-1.13 "
          "runtime has none");
    }
    if (!c.device.empty()) {
      return InvalidArgument(
          "config.device_name: the catalog's devices are GPUs, and the cpu-1.13 runtime runs on "
          "the host; give device_capacity_bytes for a host memory budget, or no device");
    }
    if (c.optimizer.impl == OptimizerImpl::kFused) {
      return InvalidArgument(
          "config.optimizer.impl: PyTorch 1.13 has no fused optimizer for CPU tensors "
          "(fused=True needs CUDA); use foreach or for-loop");
    }
    if (c.module_loading != ModuleLoading::kLazy) {
      return InvalidArgument(
          "config.cuda_module_loading: sets how the CUDA context loads kernels; the cpu-1.13 "
          "runtime has no CUDA context");
    }
    if (!c.cublas_workspace_config.empty()) {
      return InvalidArgument("config.cublas_workspace_config: sizes cuBLAS's CUDA workspace; the "
                             "cpu-1.13 runtime has none");
    }
    if (c.attention != AttentionImpl::kDefault && c.attention != AttentionImpl::kEager) {
      return InvalidArgument(std::string("config.attention: ") + AttentionImplName(c.attention) +
                             " needs torch.nn.functional.scaled_dot_product_attention, which "
                             "PyTorch 1.13 does not have; the cpu-1.13 runtime runs eager "
                             "attention");
    }
    if (c.precision == Precision::kFp16Amp || c.precision == Precision::kFp16Pure) {
      return InvalidArgument(std::string("config.precision: ") + PrecisionName(c.precision) +
                             " does not run on PyTorch 1.13's CPU: its autocast takes bfloat16 "
                             "only, and most of its CPU kernels (addmm, relu, ...) have no "
                             "float16; use a bf16 precision");
    }
  }
  return Status::Ok();
}

AttentionImpl ResolveAttention(const RunConfig& c) {
  if (c.attention != AttentionImpl::kDefault) return c.attention;
  return c.runtime == Runtime::kCpuTorch113 ? AttentionImpl::kEager : AttentionImpl::kSdpa;
}

DType ParameterDType(Precision p) {
  switch (p) {
    case Precision::kBf16Pure: return DType::kBFloat16;
    case Precision::kFp16Pure: return DType::kFloat16;
    default: return DType::kFloat32;
  }
}

DType ComputeDType(Precision p) {
  switch (p) {
    case Precision::kFp16Amp: return DType::kFloat16;
    case Precision::kBf16Amp: return DType::kBFloat16;
    default: return ParameterDType(p);
  }
}

bool IsAutocast(Precision p) { return p == Precision::kFp16Amp || p == Precision::kBf16Amp; }

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kFp16Amp: return "fp16 autocast";
    case Precision::kBf16Amp: return "bf16 autocast";
    case Precision::kBf16Pure: return "pure bf16";
    case Precision::kFp16Pure: return "pure fp16";
  }
  return "?";
}

const char* OptimizerKindName(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::kSgd: return "SGD";
    case OptimizerKind::kSgdMomentum: return "SGD with momentum";
    case OptimizerKind::kAdam: return "Adam";
    case OptimizerKind::kAdamW: return "AdamW";
    case OptimizerKind::kAdagrad: return "Adagrad";
    case OptimizerKind::kRmsprop: return "RMSprop";
    case OptimizerKind::kLion: return "Lion";
    case OptimizerKind::kAdafactor: return "Adafactor";
    case OptimizerKind::kHfAdamW: return "transformers AdamW";
    case OptimizerKind::kHfAdafactor: return "transformers Adafactor";
    case OptimizerKind::kBnbAdamW8bit: return "bitsandbytes AdamW8bit";
    case OptimizerKind::kBnbPagedAdamW8bit: return "bitsandbytes PagedAdamW8bit";
    case OptimizerKind::kBnbPagedAdamW32bit: return "bitsandbytes PagedAdamW (32-bit)";
  }
  return "?";
}

const char* OptimizerImplName(OptimizerImpl i) {
  switch (i) {
    case OptimizerImpl::kForLoop: return "for-loop";
    case OptimizerImpl::kForeach: return "foreach";
    case OptimizerImpl::kFused: return "fused";
  }
  return "?";
}

const char* CheckpointPolicyName(CheckpointPolicy p) {
  switch (p) {
    case CheckpointPolicy::kNone: return "none";
    case CheckpointPolicy::kEveryBlock: return "every block";
    case CheckpointPolicy::kEveryKBlocks: return "every k blocks";
    case CheckpointPolicy::kSqrtBlocks: return "every sqrt(L) blocks";
    case CheckpointPolicy::kAttentionCore: return "attention core";
    case CheckpointPolicy::kScopes: return "named scopes";
  }
  return "?";
}

const char* RuntimeName(Runtime r) {
  switch (r) {
    case Runtime::kCuda: return "cuda";
    case Runtime::kCpuTorch113: return "cpu-1.13";
  }
  return "?";
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx2: return "avx2";
  }
  return "?";
}

const char* AttentionImplName(AttentionImpl a) {
  switch (a) {
    case AttentionImpl::kDefault: return "default";
    case AttentionImpl::kEager: return "eager";
    case AttentionImpl::kSdpa: return "sdpa";
    case AttentionImpl::kFlash: return "flash";
    case AttentionImpl::kMemEfficient: return "mem-efficient";
    case AttentionImpl::kCudnn: return "cudnn";
  }
  return "?";
}

const char* ModuleLoadingName(ModuleLoading m) {
  switch (m) {
    case ModuleLoading::kLazy: return "lazy";
    case ModuleLoading::kEager: return "eager";
  }
  return "?";
}

const char* KvCacheDTypeName(KvCacheDType d) {
  switch (d) {
    case KvCacheDType::kAuto: return "auto";
    case KvCacheDType::kFp8E4m3: return "fp8_e4m3";
    case KvCacheDType::kFp8E5m2: return "fp8_e5m2";
  }
  return "?";
}

const char* DataShardingName(DataSharding s) {
  switch (s) {
    case DataSharding::kNone: return "none";
    case DataSharding::kDdp: return "ddp";
    case DataSharding::kZero1: return "zero1";
    case DataSharding::kDeepSpeedZero2: return "deepspeed-zero2";
    case DataSharding::kDeepSpeedZero1: return "deepspeed-zero1";
    case DataSharding::kDeepSpeedZero3: return "deepspeed-zero3";
    case DataSharding::kFsdp1: return "fsdp1";
    case DataSharding::kFsdp2: return "fsdp2";
    case DataSharding::kMegatronDdp: return "megatron-ddp";
    case DataSharding::kMegatronDistOpt: return "megatron-distopt";
  }
  return "?";
}

const char* TensorParallelLayersName(TensorParallelLayers layers) {
  return layers == TensorParallelLayers::kDTensor ? "dtensor" : "megatron";
}

}  // namespace memest
