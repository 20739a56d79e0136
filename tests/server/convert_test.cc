// Tests of proto <-> engine conversion (server/convert.h) and the status mapping, without RPC.
#include "server/convert.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <variant>

#include "engine/ir/text.h"
#include "server/status_conversion.h"

namespace memest {
namespace {

using ::testing::HasSubstr;

TEST(RunConfigFromProtoTest, DefaultsAreTheEngineDefaults) {
  StatusOr<RunConfig> config = RunConfigFromProto(v1::RunConfig());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const RunConfig defaults;
  EXPECT_EQ(config->mode, defaults.mode);
  EXPECT_EQ(config->grad_accum_steps, defaults.grad_accum_steps);
  EXPECT_EQ(config->precision, defaults.precision);
  EXPECT_EQ(config->optimizer.kind, defaults.optimizer.kind);
  EXPECT_EQ(config->optimizer.impl, defaults.optimizer.impl);
  EXPECT_EQ(config->optimizer.weight_decay, defaults.optimizer.weight_decay);
  EXPECT_EQ(config->zero_grad_set_to_none, defaults.zero_grad_set_to_none);
  EXPECT_EQ(config->checkpoint.policy, defaults.checkpoint.policy);
  EXPECT_EQ(config->checkpoint.every_k, defaults.checkpoint.every_k);
  EXPECT_EQ(config->step, defaults.step);
  EXPECT_EQ(config->device, "");
  EXPECT_EQ(config->device_capacity_bytes, 0);
  EXPECT_EQ(config->generate_tokens, 0);
  EXPECT_EQ(config->expandable_segments, defaults.expandable_segments);
  EXPECT_EQ(config->runtime, defaults.runtime);
  EXPECT_EQ(config->cpu_isa, defaults.cpu_isa);
  EXPECT_TRUE(config->hold_outputs) << "unset: the loop keeps the outputs";
  EXPECT_EQ(config->batch_size, 0) << "batch_size is required; 0 is left for the engine to refuse";
}

// The conversion carries each field as it is; whether they make sense together (scopes with
// the every-k policy, a catalog device with the CPU runtime, ...) is ValidateRunConfig's.
TEST(RunConfigFromProtoTest, EveryFieldIsCarried) {
  v1::RunConfig proto;
  proto.set_mode(v1::MODE_TRAINING);
  proto.set_batch_size(32);
  proto.set_grad_accum_steps(4);
  proto.set_precision(v1::PRECISION_BF16_AMP);
  proto.mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_SGD_MOMENTUM);
  proto.mutable_optimizer()->set_impl(v1::OPTIMIZER_IMPL_FUSED);
  proto.mutable_optimizer()->set_weight_decay(0.1);
  proto.set_zero_grad_keep_grads(true);
  proto.mutable_checkpoint()->set_policy(v1::CHECKPOINT_POLICY_EVERY_K_BLOCKS);
  proto.mutable_checkpoint()->set_every_k(3);
  proto.mutable_checkpoint()->add_scopes("h.0");
  proto.set_step(v1::STEP_KIND_FIRST_STEP);
  proto.set_device_name("a100-80gb");
  proto.set_generate_tokens(256);
  proto.set_expandable_segments(true);
  proto.set_runtime(v1::RUNTIME_CPU_TORCH_1_13);
  proto.set_cpu_isa(v1::CPU_ISA_AVX2);
  proto.set_hold_outputs(false);
  proto.mutable_fp8()->set_recipe(v1::FP8_RECIPE_DELAYED);
  proto.mutable_fp8()->set_amax_history_len(16);

  StatusOr<RunConfig> config = RunConfigFromProto(proto);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->mode, Mode::kTraining);
  EXPECT_EQ(config->batch_size, 32);
  EXPECT_EQ(config->grad_accum_steps, 4);
  EXPECT_EQ(config->precision, Precision::kBf16Amp);
  EXPECT_EQ(config->optimizer.kind, OptimizerKind::kSgdMomentum);
  EXPECT_EQ(config->optimizer.impl, OptimizerImpl::kFused);
  EXPECT_DOUBLE_EQ(config->optimizer.weight_decay, 0.1);
  EXPECT_FALSE(config->zero_grad_set_to_none);
  EXPECT_EQ(config->checkpoint.policy, CheckpointPolicy::kEveryKBlocks);
  EXPECT_EQ(config->checkpoint.every_k, 3);
  EXPECT_EQ(config->checkpoint.scopes, std::vector<std::string>{"h.0"});
  EXPECT_EQ(config->step, StepKind::kFirstStep);
  EXPECT_EQ(config->device, "a100-80gb");
  EXPECT_EQ(config->generate_tokens, 256);
  EXPECT_TRUE(config->expandable_segments);
  EXPECT_EQ(config->runtime, Runtime::kCpuTorch113);
  EXPECT_EQ(config->cpu_isa, CpuIsa::kAvx2);
  EXPECT_FALSE(config->hold_outputs);
  EXPECT_EQ(config->fp8.recipe, Fp8Recipe::kDelayed);
  EXPECT_EQ(config->fp8.amax_history_len, 16);
}

TEST(RunConfigFromProtoTest, ParallelismIsCarried) {
  v1::RunConfig proto;
  proto.set_batch_size(1);
  EXPECT_EQ(RunConfigFromProto(proto)->parallelism.sharding, DataSharding::kNone);
  proto.mutable_parallelism()->set_data(8);
  StatusOr<RunConfig> ddp = RunConfigFromProto(proto);
  ASSERT_TRUE(ddp.ok()) << ddp.status().ToString();
  EXPECT_EQ(ddp->parallelism.data, 8);
  EXPECT_EQ(ddp->parallelism.sharding, DataSharding::kDdp);  // unset with 8 ranks: DDP
  proto.mutable_parallelism()->set_data_parallel(v1::DATA_PARALLEL_ZERO1);
  proto.mutable_parallelism()->set_bucket_cap_mb(2.5);
  proto.mutable_parallelism()->set_gradient_as_bucket_view(true);
  StatusOr<RunConfig> zero = RunConfigFromProto(proto);
  ASSERT_TRUE(zero.ok()) << zero.status().ToString();
  EXPECT_EQ(zero->parallelism.sharding, DataSharding::kZero1);
  EXPECT_EQ(zero->parallelism.bucket_cap_bytes, 2621440);  // int(2.5 * 1024 * 1024)
  EXPECT_TRUE(zero->parallelism.gradient_as_bucket_view);
  for (double bad : {0.0, -1.0, 1e-9, 1e300}) {
    proto.mutable_parallelism()->set_bucket_cap_mb(bad);
    StatusOr<RunConfig> refused = RunConfigFromProto(proto);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("config.parallelism.bucket_cap_mb"),
              std::string::npos);
  }
  proto.mutable_parallelism()->clear_bucket_cap_mb();
  proto.mutable_parallelism()->set_gradient_as_bucket_view(false);
  proto.mutable_parallelism()->set_data_parallel(v1::DATA_PARALLEL_FSDP2);
  StatusOr<RunConfig> fsdp = RunConfigFromProto(proto);
  ASSERT_TRUE(fsdp.ok()) << fsdp.status().ToString();
  EXPECT_EQ(fsdp->parallelism.sharding, DataSharding::kFsdp2);
  EXPECT_TRUE(fsdp->parallelism.reshard_after_forward);  // unset: fully_shard's default
  EXPECT_FALSE(fsdp->parallelism.keep_last_block_gathered);
  EXPECT_FALSE(fsdp->parallelism.fsdp_mixed_precision);
  proto.mutable_parallelism()->set_keep_last_block_gathered(true);
  EXPECT_TRUE(RunConfigFromProto(proto)->parallelism.keep_last_block_gathered);
  proto.mutable_parallelism()->set_keep_last_block_gathered(false);
  proto.mutable_parallelism()->set_reshard_after_forward(false);
  proto.mutable_parallelism()->set_fsdp_mixed_precision(true);
  proto.mutable_parallelism()->set_fsdp_cpu_offload(true);
  fsdp = RunConfigFromProto(proto);
  EXPECT_FALSE(fsdp->parallelism.reshard_after_forward);
  EXPECT_TRUE(fsdp->parallelism.fsdp_mixed_precision);
  EXPECT_TRUE(fsdp->parallelism.fsdp_cpu_offload);
  proto.mutable_parallelism()->set_fsdp_cpu_offload(false);
  proto.mutable_parallelism()->set_data_parallel(v1::DATA_PARALLEL_DEEPSPEED_ZERO1);
  proto.mutable_parallelism()->set_offload_optimizer(true);
  StatusOr<RunConfig> zero1 = RunConfigFromProto(proto);
  ASSERT_TRUE(zero1.ok()) << zero1.status().ToString();
  EXPECT_EQ(zero1->parallelism.sharding, DataSharding::kDeepSpeedZero1);
  EXPECT_TRUE(zero1->parallelism.offload_optimizer);
  EXPECT_FALSE(zero1->parallelism.offload_param);
  proto.mutable_parallelism()->set_data_parallel(v1::DATA_PARALLEL_DEEPSPEED_ZERO3);
  proto.mutable_parallelism()->set_offload_param(true);
  StatusOr<RunConfig> zero3 = RunConfigFromProto(proto);
  ASSERT_TRUE(zero3.ok()) << zero3.status().ToString();
  EXPECT_TRUE(zero3->parallelism.offload_param);
  proto.mutable_parallelism()->set_offload_param(false);
  proto.mutable_parallelism()->set_offload_optimizer(false);
  proto.mutable_parallelism()->set_data_parallel(v1::DATA_PARALLEL_FSDP2);
  proto.mutable_parallelism()->set_pipeline(4);
  proto.mutable_parallelism()->set_pipeline_schedule(v1::PIPELINE_SCHEDULE_GPIPE);
  proto.mutable_parallelism()->set_pipeline_keep_outputs(true);
  StatusOr<RunConfig> piped = RunConfigFromProto(proto);
  ASSERT_TRUE(piped.ok()) << piped.status().ToString();
  EXPECT_EQ(piped->parallelism.pipeline, 4);
  EXPECT_EQ(piped->parallelism.pipeline_schedule, PipelineSchedule::kGPipe);
  EXPECT_TRUE(piped->parallelism.pipeline_keep_outputs);
  proto.mutable_parallelism()->set_tensor(4);
  proto.mutable_parallelism()->set_sequence_parallel(true);
  v1::TensorPlanEntry* entry = proto.mutable_parallelism()->add_tensor_plan();
  entry->set_module("q_proj");
  entry->set_style(v1::TENSOR_SHARD_STYLE_COLWISE);
  StatusOr<RunConfig> tp = RunConfigFromProto(proto);
  ASSERT_TRUE(tp.ok()) << tp.status().ToString();
  EXPECT_EQ(tp->parallelism.tensor, 4);
  EXPECT_TRUE(tp->parallelism.sequence_parallel);
  ASSERT_EQ(tp->parallelism.tensor_plan.size(), 1u);
  EXPECT_EQ(tp->parallelism.tensor_plan[0].module, "q_proj");
  EXPECT_EQ(tp->parallelism.tensor_plan[0].style, TensorShardStyle::kColwise);
  EXPECT_EQ(tp->parallelism.tensor_layers, TensorParallelLayers::kMegatron);
  proto.mutable_parallelism()->set_tensor_layers(v1::TENSOR_PARALLEL_LAYERS_DTENSOR);
  EXPECT_EQ(RunConfigFromProto(proto).value().parallelism.tensor_layers,
            TensorParallelLayers::kDTensor);
  proto.mutable_parallelism()->set_tensor_layers(static_cast<v1::TensorParallelLayers>(7));
  EXPECT_NE(RunConfigFromProto(proto).status().message().find("config.parallelism.tensor_layers"),
            std::string::npos);
  proto.mutable_parallelism()->clear_tensor_layers();
  entry->set_style(v1::TENSOR_SHARD_STYLE_UNSPECIFIED);
  EXPECT_NE(
      RunConfigFromProto(proto).status().message().find("config.parallelism.tensor_plan[0].style"),
      std::string::npos);
  proto.mutable_parallelism()->clear_tensor_plan();
  proto.mutable_parallelism()->set_tensor(0);
  proto.mutable_parallelism()->set_sequence_parallel(false);
  proto.mutable_parallelism()->set_data_parallel(v1::DATA_PARALLEL_MEGATRON_DDP);
  EXPECT_EQ(RunConfigFromProto(proto).value().parallelism.sharding, DataSharding::kMegatronDdp);
  proto.mutable_parallelism()->set_data_parallel(v1::DATA_PARALLEL_MEGATRON_DISTOPT);
  EXPECT_EQ(RunConfigFromProto(proto).value().parallelism.sharding, DataSharding::kMegatronDistOpt);
  proto.mutable_parallelism()->clear_data_parallel();
  proto.mutable_parallelism()->set_pipeline_schedule(static_cast<v1::PipelineSchedule>(9));
  EXPECT_NE(
      RunConfigFromProto(proto).status().message().find("config.parallelism.pipeline_schedule"),
      std::string::npos);
  proto.mutable_parallelism()->clear_pipeline_schedule();
  proto.mutable_parallelism()->set_data_parallel(static_cast<v1::DataParallel>(77));
  EXPECT_NE(RunConfigFromProto(proto).status().message().find("config.parallelism.data_parallel"),
            std::string::npos);
}

TEST(RunConfigFromProtoTest, AttentionAndModuleLoadingAreCarried) {
  v1::RunConfig proto;
  proto.set_batch_size(1);
  StatusOr<RunConfig> unset = RunConfigFromProto(proto);
  ASSERT_TRUE(unset.ok());
  EXPECT_EQ(unset->attention, AttentionImpl::kDefault);
  EXPECT_EQ(unset->module_loading, ModuleLoading::kLazy);
  proto.set_attention(v1::ATTENTION_FLASH);
  proto.set_cuda_module_loading(v1::CUDA_MODULE_LOADING_EAGER);
  StatusOr<RunConfig> set = RunConfigFromProto(proto);
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->attention, AttentionImpl::kFlash);
  EXPECT_EQ(set->module_loading, ModuleLoading::kEager);
  proto.set_attention(v1::ATTENTION_EAGER);
  EXPECT_EQ(RunConfigFromProto(proto)->attention, AttentionImpl::kEager);
  proto.set_attention(v1::ATTENTION_CUDNN);
  EXPECT_EQ(RunConfigFromProto(proto)->attention, AttentionImpl::kCudnn);
  proto.mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_HF_ADAFACTOR);
  EXPECT_EQ(RunConfigFromProto(proto)->optimizer.kind, OptimizerKind::kHfAdafactor);
  proto.mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_HF_ADAMW);
  EXPECT_EQ(RunConfigFromProto(proto)->optimizer.kind, OptimizerKind::kHfAdamW);
}

TEST(RunConfigFromProtoTest, InferenceIsCarried) {
  v1::RunConfig proto;
  proto.set_mode(v1::MODE_INFERENCE);
  proto.set_generate_tokens(256);
  StatusOr<RunConfig> config = RunConfigFromProto(proto);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->mode, Mode::kInference);
  EXPECT_EQ(config->generate_tokens, 256);
}

// A set serving message asks for a served model: inference when the mode is unset, the engine's
// batch of one, vLLM's settings carried (unset sizes stay 0: vLLM's defaults).
TEST(RunConfigFromProtoTest, ServingIsCarried) {
  v1::RunConfig proto;
  v1::Serving* s = proto.mutable_serving();
  s->set_gpu_memory_utilization(0.95);
  s->set_max_model_len(8192);
  s->set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_E5M2);
  s->set_concurrency(32);
  StatusOr<RunConfig> config = RunConfigFromProto(proto);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->mode, Mode::kInference);
  EXPECT_EQ(config->batch_size, 1);
  EXPECT_TRUE(config->serving.enabled);
  EXPECT_DOUBLE_EQ(config->serving.gpu_memory_utilization, 0.95);
  EXPECT_EQ(config->serving.block_size, 16);
  EXPECT_EQ(config->serving.max_model_len, 8192);
  EXPECT_EQ(config->serving.max_num_seqs, 0);
  EXPECT_EQ(config->serving.kv_cache_dtype, KvCacheDType::kFp8E5m2);
  EXPECT_EQ(config->serving.concurrency, 32);
  EXPECT_FALSE(RunConfigFromProto(v1::RunConfig())->serving.enabled);
}

TEST(RunConfigFromProtoTest, ExplicitZerosReachTheEngine) {
  v1::RunConfig proto;
  proto.set_grad_accum_steps(0);
  proto.mutable_checkpoint()->set_policy(v1::CHECKPOINT_POLICY_EVERY_K_BLOCKS);
  proto.mutable_checkpoint()->set_every_k(0);
  StatusOr<RunConfig> config = RunConfigFromProto(proto);
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->grad_accum_steps, 0);
  EXPECT_EQ(config->checkpoint.every_k, 0);
}

TEST(RunConfigFromProtoTest, RefusesWhatCannotBeRepresented) {
  struct Case {
    const char* field;
    v1::RunConfig config;
  };
  std::vector<Case> cases;
  auto add = [&cases](const char* field, auto mutate) {
    v1::RunConfig config;
    config.set_batch_size(1);
    mutate(config);
    cases.push_back({field, config});
  };
  add("config.mode", [](v1::RunConfig& c) { c.set_mode(static_cast<v1::Mode>(9)); });
  add("config.precision",
      [](v1::RunConfig& c) { c.set_precision(static_cast<v1::Precision>(-1)); });
  add("config.optimizer.kind", [](v1::RunConfig& c) {
    c.mutable_optimizer()->set_kind(static_cast<v1::OptimizerKind>(99));
  });
  add("config.optimizer.impl",
      [](v1::RunConfig& c) { c.mutable_optimizer()->set_impl(static_cast<v1::OptimizerImpl>(4)); });
  add("config.optimizer.weight_decay", [](v1::RunConfig& c) {
    c.mutable_optimizer()->set_weight_decay(std::numeric_limits<double>::quiet_NaN());
  });
  add("config.optimizer.weight_decay", [](v1::RunConfig& c) {
    c.mutable_optimizer()->set_weight_decay(std::numeric_limits<double>::infinity());
  });
  add("config.checkpoint.policy", [](v1::RunConfig& c) {
    c.mutable_checkpoint()->set_policy(static_cast<v1::CheckpointPolicy>(7));
  });
  add("config.step", [](v1::RunConfig& c) { c.set_step(static_cast<v1::StepKind>(3)); });
  add("config.device_capacity_bytes",
      [](v1::RunConfig& c) { c.set_device_capacity_bytes(uint64_t{1} << 63); });
  add("config.device_capacity_bytes", [](v1::RunConfig& c) { c.set_device_capacity_bytes(0); });
  add("config.runtime", [](v1::RunConfig& c) { c.set_runtime(static_cast<v1::Runtime>(5)); });
  add("config.cpu_isa", [](v1::RunConfig& c) {
    c.set_runtime(v1::RUNTIME_CPU_TORCH_1_13);
    c.set_cpu_isa(static_cast<v1::CpuIsa>(9));
  });
  // The ISA is the CPU runtime's; with CUDA it would be silently meaningless.
  add("config.cpu_isa", [](v1::RunConfig& c) { c.set_cpu_isa(v1::CPU_ISA_AVX2); });

  for (const Case& c : cases) {
    SCOPED_TRACE(c.config.ShortDebugString());
    StatusOr<RunConfig> config = RunConfigFromProto(c.config);
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr(c.field));
  }
}

TEST(ModelFromProtoTest, UnsetModelIsRefused) {
  StatusOr<ModelSpec> model = ModelFromProto(v1::Model());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr("model"));
}

TEST(ModelFromProtoTest, PresetIsCarried) {
  v1::Model proto;
  proto.mutable_preset()->set_name("gpt2-small");
  (*proto.mutable_preset()->mutable_params())["seq"] = 128;
  StatusOr<ModelSpec> model = ModelFromProto(proto);
  ASSERT_TRUE(model.ok());
  const auto* preset = std::get_if<PresetSpec>(&model->source);
  ASSERT_NE(preset, nullptr);
  EXPECT_EQ(preset->name, "gpt2-small");
  EXPECT_EQ(preset->params.at("seq"), 128);
}

TEST(ModelFromProtoTest, LayerModelIsCarriedWithDefaults) {
  v1::Model proto;
  v1::LayerModel* layers = proto.mutable_layers();
  layers->add_input_shape(3);
  layers->add_input_shape(-224);  // negative sizes are the engine's to refuse
  v1::Layer* conv = layers->add_layers();
  conv->set_kind("conv2d");
  conv->set_name("stem");
  (*conv->mutable_attrs())["out_channels"].set_i(64);
  (*conv->mutable_attrs())["p"].set_f(0.5);
  (*conv->mutable_attrs())["kernel_size"].mutable_ints()->add_values(7);
  (*conv->mutable_attrs())["activation"].set_s("relu");

  StatusOr<ModelSpec> model = ModelFromProto(proto);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const auto* spec = std::get_if<LayerModelSpec>(&model->source);
  ASSERT_NE(spec, nullptr);
  EXPECT_EQ(spec->input_shape, (Shape{3, -224}));
  EXPECT_EQ(spec->input_dtype, DType::kFloat32);
  EXPECT_EQ(spec->loss, "sum");
  ASSERT_EQ(spec->layers.size(), 1u);
  const Attrs& attrs = spec->layers[0].attrs;
  EXPECT_EQ(spec->layers[0].name, "stem");
  EXPECT_EQ(std::get<int64_t>(attrs.at("out_channels")), 64);
  EXPECT_EQ(std::get<double>(attrs.at("p")), 0.5);
  EXPECT_EQ(std::get<std::vector<int64_t>>(attrs.at("kernel_size")), std::vector<int64_t>{7});
  EXPECT_EQ(std::get<std::string>(attrs.at("activation")), "relu");
}

TEST(ModelFromProtoTest, OpGraphIsCarried) {
  v1::Model proto;
  v1::OpGraph* graph = proto.mutable_ops();
  v1::TensorDecl* w = graph->add_tensors();
  w->set_name("w");
  w->add_shape(4);
  w->set_dtype("bf16");
  w->set_role(v1::TENSOR_ROLE_PARAMETER);
  w->set_frozen(true);
  w->set_batch_dim(-1);
  v1::TensorDecl* x = graph->add_tensors();
  x->set_name("x");
  v1::OpDecl* op = graph->add_ops();
  op->set_kind("mul");
  op->add_inputs("x");
  op->add_inputs("w");
  op->add_outputs("y");
  op->set_scope("blocks.0");
  graph->set_loss("y");
  graph->add_blocks("blocks.0");
  graph->set_traced_batch(8);
  v1::HeldTensor* held = graph->add_held();
  held->set_tensor("x");
  held->set_until_op(0);
  graph->add_outputs("y");

  StatusOr<ModelSpec> model = ModelFromProto(proto);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const auto* spec = std::get_if<OpGraphSpec>(&model->source);
  ASSERT_NE(spec, nullptr);
  ASSERT_EQ(spec->tensors.size(), 2u);
  EXPECT_EQ(spec->tensors[0].dtype, DType::kBFloat16);
  EXPECT_EQ(spec->tensors[0].role, TensorRole::kParameter);
  EXPECT_FALSE(spec->tensors[0].requires_grad);
  EXPECT_EQ(spec->tensors[0].batch_dim, -1);
  EXPECT_EQ(spec->tensors[1].role, TensorRole::kInput) << "UNSPECIFIED role is an input";
  EXPECT_EQ(spec->tensors[1].dtype, DType::kFloat32);
  EXPECT_TRUE(spec->tensors[1].requires_grad);
  EXPECT_EQ(spec->tensors[1].batch_dim, 0);
  ASSERT_EQ(spec->ops.size(), 1u);
  EXPECT_EQ(spec->ops[0].inputs, (std::vector<std::string>{"x", "w"}));
  EXPECT_EQ(spec->ops[0].outputs, std::vector<std::string>{"y"});
  EXPECT_EQ(spec->ops[0].scope, "blocks.0");
  EXPECT_EQ(spec->loss, "y");
  EXPECT_EQ(spec->blocks, std::vector<std::string>{"blocks.0"});
  EXPECT_EQ(spec->traced_batch, 8);
  ASSERT_EQ(spec->held.size(), 1u);
  EXPECT_EQ(spec->held[0].tensor, "x");
  EXPECT_EQ(spec->held[0].until_op, 0);
  EXPECT_EQ(spec->outputs, std::vector<std::string>{"y"});
}

TEST(ModelFromProtoTest, RefusesWhatCannotBeRepresented) {
  {
    v1::Model proto;
    proto.mutable_layers()->set_input_dtype("float13");
    StatusOr<ModelSpec> model = ModelFromProto(proto);
    ASSERT_FALSE(model.ok());
    EXPECT_THAT(model.status().message(), HasSubstr("model.input_dtype"));
  }
  {
    v1::Model proto;
    v1::OpGraph* graph = proto.mutable_ops();
    graph->add_tensors()->set_name("x");
    graph->add_tensors()->set_role(static_cast<v1::TensorRole>(12));
    StatusOr<ModelSpec> model = ModelFromProto(proto);
    ASSERT_FALSE(model.ok());
    EXPECT_THAT(model.status().message(), HasSubstr("model.tensors[1].role"));
  }
  {
    v1::Model proto;
    v1::OpGraph* graph = proto.mutable_ops();
    graph->add_ops();
    (*graph->add_ops()->mutable_attrs())["eps"].set_f(std::nan(""));
    StatusOr<ModelSpec> model = ModelFromProto(proto);
    ASSERT_FALSE(model.ok());
    EXPECT_THAT(model.status().message(), HasSubstr("model.ops[1].attrs.eps"));
  }
  {
    v1::Model proto;
    v1::Layer* layer = proto.mutable_layers()->add_layers();
    (*layer->mutable_attrs())["b"].set_i(1);
    (*layer->mutable_attrs())["a"];  // no value
    StatusOr<ModelSpec> model = ModelFromProto(proto);
    ASSERT_FALSE(model.ok());
    EXPECT_THAT(model.status().message(), HasSubstr("model.layers[0].attrs.a"));
  }
  for (const char* field : {"model.held[0].tensor", "model.outputs[1]"}) {
    v1::Model proto;
    v1::OpGraph* graph = proto.mutable_ops();
    const std::string long_name(kMaxNameBytes + 1, 'h');
    if (std::string(field) == "model.outputs[1]") {
      graph->add_outputs("y");
      graph->add_outputs(long_name);
    } else {
      graph->add_held()->set_tensor(long_name);
    }
    StatusOr<ModelSpec> model = ModelFromProto(proto);
    ASSERT_FALSE(model.ok());
    EXPECT_THAT(model.status().message(), HasSubstr(field));
    EXPECT_THAT(model.status().message(), HasSubstr("1024"));
  }
}

TEST(ReportToProtoTest, ServingIsCarried) {
  Report report;
  ServingReport s;
  s.gpu_memory_utilization = 0.95;
  s.block_size = 16;
  s.max_num_seqs = 1024;
  s.max_num_batched_tokens = 8192;
  s.max_model_len = 8192;
  s.kv_cache_dtype = "fp8_e4m3";
  s.profile_requests = 1024;
  s.requested_bytes = 1000;
  s.weights_bytes = 600;
  s.activation_peak_bytes = 100;
  s.non_torch_bytes = 50;
  s.kv_cache_bytes = -5;  // none left: negative on the wire too
  s.kv_bytes_per_token = 64;
  s.kv_layers = 32;
  s.num_blocks = 7;
  s.kv_tokens = 112;
  s.max_concurrency = 0.25;
  s.request_tokens = 100;
  s.concurrent_requests = 1;
  s.concurrency = 2;
  s.longest_request = 48;
  s.longest_single_request = 112;
  s.baseline_bytes = 30;
  s.starts = false;
  s.refusal = "No available memory for the cache blocks";
  report.serving = s;
  v1::EstimateResponse out;
  ReportToProto(report, &out);
  ASSERT_TRUE(out.has_serving());
  const v1::ServingReport& o = out.serving();
  EXPECT_DOUBLE_EQ(o.gpu_memory_utilization(), 0.95);
  EXPECT_EQ(o.block_size(), 16);
  EXPECT_EQ(o.max_num_seqs(), 1024);
  EXPECT_EQ(o.max_num_batched_tokens(), 8192);
  EXPECT_EQ(o.max_model_len(), 8192);
  EXPECT_EQ(o.kv_cache_dtype(), "fp8_e4m3");
  EXPECT_EQ(o.profile_requests(), 1024);
  EXPECT_EQ(o.requested_bytes(), 1000u);
  EXPECT_EQ(o.weights_bytes(), 600u);
  EXPECT_EQ(o.activation_peak_bytes(), 100u);
  EXPECT_EQ(o.non_torch_bytes(), 50u);
  EXPECT_EQ(o.kv_cache_bytes(), -5);
  EXPECT_EQ(o.kv_bytes_per_token(), 64u);
  EXPECT_EQ(o.kv_layers(), 32);
  EXPECT_EQ(o.num_blocks(), 7);
  EXPECT_EQ(o.kv_tokens(), 112);
  EXPECT_DOUBLE_EQ(o.max_concurrency(), 0.25);
  EXPECT_EQ(o.request_tokens(), 100);
  EXPECT_EQ(o.concurrent_requests(), 1);
  EXPECT_EQ(o.concurrency(), 2);
  EXPECT_EQ(o.longest_request(), 48);
  EXPECT_EQ(o.longest_single_request(), 112);
  EXPECT_EQ(o.baseline_bytes(), 30u);
  EXPECT_FALSE(o.starts());
  EXPECT_EQ(o.refusal(), "No available memory for the cache blocks");
  Report plain;
  ReportToProto(plain, &out);
  EXPECT_FALSE(out.has_serving());
}

TEST(ReportToProtoTest, EveryFieldIsCarried) {
  Report report;
  report.parameter_count = 10;
  report.trainable_parameter_count = 7;
  report.micro_batch = 4;
  report.op_count = 3;
  for (int c = 0; c < kNumCategories; ++c) report.breakdown[c] = 100 + c;
  report.peak.phase = Phase::kBackward;
  report.peak.allocated_bytes = 1000;
  report.peak.reserved_bytes = 2000;
  report.peak.by_category[static_cast<int>(Category::kActivations)] = 600;
  report.peak.op = "linear";
  report.peak.scope = "h.1.mlp";
  report.peak.micro_batch = 1;
  report.peak.recompute = true;
  report.peak_reserved_bytes = 2500;
  report.phases = {report.peak};
  report.layers.push_back({"h.1", 1, 2, 3, 4});
  report.fit = DeviceFit{"h100-80gb", 80, 90, false, -10};
  report.advice.push_back({"checkpoint", "Checkpoint every block.", 123, "h"});
  report.notes.push_back("a note");
  report.data_parallel = DataParallelReport{8, 3, {1 << 20, 5 << 20}, {7, 9}};

  v1::EstimateResponse out;
  ReportToProto(report, &out);
  EXPECT_EQ(out.parameter_count(), 10u);
  EXPECT_EQ(out.trainable_parameter_count(), 7u);
  EXPECT_EQ(out.micro_batch(), 4u);
  EXPECT_EQ(out.op_count(), 3u);
  const v1::MemoryByCategory& b = out.breakdown();
  EXPECT_EQ(b.parameters(), 100u);
  EXPECT_EQ(b.gradients(), 101u);
  EXPECT_EQ(b.optimizer_state(), 102u);
  EXPECT_EQ(b.master_and_casts(), 103u);
  EXPECT_EQ(b.activations(), 104u);
  EXPECT_EQ(b.temporaries(), 105u);
  EXPECT_EQ(b.inputs(), 106u);
  EXPECT_EQ(b.kv_cache(), 107u);
  EXPECT_EQ(b.workspace(), 108u);
  EXPECT_EQ(b.communication(), 109u);
  EXPECT_EQ(b.allocator_overhead(), 110u);
  EXPECT_EQ(b.cuda_context(), 111u);
  EXPECT_EQ(out.peak().phase(), v1::PHASE_BACKWARD);
  EXPECT_EQ(out.peak().allocated_bytes(), 1000u);
  EXPECT_EQ(out.peak().reserved_bytes(), 2000u);
  EXPECT_EQ(out.peak().by_category().activations(), 600u);
  EXPECT_EQ(out.peak().op(), "linear");
  EXPECT_EQ(out.peak().scope(), "h.1.mlp");
  EXPECT_EQ(out.peak().micro_batch(), 1);
  EXPECT_TRUE(out.peak().recompute());
  EXPECT_EQ(out.peak_reserved_bytes(), 2500u);
  ASSERT_EQ(out.phases_size(), 1);
  ASSERT_EQ(out.layers_size(), 1);
  EXPECT_EQ(out.layers(0).scope(), "h.1");
  EXPECT_EQ(out.layers(0).parameter_bytes(), 1u);
  EXPECT_EQ(out.layers(0).saved_bytes(), 2u);
  EXPECT_EQ(out.layers(0).output_bytes(), 3u);
  EXPECT_EQ(out.layers(0).temporary_bytes(), 4u);
  ASSERT_TRUE(out.has_fit());
  EXPECT_EQ(out.fit().device(), "h100-80gb");
  EXPECT_EQ(out.fit().capacity_bytes(), 80u);
  EXPECT_EQ(out.fit().required_bytes(), 90u);
  EXPECT_FALSE(out.fit().fits());
  EXPECT_EQ(out.fit().headroom_bytes(), -10);
  ASSERT_EQ(out.advice_size(), 1);
  EXPECT_EQ(out.advice(0).kind(), "checkpoint");
  EXPECT_EQ(out.advice(0).saving_bytes(), 123u);
  EXPECT_EQ(out.advice(0).scope(), "h");
  ASSERT_TRUE(out.has_data_parallel());
  EXPECT_EQ(out.data_parallel().world(), 8);
  EXPECT_EQ(out.data_parallel().rank(), 3);
  EXPECT_EQ(out.data_parallel().bucket_bytes_size(), 2);
  EXPECT_EQ(out.data_parallel().bucket_bytes(1), 5u << 20);
  EXPECT_EQ(out.data_parallel().owned_elements(1), 9u);
  ASSERT_EQ(out.notes_size(), 1);

  report.fit.reset();
  ReportToProto(report, &out);
  EXPECT_FALSE(out.has_fit());
}

TEST(StatusConversionTest, EveryCodeMapsOneToOne) {
  EXPECT_TRUE(ToGrpcStatus(Status::Ok()).ok());
  EXPECT_EQ(ToGrpcCode(StatusCode::kInvalidArgument), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpcCode(StatusCode::kNotFound), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(ToGrpcCode(StatusCode::kResourceExhausted), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ToGrpcCode(StatusCode::kFailedPrecondition), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ToGrpcCode(StatusCode::kUnavailable), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ToGrpcCode(StatusCode::kInternal), grpc::StatusCode::INTERNAL);
  grpc::Status status = ToGrpcStatus(InvalidArgument("config.batch_size: must be positive"));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "config.batch_size: must be positive");
}

}  // namespace
}  // namespace memest
