// Estimates per second of the engine alone (no gRPC): Estimate() for GPT-2 small and the
// Llama 70B preset, with advice (which re-runs the estimate under alternatives) and without, and
// one rank of the 70B under 8-way tensor parallelism; and the serving estimate (vLLM's startup:
// its profile run, and the model built again for one token to read the KV layout).
// Also Validate's host side on a fake device: planning, the replay of every allocation
// through the caching policy and the op-to-kernel mapping, without any kernel time.
//
//   build/bin/engine_bench --benchmark_min_time=2
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/estimator.h"
#include "engine/ir/config.h"
#include "engine/ir/json.h"
#include "engine/models/model.h"
#include "engine/sweep.h"
#include "validate/fake_device.h"
#include "validate/validation.h"

namespace memest {
namespace {

struct Scenario {
  std::string preset;
  int64_t batch;
  int64_t seq;
  int64_t tensor = 1;  // tensor-parallel ranks, with sequence parallelism when more than 1
};

const Scenario kGpt2Small{"gpt2-small", 8, 1024};
const Scenario kLlama70b{"llama-70b", 1, 4096};
const Scenario kLlama70bTp8{"llama-70b", 1, 4096, 8};

ModelSpec ModelOf(const Scenario& scenario) {
  return ModelSpec{PresetSpec{scenario.preset, {{"seq", scenario.seq}}}};
}

// AdamW under bf16 autocast, at the scenario's batch.
RunConfig ConfigOf(const Scenario& scenario) {
  RunConfig config;
  config.batch_size = scenario.batch;
  config.precision = Precision::kBf16Amp;
  config.optimizer.kind = OptimizerKind::kAdamW;
  config.parallelism.tensor = scenario.tensor;
  config.parallelism.sequence_parallel = scenario.tensor > 1;
  return config;
}

void BM_Estimate(benchmark::State& state, const Scenario& scenario, bool advice) {
  const ModelSpec model = ModelOf(scenario);
  RunConfig config = ConfigOf(scenario);
  config.device = "a100-80gb";
  EstimateOptions options;
  options.advice = advice;

  // Fail loudly rather than time an error path.
  StatusOr<Report> first = Estimate(model, config, options);
  if (!first.ok()) {
    state.SkipWithError(first.status().ToString().c_str());
    return;
  }
  state.counters["ops"] = static_cast<double>(first->op_count);
  state.counters["peak_GiB"] =
      static_cast<double>(first->peak.allocated_bytes) / (1024.0 * 1024.0 * 1024.0);

  for (auto _ : state) {
    StatusOr<Report> report = Estimate(model, config, options);
    benchmark::DoNotOptimize(report);
  }
  state.counters["estimates_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(BM_Estimate, gpt2_small_b8_s1024_adamw_bf16, kGpt2Small, false)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Estimate, gpt2_small_b8_s1024_adamw_bf16_advice, kGpt2Small, true)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Estimate, llama_70b_b1_s4096_adamw_bf16, kLlama70b, false)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Estimate, llama_70b_b1_s4096_adamw_bf16_advice, kLlama70b, true)
    ->Unit(benchmark::kMillisecond);
// One rank of Megatron's tensor parallelism over 8 GPUs: the pass rebuilds the graph.
BENCHMARK_CAPTURE(BM_Estimate, llama_70b_b1_s4096_adamw_bf16_tp8_sp, kLlama70bTp8, false)
    ->Unit(benchmark::kMillisecond);

// Depth: llama-7b (seq 4096, batch 1, bf16 autocast, AdamW) with state.range(0) layers,
// without checkpointing (range(1) 0) or checkpointing every block (1). The cost must stay
// linear in the layers: the counter ns_per_layer should not grow with them.
void BM_Depth(benchmark::State& state) {
  const int64_t layers = state.range(0);
  const ModelSpec model{PresetSpec{"llama-7b", {{"seq", 4096}, {"layers", layers}}}};
  RunConfig config = ConfigOf(kLlama70b);
  config.device = "h100-80gb";
  if (state.range(1) != 0) config.checkpoint.policy = CheckpointPolicy::kEveryBlock;
  EstimateOptions options;
  options.advice = false;
  for (auto _ : state) {
    StatusOr<Report> report = Estimate(model, config, options);
    if (!report.ok()) {
      state.SkipWithError(report.status().ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(report);
  }
  state.counters["ns_per_layer"] =
      benchmark::Counter(static_cast<double>(state.iterations() * layers),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_Depth)->ArgsProduct({{100, 1000}, {0, 1}})->Unit(benchmark::kMillisecond);

// The preset served by vLLM on H100s, `tensor` of them (config.serving, vLLM's defaults: 1024
// requests of 8 tokens in the profile run).
// A scheduler's sweep of GPT-2 small at seq 1024 under bf16 autocast without advice (the grid of
// grpc_bench --sweep): micro-batches 1, 2, 4 and 8, the A100 80GB, the H100 80GB and the L4,
// AdamW, SGD with momentum and Adam, no checkpointing or every block: 96 configurations of 12
// graphs, each configuration Estimate()'s answer. `shared`: through SweepEstimator, which
// builds each graph once; otherwise Estimate() one by one.
void BM_Sweep(benchmark::State& state, bool shared) {
  const ModelSpec model = ModelOf(kGpt2Small);
  const char* devices[] = {"a100-80gb", "h100-80gb", "l4"};
  const OptimizerKind optimizers[] = {OptimizerKind::kAdamW, OptimizerKind::kSgdMomentum,
                                      OptimizerKind::kAdam};
  std::vector<RunConfig> configs;
  for (int k = 0; k < 96; ++k) {
    RunConfig c = ConfigOf(kGpt2Small);
    c.batch_size = int64_t{1} << (k / 24);
    c.device = devices[k / 8 % 3];
    c.optimizer.kind = optimizers[k / 2 % 3];
    c.checkpoint.policy = k % 2 == 0 ? CheckpointPolicy::kNone : CheckpointPolicy::kEveryBlock;
    configs.push_back(c);
  }
  EstimateOptions options;
  options.advice = false;
  int64_t estimates = 0;
  for (auto _ : state) {
    SweepEstimator sweep(model, options);
    for (const RunConfig& c : configs) {
      StatusOr<Report> r = shared ? sweep.Estimate(c, nullptr) : Estimate(model, c, options);
      if (!r.ok()) {
        state.SkipWithError(r.status().ToString().c_str());
        return;
      }
      benchmark::DoNotOptimize(r->peak.allocated_bytes);
      ++estimates;
    }
  }
  state.counters["estimates_per_s"] =
      benchmark::Counter(static_cast<double>(estimates), benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_Sweep, gpt2_small_96_configs_shared_graphs, true)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Sweep, gpt2_small_96_configs_one_by_one, false)
    ->Unit(benchmark::kMillisecond);

void BM_Serve(benchmark::State& state, const std::string& preset, int64_t tensor) {
  const ModelSpec model{PresetSpec{preset, {}}};
  RunConfig config;
  config.mode = Mode::kInference;
  config.precision = Precision::kBf16Pure;
  config.device = "h100-80gb";
  config.parallelism.tensor = tensor;
  config.serving.enabled = true;
  StatusOr<Report> first = Estimate(model, config);
  if (!first.ok()) {
    state.SkipWithError(first.status().ToString().c_str());
    return;
  }
  state.counters["kv_tokens"] = static_cast<double>(first->serving->kv_tokens);
  for (auto _ : state) {
    StatusOr<Report> report = Estimate(model, config);
    benchmark::DoNotOptimize(report);
  }
}

BENCHMARK_CAPTURE(BM_Serve, llama_7b_h100, std::string("llama-7b"), int64_t{1})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Serve, llama_70b_h100_tp4, std::string("llama-70b"), int64_t{4})
    ->Unit(benchmark::kMillisecond);

// Mixtral-8x7B (tests/data/hf_configs/mixtral-8x7b.json's sizes) at 4,096 tokens.
ModelSpec Mixtral8x7b() {
  JsonValue config;
  config.kind = JsonValue::Kind::kObject;
  auto add = [&](const char* key, JsonValue v) {
    config.keys.push_back(key);
    config.items.push_back(std::move(v));
  };
  JsonValue type;
  type.kind = JsonValue::Kind::kString;
  type.text = "mixtral";
  add("model_type", type);
  const std::pair<const char*, double> numbers[] = {
      {"hidden_size", 4096},        {"intermediate_size", 14336}, {"num_hidden_layers", 32},
      {"num_attention_heads", 32},  {"num_key_value_heads", 8},   {"vocab_size", 32000},
      {"num_local_experts", 8},     {"num_experts_per_tok", 2},   {"rms_norm_eps", 1e-5}};
  for (const auto& [key, value] : numbers) {
    JsonValue v;
    v.kind = JsonValue::Kind::kNumber;
    v.number = value;
    add(key, v);
  }
  return ModelSpec{HfConfigSpec{config, 4096}};
}

// Megatron-LM training Mixtral-8x7B over 8 data ranks, its experts over `expert` of them.
void BM_ExpertParallel(benchmark::State& state, int64_t expert) {
  const ModelSpec model = Mixtral8x7b();
  RunConfig config;
  config.precision = Precision::kBf16Pure;
  config.optimizer.kind = OptimizerKind::kAdamW;
  config.device = "h100-80gb";
  config.checkpoint.policy = CheckpointPolicy::kEveryBlock;
  config.parallelism.data = 8;
  config.parallelism.sharding = DataSharding::kMegatronDistOpt;
  config.parallelism.expert = expert;
  EstimateOptions options;
  options.advice = false;
  StatusOr<Report> first = Estimate(model, config, options);
  if (!first.ok()) {
    state.SkipWithError(first.status().ToString().c_str());
    return;
  }
  state.counters["ops"] = static_cast<double>(first->op_count);
  for (auto _ : state) {
    StatusOr<Report> report = Estimate(model, config, options);
    benchmark::DoNotOptimize(report);
  }
}

BENCHMARK_CAPTURE(BM_ExpertParallel, mixtral_8x7b_dp8_ep1, int64_t{1})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ExpertParallel, mixtral_8x7b_dp8_ep8, int64_t{8})->Unit(benchmark::kMillisecond);

void BM_ValidateHostSide(benchmark::State& state, const Scenario& scenario) {
  const ModelSpec model = ModelOf(scenario);
  const RunConfig config = ConfigOf(scenario);
  validate::ValidateOptions options;
  options.repeats = 1;
  int64_t ops = 0;
  for (auto _ : state) {
    validate::FakeDevice device;  // 80 GiB, bookkeeping only
    StatusOr<validate::Validation> v = validate::Validate(model, config, device, options);
    if (!v.ok()) {
      state.SkipWithError(v.status().ToString().c_str());
      return;
    }
    ops = static_cast<int64_t>(v->ops.size());
    benchmark::DoNotOptimize(v);
  }
  state.counters["ops_replayed"] = static_cast<double>(ops);
}

BENCHMARK_CAPTURE(BM_ValidateHostSide, gpt2_small_b8_s1024_adamw_bf16, kGpt2Small)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace memest

BENCHMARK_MAIN();
