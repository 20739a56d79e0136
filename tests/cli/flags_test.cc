// Unit tests of the CLI's pieces that need no engine: flags to request, capacities, units.
#include <gtest/gtest.h>

#include <string>

#include "client/cli/capacity.h"
#include "client/cli/flags.h"
#include "client/cli/plan_flags.h"
#include "client/cli/units.h"

namespace memest::cli {
namespace {

TEST(ParseCapacityTest, AcceptsBytesAndUnits) {
  struct Case {
    const char* text;
    int64_t bytes;
  };
  const Case cases[] = {
      {"85899345920", 85899345920},
      {"80GiB", int64_t{80} << 30},
      {"80 GiB", int64_t{80} << 30},
      {"80gib", int64_t{80} << 30},
      {"80G", int64_t{80} << 30},
      {"80GB", 80'000'000'000},
      {"512MiB", int64_t{512} << 20},
      {"1.5TiB", int64_t{3} << 39},
      {"24KB", 24'000},
  };
  for (const Case& c : cases) {
    StatusOr<int64_t> bytes = ParseCapacity(c.text);
    ASSERT_TRUE(bytes.ok()) << c.text << ": " << bytes.status().ToString();
    EXPECT_EQ(*bytes, c.bytes) << c.text;
  }
}

TEST(ParseCapacityTest, RefusesNamingTheFlag) {
  for (const char* text : {"", "GiB", "-5GiB", "0", "80 parsecs", "1.5", "9e30", "nan"}) {
    StatusOr<int64_t> bytes = ParseCapacity(text);
    ASSERT_FALSE(bytes.ok()) << text;
    EXPECT_EQ(bytes.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bytes.status().message().find("--capacity"), std::string::npos) << text;
  }
}

TEST(FormatBytesTest, BinaryUnitsWithThreeFigures) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(int64_t{475} << 20), "475 MiB");
  EXPECT_EQ(FormatBytes(int64_t{1023} << 20), "1.00 GiB");  // never "1023 MiB" rounded up
  EXPECT_EQ(FormatBytes((int64_t{80} << 30) - (int64_t{1} << 29)), "79.5 GiB");
  EXPECT_EQ(FormatBytes(-(int64_t{2} << 30)), "-2.00 GiB");
  EXPECT_EQ(FormatCount(124'439'808), "124M");
  EXPECT_EQ(FormatCount(6'738'415'616), "6.74B");
  EXPECT_EQ(FormatPercent(1, 4), "25.0%");
  EXPECT_EQ(FormatPercent(1, 0), "-");
}

TEST(BuildEstimateRequestTest, MapsFlagsToTheRequest) {
  EstimateFlags flags;
  flags.preset = "gpt2-small";
  flags.params = {"layers=6"};
  flags.seq = 1024;
  flags.batch = 8;
  flags.grad_accum = 2;
  flags.precision = "bf16";
  flags.optimizer = "momentum";
  flags.optimizer_impl = "fused";
  flags.weight_decay = 0.1;
  flags.keep_grads = true;
  flags.checkpoint = "every-k";
  flags.checkpoint_k = 3;
  flags.first_step = true;
  flags.device = "h100-80gb";
  flags.runtime = "cpu-1.13";
  flags.cpu_isa = "avx2";
  flags.no_advice = true;

  StatusOr<v1::EstimateRequest> request = BuildEstimateRequest(flags);
  ASSERT_TRUE(request.ok()) << request.status().ToString();
  const v1::Preset& preset = request->model().preset();
  EXPECT_EQ(preset.name(), "gpt2-small");
  EXPECT_EQ(preset.params().at("seq"), 1024);
  EXPECT_EQ(preset.params().at("layers"), 6);
  const v1::RunConfig& config = request->config();
  EXPECT_EQ(config.batch_size(), 8);
  EXPECT_EQ(config.grad_accum_steps(), 2);
  EXPECT_EQ(config.precision(), v1::PRECISION_BF16_AMP);
  EXPECT_EQ(config.optimizer().kind(), v1::OPTIMIZER_KIND_SGD_MOMENTUM);
  EXPECT_EQ(config.optimizer().impl(), v1::OPTIMIZER_IMPL_FUSED);
  EXPECT_DOUBLE_EQ(config.optimizer().weight_decay(), 0.1);
  EXPECT_TRUE(config.zero_grad_keep_grads());
  EXPECT_EQ(config.checkpoint().policy(), v1::CHECKPOINT_POLICY_EVERY_K_BLOCKS);
  EXPECT_EQ(config.checkpoint().every_k(), 3);
  EXPECT_EQ(config.step(), v1::STEP_KIND_FIRST_STEP);
  EXPECT_EQ(config.device_name(), "h100-80gb");
  EXPECT_EQ(config.runtime(), v1::RUNTIME_CPU_TORCH_1_13);
  EXPECT_EQ(config.cpu_isa(), v1::CPU_ISA_AVX2);
  EXPECT_TRUE(request->skip_advice());
}

TEST(BuildEstimateRequestTest, MapsTheFp8Flags) {
  EstimateFlags flags;
  flags.preset = "gpt2-small";
  flags.fp8 = "delayed";
  flags.fp8_amax_history = 16;
  StatusOr<v1::EstimateRequest> request = BuildEstimateRequest(flags);
  ASSERT_TRUE(request.ok()) << request.status().ToString();
  EXPECT_EQ(request->config().fp8().recipe(), v1::FP8_RECIPE_DELAYED);
  EXPECT_EQ(request->config().fp8().amax_history_len(), 16);
  flags.fp8 = "";
  EXPECT_NE(BuildEstimateRequest(flags).status().message().find("--fp8-amax-history"),
            std::string::npos);
  flags.fp8 = "sometimes";
  EXPECT_NE(BuildEstimateRequest(flags).status().message().find("--fp8"), std::string::npos);
}

TEST(BuildEstimateRequestTest, MapsTheParallelismFlags) {
  EstimateFlags flags;
  flags.preset = "gpt2-small";
  flags.parallel.data = 8;
  flags.parallel.strategy = "fsdp2";
  flags.parallel.no_reshard_after_forward = true;
  flags.parallel.fsdp_mixed_precision = true;
  StatusOr<v1::EstimateRequest> request = BuildEstimateRequest(flags);
  ASSERT_TRUE(request.ok()) << request.status().ToString();
  const v1::Parallelism& p = request->config().parallelism();
  EXPECT_EQ(p.data(), 8);
  EXPECT_EQ(p.data_parallel(), v1::DATA_PARALLEL_FSDP2);
  ASSERT_TRUE(p.has_reshard_after_forward());
  EXPECT_FALSE(p.reshard_after_forward());
  EXPECT_TRUE(p.fsdp_mixed_precision());
  EXPECT_FALSE(p.keep_last_block_gathered());
  // Not given: reshard_after_forward stays unset (the engine's default, true).
  flags.parallel.no_reshard_after_forward = false;
  EXPECT_FALSE(BuildEstimateRequest(flags)->config().parallelism().has_reshard_after_forward());
  flags.parallel.keep_last_block_gathered = true;
  EXPECT_TRUE(BuildEstimateRequest(flags)->config().parallelism().keep_last_block_gathered());
  flags.parallel.keep_last_block_gathered = false;
  flags.parallel.pipeline = 4;
  flags.parallel.pipeline_schedule = "gpipe";
  flags.parallel.pipeline_keep_outputs = true;
  const v1::Parallelism piped = BuildEstimateRequest(flags)->config().parallelism();
  EXPECT_EQ(piped.pipeline(), 4);
  EXPECT_EQ(piped.pipeline_schedule(), v1::PIPELINE_SCHEDULE_GPIPE);
  EXPECT_TRUE(piped.pipeline_keep_outputs());
  flags.parallel.pipeline_schedule = "interleaved";
  EXPECT_NE(BuildEstimateRequest(flags).status().message().find("--pipeline-schedule"),
            std::string::npos);
  flags.parallel.pipeline_schedule.clear();
  flags.parallel.tensor = 8;
  flags.parallel.sequence_parallel = true;
  flags.parallel.tensor_plan = {"attn.c_attn=colwise", "h.*.attn.c_proj=rowwise"};
  const v1::Parallelism tp = BuildEstimateRequest(flags)->config().parallelism();
  EXPECT_EQ(tp.tensor(), 8);
  EXPECT_EQ(tp.context(), 0);
  EXPECT_EQ(tp.pipeline_virtual_stages(), 0);
  EXPECT_TRUE(tp.sequence_parallel());
  ASSERT_EQ(tp.tensor_plan_size(), 2);
  EXPECT_EQ(tp.tensor_plan(1).module(), "h.*.attn.c_proj");
  EXPECT_EQ(tp.tensor_plan(1).style(), v1::TENSOR_SHARD_STYLE_ROWWISE);
  EXPECT_EQ(tp.tensor_layers(), v1::TENSOR_PARALLEL_LAYERS_UNSPECIFIED);
  flags.parallel.tensor_layers = "dtensor";
  EXPECT_EQ(BuildEstimateRequest(flags)->config().parallelism().tensor_layers(),
            v1::TENSOR_PARALLEL_LAYERS_DTENSOR);
  flags.parallel.tensor_layers = "apex";
  EXPECT_NE(BuildEstimateRequest(flags).status().message().find("--tensor-layers"), std::string::npos);
  flags.parallel.tensor_layers.clear();
  flags.parallel.tensor_plan = {"c_attn=diagonal"};
  EXPECT_NE(BuildEstimateRequest(flags).status().message().find("--tensor-plan"), std::string::npos);
  flags.parallel.tensor_plan = {"c_attn"};
  EXPECT_NE(BuildEstimateRequest(flags).status().message().find("MODULE=colwise"), std::string::npos);
  flags.parallel.tensor_plan.clear();
  flags.parallel.strategy = "megatron-distopt";
  EXPECT_EQ(BuildEstimateRequest(flags)->config().parallelism().data_parallel(),
            v1::DATA_PARALLEL_MEGATRON_DISTOPT);
  EXPECT_EQ(BuildEstimateRequest(flags)->config().parallelism().expert(), 0);  // unset: 1
  flags.parallel.expert = 4;
  EXPECT_EQ(BuildEstimateRequest(flags)->config().parallelism().expert(), 4);
  flags.parallel.expert.reset();
  flags.parallel.strategy = "deepspeed-zero1";
  flags.parallel.offload_optimizer = true;
  const v1::Parallelism zero = BuildEstimateRequest(flags)->config().parallelism();
  EXPECT_EQ(zero.data_parallel(), v1::DATA_PARALLEL_DEEPSPEED_ZERO1);
  EXPECT_TRUE(zero.offload_optimizer());
  EXPECT_EQ(zero.data_shard(), 0);
  flags.parallel.strategy = "deepspeed-zero3";
  flags.parallel.offload_param = true;
  const v1::Parallelism zero3 = BuildEstimateRequest(flags)->config().parallelism();
  EXPECT_TRUE(zero3.offload_optimizer());
  EXPECT_TRUE(zero3.offload_param());
  flags.parallel.offload_param = false;
  flags.parallel.offload_optimizer = false;
  flags.parallel.strategy = "fsdp2";
  flags.parallel.fsdp_cpu_offload = true;
  EXPECT_TRUE(BuildEstimateRequest(flags)->config().parallelism().fsdp_cpu_offload());
  flags.parallel.fsdp_cpu_offload = false;
  flags.parallel.data_shard = 4;
  EXPECT_EQ(BuildEstimateRequest(flags)->config().parallelism().data_shard(), 4);
  flags.parallel.strategy = "deepspeed-zero3";
  flags.parallel.stage3_max_reuse = 1000;
  const v1::Parallelism z3 = BuildEstimateRequest(flags)->config().parallelism();
  EXPECT_EQ(z3.data_parallel(), v1::DATA_PARALLEL_DEEPSPEED_ZERO3);
  EXPECT_EQ(z3.stage3_max_reuse_distance(), 1000);
  EXPECT_FALSE(z3.has_stage3_prefetch_bucket_size());
  flags.parallel.stage3_max_reuse.reset();
  flags.parallel.strategy = "fsdp3";
  EXPECT_NE(BuildEstimateRequest(flags).status().message().find("--dp-strategy"),
            std::string::npos);
}

TEST(BuildEstimateRequestTest, DefaultsLeaveTheEngineDefaults) {
  EstimateFlags flags;
  flags.preset = "mlp";
  StatusOr<v1::EstimateRequest> request = BuildEstimateRequest(flags);
  ASSERT_TRUE(request.ok());
  const v1::RunConfig& config = request->config();
  EXPECT_EQ(config.batch_size(), 1);
  EXPECT_FALSE(config.has_grad_accum_steps());
  EXPECT_EQ(config.precision(), v1::PRECISION_UNSPECIFIED);
  EXPECT_FALSE(config.has_optimizer());
  EXPECT_FALSE(config.has_checkpoint());
  EXPECT_EQ(config.device_case(), v1::RunConfig::DEVICE_NOT_SET);
  EXPECT_EQ(config.cpu_isa(), v1::CPU_ISA_UNSPECIFIED);
  EXPECT_FALSE(config.has_attention());
  EXPECT_FALSE(config.has_cuda_module_loading());
  EXPECT_FALSE(request->skip_advice());
}

// --attention takes memest's names and Hugging Face's attn_implementation names.
TEST(BuildEstimateRequestTest, AttentionAndModuleLoading) {
  const std::pair<const char*, v1::Attention> cases[] = {
      {"eager", v1::ATTENTION_EAGER},         {"sdpa", v1::ATTENTION_SDPA},
      {"flash", v1::ATTENTION_FLASH},         {"flash_attention_2", v1::ATTENTION_FLASH},
      {"mem-efficient", v1::ATTENTION_MEM_EFFICIENT}, {"cudnn", v1::ATTENTION_CUDNN},
  };
  for (const auto& [word, value] : cases) {
    EstimateFlags flags;
    flags.preset = "mlp";
    flags.attention = word;
    StatusOr<v1::EstimateRequest> request = BuildEstimateRequest(flags);
    ASSERT_TRUE(request.ok()) << word;
    EXPECT_TRUE(request->config().has_attention());
    EXPECT_EQ(request->config().attention(), value) << word;
  }
  EstimateFlags flags;
  flags.preset = "mlp";
  flags.cuda_module_loading = "eager";
  flags.cublas_workspace_config = ":4096:8";
  flags.optimizer = "hf-adafactor";
  StatusOr<v1::EstimateRequest> request = BuildEstimateRequest(flags);
  ASSERT_TRUE(request.ok());
  EXPECT_EQ(request->config().cuda_module_loading(), v1::CUDA_MODULE_LOADING_EAGER);
  EXPECT_EQ(request->config().cublas_workspace_config(), ":4096:8");
  EXPECT_EQ(request->config().optimizer().kind(), v1::OPTIMIZER_KIND_HF_ADAFACTOR);
  flags.attention = "xformers";
  EXPECT_NE(BuildEstimateRequest(flags).status().message().find("--attention"),
            std::string::npos);
}

TEST(BuildEstimateRequestTest, CapacityAndModelFile) {
  EstimateFlags flags;
  flags.model_file = std::string(MEMEST_SOURCE_DIR) + "/examples/mlp.json";
  flags.capacity = "24GiB";
  StatusOr<v1::EstimateRequest> request = BuildEstimateRequest(flags);
  ASSERT_TRUE(request.ok()) << request.status().ToString();
  EXPECT_TRUE(request->model().has_layers());
  EXPECT_GT(request->model().layers().layers_size(), 0);
  EXPECT_EQ(request->config().device_capacity_bytes(), uint64_t{24} << 30);
}

TEST(BuildEstimateRequestTest, RefusesConflictsNamingTheFlags) {
  EstimateFlags both;
  both.preset = "mlp";
  both.model_file = "x.json";
  EXPECT_NE(BuildEstimateRequest(both).status().message().find("--preset and --model"),
            std::string::npos);

  EstimateFlags device;
  device.preset = "mlp";
  device.device = "a100-80gb";
  device.capacity = "80GiB";
  EXPECT_NE(BuildEstimateRequest(device).status().message().find("--device and --capacity"),
            std::string::npos);

  EstimateFlags mode;
  mode.preset = "mlp";
  mode.mode = "serving";
  EXPECT_NE(BuildEstimateRequest(mode).status().message().find("--mode"), std::string::npos);

  EstimateFlags isa;
  isa.preset = "mlp";
  isa.runtime = "cpu-1.13";
  isa.cpu_isa = "avx512f";
  EXPECT_NE(BuildEstimateRequest(isa).status().message().find("--cpu-isa"), std::string::npos);
}

TEST(PlanFlagsTest, HostMemoryPerGpuAllowsOffloadPlans) {
  PlanFlags flags;
  flags.model.preset = "llama-7b";
  flags.model.batch = 16;
  EXPECT_EQ(BuildPlanRequest(flags)->host_memory_per_gpu_bytes(), 0);
  flags.host_memory_per_gpu = "256GiB";
  EXPECT_EQ(BuildPlanRequest(flags)->host_memory_per_gpu_bytes(), int64_t{256} << 30);
  flags.host_memory_per_gpu = "lots";
  const Status bad = BuildPlanRequest(flags).status();
  EXPECT_NE(bad.message().find("--host-memory-per-gpu"), std::string::npos) << bad.ToString();
}

}  // namespace
}  // namespace memest::cli
