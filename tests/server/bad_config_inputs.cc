// Rows of the bad-input catalogue for EstimateRequest.config: out-of-range numbers, enum values
// the proto does not define, and settings that make no sense for the mode, the runtime or the
// model they come with.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tests/server/bad_inputs.h"

namespace memest::testing {
namespace {

constexpr grpc::StatusCode kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
constexpr grpc::StatusCode kNotFound = grpc::StatusCode::NOT_FOUND;
constexpr grpc::StatusCode kPrecondition = grpc::StatusCode::FAILED_PRECONDITION;

const std::string kTwo62 = "4611686018427387904";  // 2^62
const std::string kInt64Max = "9223372036854775807";
const std::string kInt64Min = "-9223372036854775808";

// `model` (one of the base models) with the config fields `fields` beside batch_size 2.
std::string With(const char* model, const std::string& fields) {
  return std::string(model) + " config { batch_size: 2 " + fields + " } ";
}
std::string Gpt2(const std::string& fields) { return With(kGpt2, fields); }
std::string Infer(const char* model, const std::string& fields) {
  return With(model, "mode: MODE_INFERENCE " + fields);
}
// An edit that sets an enum field to a value the proto does not define.
template <typename Setter>
std::function<void(v1::EstimateRequest*)> Undefined(Setter set, int value = 99) {
  return [set, value](v1::EstimateRequest* r) { set(r->mutable_config(), value); };
}

std::vector<BadInput> NumberRows() {
  return {
      {"ConfigUnset", kGpt2, kInvalid, "config.batch_size"},
      {"BatchSizeZero", std::string(kGpt2) + "config { batch_size: 0 }", kInvalid,
       "config.batch_size"},
      {"BatchSizeNegative", std::string(kGpt2) + "config { batch_size: -3 }", kInvalid,
       "config.batch_size"},
      {"BatchSizeInt64Min", std::string(kGpt2) + "config { batch_size: " + kInt64Min + " }",
       kInvalid, "config.batch_size"},
      {"GradAccumZero", Gpt2("grad_accum_steps: 0"), kInvalid, "config.grad_accum_steps"},
      {"GradAccumNegative", Gpt2("grad_accum_steps: -2"), kInvalid, "config.grad_accum_steps"},
      {"GradAccumDoesNotDivide",
       std::string(kGpt2) + "config { batch_size: 3 grad_accum_steps: 2 }", kInvalid,
       "config.grad_accum_steps"},
      {"GradAccumInt64Max", Gpt2("grad_accum_steps: " + kInt64Max), kInvalid,
       "config.grad_accum_steps"},
      {"WeightDecayNegative", Gpt2("optimizer { weight_decay: -0.1 }"), kInvalid,
       "config.optimizer.weight_decay"},
      {"WeightDecayNan", Gpt2("optimizer { weight_decay: nan }"), kInvalid,
       "config.optimizer.weight_decay"},
      {"WeightDecayInfinite", Gpt2("optimizer { weight_decay: inf }"), kInvalid,
       "config.optimizer.weight_decay"},
      {"EveryKZero", Gpt2("checkpoint { policy: CHECKPOINT_POLICY_EVERY_K_BLOCKS every_k: 0 }"),
       kInvalid, "config.checkpoint.every_k"},
      {"EveryKNegative",
       Gpt2("checkpoint { policy: CHECKPOINT_POLICY_EVERY_K_BLOCKS every_k: -1 }"), kInvalid,
       "config.checkpoint.every_k"},
      {"GenerateTokensNegative", Infer(kGpt2, "generate_tokens: -1"), kInvalid,
       "config.generate_tokens"},
      {"GenerateTokensInt64Min", Infer(kGpt2, "generate_tokens: " + kInt64Min), kInvalid,
       "config.generate_tokens"},
      {"GenerateTokensTwo62", Infer(kGpt2, "generate_tokens: " + kTwo62), kInvalid,
       "config.generate_tokens"},
      {"GenerateTokensInt64Max", Infer(kGpt2, "generate_tokens: " + kInt64Max), kInvalid,
       "config.generate_tokens"},
      {"CapacityZero", Gpt2("device_capacity_bytes: 0"), kInvalid, "config.device_capacity_bytes"},
      {"CapacityAboveTwo62", Gpt2("device_capacity_bytes: 4611686018427387905"), kInvalid,
       "config.device_capacity_bytes"},
      {"CapacityTwo63", Gpt2("device_capacity_bytes: 9223372036854775808"), kInvalid,
       "config.device_capacity_bytes"},
      {"CapacityUint64Max", Gpt2("device_capacity_bytes: 18446744073709551615"), kInvalid,
       "config.device_capacity_bytes"},
  };
}

std::vector<BadInput> EnumRows() {
  using C = v1::RunConfig;
  return {
      {"ModeUndefined", Gpt2(""), kInvalid, "config.mode",
       Undefined([](C* c, int v) { c->set_mode(static_cast<v1::Mode>(v)); })},
      {"ModeNegative", Gpt2(""), kInvalid, "config.mode",
       Undefined([](C* c, int v) { c->set_mode(static_cast<v1::Mode>(v)); }, -1)},
      {"PrecisionUndefined", Gpt2(""), kInvalid, "config.precision",
       Undefined([](C* c, int v) { c->set_precision(static_cast<v1::Precision>(v)); })},
      {"OptimizerKindUndefined", Gpt2(""), kInvalid, "config.optimizer.kind",
       Undefined([](C* c, int v) {
         c->mutable_optimizer()->set_kind(static_cast<v1::OptimizerKind>(v));
       })},
      {"OptimizerImplUndefined", Gpt2(""), kInvalid, "config.optimizer.impl",
       Undefined([](C* c, int v) {
         c->mutable_optimizer()->set_impl(static_cast<v1::OptimizerImpl>(v));
       })},
      {"CheckpointPolicyUndefined", Gpt2(""), kInvalid, "config.checkpoint.policy",
       Undefined([](C* c, int v) {
         c->mutable_checkpoint()->set_policy(static_cast<v1::CheckpointPolicy>(v));
       })},
      {"StepUndefined", Gpt2(""), kInvalid, "config.step",
       Undefined([](C* c, int v) { c->set_step(static_cast<v1::StepKind>(v)); })},
      {"RuntimeUndefined", Gpt2(""), kInvalid, "config.runtime",
       Undefined([](C* c, int v) { c->set_runtime(static_cast<v1::Runtime>(v)); })},
      {"CpuIsaUndefined", Gpt2("runtime: RUNTIME_CPU_TORCH_1_13"), kInvalid, "config.cpu_isa",
       Undefined([](C* c, int v) { c->set_cpu_isa(static_cast<v1::CpuIsa>(v)); })},
      {"CpuIsaWithCuda", Gpt2("cpu_isa: CPU_ISA_AVX2"), kInvalid, "config.cpu_isa"},
      {"CpuCacheWithCuda", Gpt2("cpu_l2_cache_bytes: 2097152"), kInvalid,
       "config.cpu_l2_cache_bytes"},
      {"CpuCacheHuge",
       Gpt2("runtime: RUNTIME_CPU_TORCH_1_13 cpu_l1_cache_bytes: 18446744073709551615"), kInvalid,
       "config.cpu_l1_cache_bytes"},
      {"AttentionUndefined", Gpt2(""), kInvalid, "config.attention",
       Undefined([](C* c, int v) { c->set_attention(static_cast<v1::Attention>(v)); })},
      {"SdpaOnCpu113", Gpt2("runtime: RUNTIME_CPU_TORCH_1_13 attention: ATTENTION_SDPA"), kInvalid,
       "config.attention"},
      {"FlashUnderFp32", Gpt2("attention: ATTENTION_FLASH"), kInvalid, "config.attention"},
      {"MemEfficientOnAV100Bf16",
       Gpt2("precision: PRECISION_BF16_AMP attention: ATTENTION_MEM_EFFICIENT device_name: "
            "\"v100\""),
       kInvalid, "config.attention"},
      {"ModuleLoadingUndefined", Gpt2(""), kInvalid, "config.cuda_module_loading",
       Undefined(
           [](C* c, int v) { c->set_cuda_module_loading(static_cast<v1::CudaModuleLoading>(v)); })},
      {"Stage3SettingWithZero2",
       Gpt2("parallelism { data: 8 data_parallel: DATA_PARALLEL_DEEPSPEED_ZERO2 "
            "stage3_max_reuse_distance: 5 }"),
       kInvalid, "config.parallelism.stage3_max_reuse_distance"},
      {"Stage3PrefetchNegative",
       Gpt2("parallelism { data: 8 data_parallel: DATA_PARALLEL_DEEPSPEED_ZERO3 "
            "stage3_prefetch_bucket_size: -1 }"),
       kInvalid, "config.parallelism.stage3_prefetch_bucket_size"},
      {"FsdpCpuOffloadWithDdp",
       Gpt2("parallelism { data: 8 data_parallel: DATA_PARALLEL_DDP fsdp_cpu_offload: true }"),
       kInvalid, "config.parallelism.fsdp_cpu_offload"},
      {"OffloadParamWithZero2",
       Gpt2("parallelism { data: 8 data_parallel: DATA_PARALLEL_DEEPSPEED_ZERO2 offload_param: "
            "true }"),
       kInvalid, "config.parallelism.offload_param"},
      {"DataShardWithDdp",
       Gpt2("parallelism { data: 8 data_parallel: DATA_PARALLEL_DDP data_shard: 4 }"), kInvalid,
       "config.parallelism.data_shard"},
      {"DataShardNotDividing",
       Gpt2("parallelism { data: 8 data_parallel: DATA_PARALLEL_FSDP2 data_shard: 3 }"), kInvalid,
       "config.parallelism.data_shard"},
      {"DataShardNegative",
       Gpt2("parallelism { data: 8 data_parallel: DATA_PARALLEL_FSDP1 data_shard: -4 }"), kInvalid,
       "config.parallelism.data_shard"},
      {"GpusPerNodeNegative",
       Gpt2("parallelism { data: 2 data_parallel: DATA_PARALLEL_DDP gpus_per_node: -8 }"), kInvalid,
       "config.parallelism.gpus_per_node"},
      {"GpusPerNodePastTheLimit",
       Gpt2("parallelism { data: 2 data_parallel: DATA_PARALLEL_DDP gpus_per_node: " + kInt64Max +
            " }"),
       kInvalid, "config.parallelism.gpus_per_node"},
      {"ExpertParallelNegative",
       Gpt2("parallelism { data: 2 data_parallel: DATA_PARALLEL_MEGATRON_DDP expert: -2 }"),
       kInvalid, "config.parallelism.expert"},
      {"ExpertParallelPastTheLimit",
       Gpt2("parallelism { data: 2048 data_parallel: DATA_PARALLEL_MEGATRON_DDP expert: 2048 }"),
       kInvalid, "config.parallelism.expert"},
      {"ExpertParallelWithDdp",
       Gpt2("parallelism { data: 2 data_parallel: DATA_PARALLEL_DDP expert: 2 }"), kInvalid,
       "config.parallelism.expert"},
      {"ExpertParallelNotDividingData",
       Gpt2("parallelism { data: 6 data_parallel: DATA_PARALLEL_MEGATRON_DDP expert: 4 }"),
       kInvalid, "config.parallelism.expert"},
      {"ExpertParallelWithoutExperts",
       Gpt2("parallelism { data: 2 data_parallel: DATA_PARALLEL_MEGATRON_DDP expert: 2 } "
            "precision: PRECISION_BF16_PURE"),
       kInvalid, "config.parallelism.expert"},
      {"DataParallelNegative", Gpt2("parallelism { data: -4 }"), kInvalid,
       "config.parallelism.data"},
      {"DataParallelPastTheLimit", Gpt2("parallelism { data: 1048577 }"), kInvalid,
       "config.parallelism.data"},
      {"DataParallelUndefined", Gpt2("parallelism { data: 2 }"), kInvalid,
       "config.parallelism.data_parallel", Undefined([](C* c, int v) {
         c->mutable_parallelism()->set_data_parallel(static_cast<v1::DataParallel>(v));
       })},
      {"BucketCapZero", Gpt2("parallelism { data: 2 bucket_cap_mb: 0 }"), kInvalid,
       "config.parallelism.bucket_cap_mb"},
      {"BucketCapNaN", Gpt2("parallelism { data: 2 bucket_cap_mb: nan }"), kInvalid,
       "config.parallelism.bucket_cap_mb"},
      {"BucketCapPastTheLimit", Gpt2("parallelism { data: 2 bucket_cap_mb: 1e12 }"), kInvalid,
       "config.parallelism.bucket_cap_mb"},
      {"DataParallelInInference", Infer(kGpt2, "parallelism { data: 2 }"), kInvalid,
       "config.parallelism"},
      {"OffloadOptimizerWithDdp",
       Gpt2("parallelism { data: 2 data_parallel: DATA_PARALLEL_DDP offload_optimizer: true }"),
       kInvalid, "config.parallelism.offload_optimizer"},
      {"OffloadOptimizerWithFsdp2",
       Gpt2("runtime: RUNTIME_CUDA parallelism { data: 2 data_parallel: DATA_PARALLEL_FSDP2 "
            "offload_optimizer: true }"),
       kInvalid, "config.parallelism.offload_optimizer"},
      {"OffloadOptimizerOnOneGpu", Gpt2("parallelism { offload_optimizer: true }"), kInvalid,
       "config.parallelism.offload_optimizer"},
      {"ExpertLoadUndefined", Gpt2(""), kInvalid, "config.expert_load",
       Undefined([](C* c, int v) { c->set_expert_load(static_cast<v1::ExpertLoad>(v)); })},
      {"ExpertLoadWithoutExperts", Gpt2("expert_load: EXPERT_LOAD_BALANCED"), kInvalid,
       "config.expert_load"},
      {"ModuleLoadingOnCpu113",
       Gpt2("runtime: RUNTIME_CPU_TORCH_1_13 cuda_module_loading: CUDA_MODULE_LOADING_EAGER"),
       kInvalid, "config.cuda_module_loading"},
      {"CublasWorkspaceOnCpu113",
       Gpt2("runtime: RUNTIME_CPU_TORCH_1_13 cublas_workspace_config: \":4096:8\""), kInvalid,
       "config.cublas_workspace_config"},
      {"CublasWorkspaceNotPairs", Gpt2("cublas_workspace_config: \"4096:8\""), kInvalid,
       "config.cublas_workspace_config"},
      {"CublasWorkspaceOddCount", Gpt2("cublas_workspace_config: \":4096:8:16\""), kInvalid,
       "config.cublas_workspace_config"},
      {"CublasWorkspaceHuge", Gpt2("cublas_workspace_config: \":99999999999:99999999\""), kInvalid,
       "config.cublas_workspace_config"},
      {"MigSlice", Gpt2("device_name: \"NVIDIA-A100-SXM4-40GB-MIG-1g.5gb\""), kNotFound,
       "config.device_name"},
  };
}

std::vector<BadInput> OptimizerAndCheckpointRows() {
  return {
      {"FusedLion", Gpt2("optimizer { kind: OPTIMIZER_KIND_LION impl: OPTIMIZER_IMPL_FUSED }"),
       kInvalid, "config.optimizer.impl"},
      {"FusedRmsprop",
       Gpt2("optimizer { kind: OPTIMIZER_KIND_RMSPROP impl: OPTIMIZER_IMPL_FUSED }"), kInvalid,
       "config.optimizer.impl"},
      {"FusedAdafactor",
       Gpt2("optimizer { kind: OPTIMIZER_KIND_ADAFACTOR impl: OPTIMIZER_IMPL_FUSED }"), kInvalid,
       "config.optimizer.impl"},
      {"EveryKBeyondBlocks",
       Gpt2("checkpoint { policy: CHECKPOINT_POLICY_EVERY_K_BLOCKS every_k: 3 }"), kInvalid,
       "config.checkpoint.every_k"},
      {"EveryKTwo62",
       Gpt2("checkpoint { policy: CHECKPOINT_POLICY_EVERY_K_BLOCKS every_k: " + kTwo62 + " }"),
       kInvalid, "config.checkpoint.every_k"},
      {"EveryKInt64Max",
       Gpt2("checkpoint { policy: CHECKPOINT_POLICY_EVERY_K_BLOCKS every_k: " + kInt64Max + " }"),
       kInvalid, "config.checkpoint.every_k"},
      {"EveryKBeyondTheLayers",
       With(kLinearLayers, "checkpoint { policy: CHECKPOINT_POLICY_EVERY_K_BLOCKS every_k: 2 }"),
       kInvalid, "config.checkpoint.every_k"},
      {"EveryKWithAnotherPolicy",
       Gpt2("checkpoint { policy: CHECKPOINT_POLICY_EVERY_BLOCK every_k: 2 }"), kInvalid,
       "config.checkpoint.every_k"},
      {"EveryKWithoutAPolicy", Gpt2("checkpoint { every_k: 1 }"), kInvalid,
       "config.checkpoint.every_k"},
      {"EveryBlockWithoutBlocks",
       With(kLinearOps, "checkpoint { policy: CHECKPOINT_POLICY_EVERY_BLOCK }"), kInvalid,
       "config.checkpoint.policy"},
      {"EveryKWithoutBlocks",
       With(kLinearOps, "checkpoint { policy: CHECKPOINT_POLICY_EVERY_K_BLOCKS every_k: 1 }"),
       kInvalid, "config.checkpoint.policy"},
      {"SqrtWithoutBlocks",
       With(kLinearOps, "checkpoint { policy: CHECKPOINT_POLICY_SQRT_BLOCKS }"), kInvalid,
       "config.checkpoint.policy"},
      {"AttentionCoreWithoutAttention",
       With(kMlp, "checkpoint { policy: CHECKPOINT_POLICY_ATTENTION_CORE }"), kPrecondition,
       "config.checkpoint.policy"},
      {"ScopesPolicyWithoutScopes", Gpt2("checkpoint { policy: CHECKPOINT_POLICY_SCOPES }"),
       kInvalid, "config.checkpoint.scopes"},
      {"ScopeUnknown",
       Gpt2("checkpoint { policy: CHECKPOINT_POLICY_SCOPES scopes: [\"transformer.h.0\", \"h.9\"] "
            "}"),
       kInvalid, "config.checkpoint.scopes[1]"},
      {"ScopeEmpty", Gpt2("checkpoint { policy: CHECKPOINT_POLICY_SCOPES scopes: [\"\"] }"),
       kInvalid, "config.checkpoint.scopes[0]"},
      {"ScopesWithAnotherPolicy",
       Gpt2("checkpoint { policy: CHECKPOINT_POLICY_EVERY_BLOCK scopes: [\"transformer.h.0\"] }"),
       kInvalid, "config.checkpoint.scopes"},
      {"NonReentrantWithoutAPolicy", Gpt2("checkpoint { non_reentrant: true }"), kInvalid,
       "config.checkpoint.non_reentrant"},
  };
}

// Settings that belong to training, sent with mode inference.
std::vector<BadInput> InferenceRows() {
  return {
      {"InferenceWithOptimizerKind", Infer(kGpt2, "optimizer { kind: OPTIMIZER_KIND_ADAM }"),
       kInvalid, "config.optimizer.kind"},
      {"InferenceWithExplicitAdamW", Infer(kMlp, "optimizer { kind: OPTIMIZER_KIND_ADAMW }"),
       kInvalid, "config.optimizer.kind"},
      {"InferenceWithOptimizerImpl",
       Infer(kLinearLayers, "optimizer { impl: OPTIMIZER_IMPL_FOR_LOOP }"), kInvalid,
       "config.optimizer.impl"},
      {"InferenceWithWeightDecay", Infer(kLinearOps, "optimizer { weight_decay: 0.01 }"), kInvalid,
       "config.optimizer.weight_decay"},
      {"InferenceWithCheckpointPolicy",
       Infer(kGpt2, "checkpoint { policy: CHECKPOINT_POLICY_EVERY_BLOCK }"), kInvalid,
       "config.checkpoint.policy"},
      {"InferenceWithEveryK", Infer(kGpt2, "checkpoint { every_k: 2 }"), kInvalid,
       "config.checkpoint"},
      {"InferenceWithCheckpointScopes",
       Infer(kGpt2,
             "checkpoint { policy: CHECKPOINT_POLICY_SCOPES scopes: [\"transformer.h.0\"] }"),
       kInvalid, "config.checkpoint.policy"},
      {"InferenceWithNonReentrant", Infer(kMlp, "checkpoint { non_reentrant: true }"), kInvalid,
       "config.checkpoint.non_reentrant"},
      {"InferenceKeepingGrads", Infer(kMlp, "zero_grad_keep_grads: true"), kInvalid,
       "config.zero_grad_keep_grads"},
      {"InferenceHoldingOutputs", Infer(kGpt2, "hold_outputs: true"), kInvalid,
       "config.hold_outputs"},
      {"InferenceNotHoldingOutputs", Infer(kMlp, "hold_outputs: false"), kInvalid,
       "config.hold_outputs"},
      {"InferenceFirstStep", Infer(kGpt2, "step: STEP_KIND_FIRST_STEP"), kInvalid, "config.step"},
      {"InferenceWithGradAccum", Infer(kGpt2, "grad_accum_steps: 2"), kInvalid,
       "config.grad_accum_steps"},
  };
}

// generate_tokens where nothing is generated, and the CPU runtime with CUDA settings.
std::vector<BadInput> GenerationAndRuntimeRows() {
  return {
      {"GenerateTokensInTraining", Gpt2("generate_tokens: 16"), kInvalid, "config.generate_tokens"},
      {"GenerateTokensOnAnMlp", Infer(kMlp, "generate_tokens: 16"), kInvalid,
       "config.generate_tokens"},
      {"GenerateTokensOnBert",
       Infer("model { preset { name: \"bert-base\" params { key: \"seq\" value: 16 } "
             "params { key: \"layers\" value: 1 } } }",
             "generate_tokens: 16"),
       kInvalid, "config.generate_tokens"},
      {"GenerateTokensOnAResnet",
       Infer("model { preset { name: \"resnet18\" params { key: \"image\" value: 32 } } }",
             "generate_tokens: 1"),
       kInvalid, "config.generate_tokens"},
      {"GenerateTokensOnCausalLayers",
       Infer("model { layers { input_shape: [4, 8] layers { kind: \"transformer_block\" "
             "attrs { key: \"heads\" value { i: 2 } } } } }",
             "generate_tokens: 8"),
       kInvalid, "config.generate_tokens"},
      {"GenerateTokensOnAnOpGraph", Infer(kLinearOps, "generate_tokens: 8"), kInvalid,
       "config.generate_tokens"},
      {"ExpandableSegmentsOnCpu", Gpt2("runtime: RUNTIME_CPU_TORCH_1_13 expandable_segments: true"),
       kInvalid, "config.expandable_segments"},
      {"CudaDeviceOnCpu", Gpt2("runtime: RUNTIME_CPU_TORCH_1_13 device_name: \"a100-80gb\""),
       kInvalid, "config.device_name"},
      {"FusedOptimizerOnCpu",
       Gpt2("runtime: RUNTIME_CPU_TORCH_1_13 optimizer { kind: OPTIMIZER_KIND_ADAM "
            "impl: OPTIMIZER_IMPL_FUSED }"),
       kInvalid, "config.optimizer.impl"},
      {"Fp16AutocastOnCpu", Gpt2("runtime: RUNTIME_CPU_TORCH_1_13 precision: PRECISION_FP16_AMP"),
       kInvalid, "config.precision"},
      {"PureFp16OnCpu",
       Infer(kMlp, "runtime: RUNTIME_CPU_TORCH_1_13 precision: PRECISION_FP16_PURE"), kInvalid,
       "config.precision"},
      {"DeviceNameEmpty", Gpt2("device_name: \"\""), kInvalid, "config.device_name"},
      {"DeviceNameUnknown", Gpt2("device_name: \"tpu-v5\""), kNotFound, "config.device_name"},
      {"DeviceNameWithSpaces", Gpt2("device_name: \" a100 \""), kNotFound, "config.device_name"},
  };
}

// config.lora: PEFT's LoraConfig on gpt2-small (modules c_attn, c_proj, c_fc, lm_head); and
// config.quantization, its 4-bit base.
std::vector<BadInput> LoraRows() {
  return {
      {"LoraRankUnset", Gpt2("lora { target_modules: \"c_attn\" }"), kInvalid, "config.lora.rank"},
      {"LoraRankNegative", Gpt2("lora { rank: -8 target_modules: \"c_attn\" }"), kInvalid,
       "config.lora.rank"},
      {"LoraRankPastTheLimit", Gpt2("lora { rank: " + kInt64Max + " target_modules: \"c_attn\" }"),
       kInvalid, "config.lora.rank"},
      {"LoraTargetsMissing", Gpt2("lora { rank: 8 }"), kInvalid, "config.lora.target_modules"},
      {"LoraTargetEmpty", Gpt2("lora { rank: 8 target_modules: \"\" }"), kInvalid,
       "config.lora.target_modules[0]"},
      {"LoraTargetUnknown", Gpt2("lora { rank: 8 target_modules: \"q_proj\" }"), kInvalid,
       "config.lora.target_modules"},
      {"LoraTargetNotLinear", Gpt2("lora { rank: 8 target_modules: \"mlp\" }"), kInvalid,
       "config.lora.target_modules[0]"},
      {"LoraAllLinearWithOthers",
       Gpt2("lora { rank: 8 target_modules: \"c_attn\" target_modules: \"all-linear\" }"), kInvalid,
       "config.lora.target_modules[1]"},
      {"LoraModuleToSaveUnknown",
       Gpt2("lora { rank: 8 target_modules: \"c_attn\" modules_to_save: \"score\" }"), kInvalid,
       "config.lora.modules_to_save[0]"},
      {"LoraDropoutAboveOne", Gpt2("lora { rank: 8 target_modules: \"c_attn\" dropout: 2 }"),
       kInvalid, "config.lora.dropout"},
      {"LoraDropoutNan", Gpt2("lora { rank: 8 target_modules: \"c_attn\" dropout: nan }"), kInvalid,
       "config.lora.dropout"},
      {"LoraAlphaInfinite", Gpt2("lora { rank: 8 target_modules: \"c_attn\" alpha: inf }"),
       kInvalid, "config.lora.alpha"},
      {"LoraTargetName4MiB", Gpt2(""), kInvalid, "config.lora.target_modules[0]",
       [](v1::EstimateRequest* r) {
         r->mutable_config()->mutable_lora()->set_rank(8);
         r->mutable_config()->mutable_lora()->add_target_modules(std::string(4 << 20, 'q'));
       }},
      {"QuantizationFormatUnset", Gpt2("quantization { double_quant: true }"), kInvalid,
       "config.quantization.format"},
      {"QuantizationFormatUndefined", Gpt2(""), kInvalid, "config.quantization.format",
       [](v1::EstimateRequest* r) {
         r->mutable_config()->mutable_quantization()->set_format(static_cast<v1::WeightFormat>(99));
       }},
      {"QuantizationComputeDtypeUnknown",
       Gpt2("quantization { format: WEIGHT_FORMAT_BNB_NF4 compute_dtype: \"fp3\" }"), kInvalid,
       "config.quantization.compute_dtype"},
      {"QuantizationComputeDtypeInteger",
       Gpt2("quantization { format: WEIGHT_FORMAT_BNB_NF4 compute_dtype: \"int8\" }"), kInvalid,
       "config.quantization.compute_dtype"},
      {"QuantizationSkipUnknown",
       Gpt2("quantization { format: WEIGHT_FORMAT_BNB_NF4 skip_modules: \"score\" }"), kInvalid,
       "config.quantization.skip_modules[0]"},
      {"QuantizationOnCpu",
       Gpt2("quantization { format: WEIGHT_FORMAT_BNB_NF4 } runtime: RUNTIME_CPU_TORCH_1_13"),
       kInvalid, "config.quantization"},
      {"QuantizationWithFsdp2",
       Gpt2("quantization { format: WEIGHT_FORMAT_BNB_FP4 } parallelism { data: 2 data_parallel: "
            "DATA_PARALLEL_FSDP2 }"),
       kInvalid, "config.quantization"},
      {"LoraWithTensorParallelism",
       Gpt2("lora { rank: 8 target_modules: \"c_attn\" } parallelism { tensor: 2 }"), kInvalid,
       "config.lora"},
      {"TensorLayersWithoutTensorRanks",
       Gpt2("parallelism { tensor_layers: TENSOR_PARALLEL_LAYERS_DTENSOR }"), kInvalid,
       "config.parallelism.tensor_layers"},
      {"DTensorLayersUnderMegatronDdp",
       Gpt2("precision: PRECISION_BF16_PURE parallelism { tensor: 2 data: 2 data_parallel: "
            "DATA_PARALLEL_MEGATRON_DDP tensor_layers: TENSOR_PARALLEL_LAYERS_DTENSOR }"),
       kInvalid, "config.parallelism.tensor_layers"},
      {"TensorLayersUndefined", Gpt2("parallelism { tensor: 2 }"), kInvalid,
       "config.parallelism.tensor_layers",
       [](v1::EstimateRequest* r) {
         r->mutable_config()->mutable_parallelism()->set_tensor_layers(
             static_cast<v1::TensorParallelLayers>(99));
       }},
  };
}

}  // namespace

std::vector<BadInput> BadConfigInputs() {
  std::vector<BadInput> rows = NumberRows();
  for (std::vector<BadInput> part : {EnumRows(), OptimizerAndCheckpointRows(), InferenceRows(),
                                     GenerationAndRuntimeRows(), LoraRows()}) {
    for (BadInput& row : part) rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace memest::testing
