// Serving (engine/report/serving.h): vLLM's startup budget and pages, against the startup logs
// of vLLM 0.19.0 on H100-80GB (llm-d-planner's, docs/serving.md "Measured"), its defaults and
// its refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "engine/estimator.h"
#include "engine/passes/fused_moe_workspace.h"
#include "engine/passes/tensor_parallel.h"
#include "tests/engine/hf_json.h"

namespace memest {
namespace {

using enginetest::HfModel;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

RunConfig Served(const std::string& device, double utilization = 0.9) {
  RunConfig c;
  c.mode = Mode::kInference;
  c.precision = Precision::kBf16Pure;
  c.device = device;
  c.serving.enabled = true;
  c.serving.gpu_memory_utilization = utilization;
  return c;
}

ServingReport Serve(const ModelSpec& model, const RunConfig& c) {
  StatusOr<Report> r = Estimate(model, c);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok() || !r->serving) return {};
  return *r->serving;
}

// A startup log of vLLM 0.19.0: `vllm serve MODEL --gpu-memory-utilization 0.95
// --max-model-len 8192 [-tp N] [--kv-cache-dtype fp8]` on H100-80GB (its defaults: 1024
// sequences, 8192 batched tokens). GiB as logged (two decimals); 0: not logged.
struct Logged {
  const char* config;
  int64_t tensor;
  bool fp8;
  double weights_gib;
  double peak_gib;
  int64_t kv_tokens;
};

class VllmLogTest : public testing::TestWithParam<Logged> {};

TEST_P(VllmLogTest, MatchesTheStartupLog) {
  const Logged& l = GetParam();
  RunConfig c = Served("h100-80gb", 0.95);
  c.serving.max_model_len = 8192;
  c.parallelism.tensor = l.tensor;
  if (l.fp8) c.serving.kv_cache_dtype = KvCacheDType::kFp8E4m3;
  const ServingReport s = Serve(HfModel(l.config), c);
  EXPECT_EQ(s.max_num_seqs, 1024);
  EXPECT_EQ(s.max_num_batched_tokens, 8192);
  if (l.weights_gib > 0) EXPECT_NEAR(s.weights_bytes / kGiB, l.weights_gib, 0.05);
  if (l.peak_gib > 0) EXPECT_NEAR(s.activation_peak_bytes / kGiB, l.peak_gib, 0.05);
  // The tokens the KV cache holds: never more than vLLM's by over 0.1%, at most 0.5% fewer.
  const double ratio = static_cast<double>(s.kv_tokens) / static_cast<double>(l.kv_tokens);
  EXPECT_LE(ratio, 1.001) << s.kv_tokens << " tokens, logged " << l.kv_tokens;
  EXPECT_GE(ratio, 0.995) << s.kv_tokens << " tokens, logged " << l.kv_tokens;
  EXPECT_TRUE(s.starts) << s.refusal;
}

INSTANTIATE_TEST_SUITE_P(
    H100, VllmLogTest,
    testing::Values(Logged{"llama-3.1-8b", 1, false, 14.99, 1.89, 476'016},
                    Logged{"llama-3.1-8b", 2, false, 7.51, 1.89, 1'044'688},
                    Logged{"llama-3.1-8b", 4, false, 3.77, 1.89, 2'209'792},
                    Logged{"llama-3.1-8b", 1, true, 14.99, 1.89, 952'032},
                    Logged{"qwen2.5-7b", 1, false, 14.25, 2.21, 1'096'000},
                    Logged{"qwen2.5-7b", 2, false, 0, 0, 2'390'592},
                    Logged{"qwen2.5-7b", 4, false, 0, 0, 5'043'280},
                    Logged{"gemma-2-9b", 1, false, 17.22, 3.65, 168'880},
                    Logged{"qwen3-8b", 1, false, 15.27, 2.21, 418'688},
                    // Mixture-of-experts as vLLM's FusedMoE: one fused_experts op a block, its
                    // workspace held from the first block (engine/passes/fused_moe_workspace.h).
                    Logged{"qwen1.5-moe-a2.7b", 1, false, 26.67, 2.47, 250'304},
                    Logged{"qwen3-30b-a3b", 1, false, 56.88, 2.68, 168'288},
                    Logged{"mixtral-8x7b", 2, false, 43.51, 1.21, 465'936}));

// More ranks than key-value heads: vLLM gives each rank one, each held by t / kv_heads ranks
// (QKVParallelLinear's num_kv_head_replicas). Qwen3-30B-A3B (32 query heads, 4 KV heads of 128)
// on 8 H100s: 4 query heads and 1 KV head a rank, 48 layers x keys and values x 128 x 2 bytes a
// token.
TEST(ServingTest, FewerKvHeadsThanRanksAreReplicated) {
  RunConfig c = Served("h100-80gb", 0.9);
  c.serving.max_model_len = 8192;
  c.parallelism.tensor = 8;
  const ServingReport s = Serve(HfModel("qwen3-30b-a3b"), c);
  EXPECT_EQ(s.kv_bytes_per_token, 48 * 2 * 128 * 2);
  EXPECT_TRUE(s.starts) << s.refusal;
  // Each rank's k_proj holds one head's rows: the weights are an eighth of the model's but the
  // key-value projections, which are a quarter each, and the replicated router and norms.
  c.parallelism.tensor = 4;
  const ServingReport four = Serve(HfModel("qwen3-30b-a3b"), c);
  EXPECT_EQ(four.kv_bytes_per_token, 48 * 2 * 128 * 2);
  EXPECT_LT(s.weights_bytes, four.weights_bytes);
  // Attention written out (repeat_kv) cannot run on one replicated head: refused, not guessed.
  RunConfig eager;
  eager.mode = Mode::kInference;
  eager.precision = Precision::kBf16Pure;
  eager.device = "h100-80gb";
  eager.attention = AttentionImpl::kEager;
  eager.parallelism.tensor = 8;
  StatusOr<Report> r = Estimate(HfModel("qwen3-30b-a3b", 64), eager);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("config.parallelism.tensor", 0), 0u) << r.status().message();
}

// vLLM's FusedMoE workspace for 8192 tokens: max(M k max(N/2, K), M K) + M k max(N, K) values
// of bf16, N the rank's w13 rows.
TEST(ServingTest, FusedMoeWorkspaceIsVllms) {
  RunConfig c;
  c.mode = Mode::kInference;
  c.precision = Precision::kBf16Pure;
  c.batch_size = 1;
  StatusOr<Graph> g = BuildStepGraph(HfModel("qwen3-30b-a3b", 8192), c, 1'000'000, nullptr);
  ASSERT_TRUE(g.ok()) << g.status().message();
  // top 8 of 128 experts of 768: N = 1536, K = 2048.
  StatusOr<FusedMoeWorkspace> w = FindFusedMoeWorkspace(*g);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->bytes, int64_t{2} * (8192 * 8 * 2048) * 2);
  g = BuildStepGraph(HfModel("mixtral-8x7b", 8192), c, 1'000'000, nullptr);
  ASSERT_TRUE(g.ok()) << g.status().message();
  ParallelismConfig two;
  two.tensor = 2;
  StatusOr<TensorParallelView> rank = ShardTensorParallel(*g, two);
  ASSERT_TRUE(rank.ok()) << rank.status().message();
  // top 2 of 8 experts of 14336 split over two ranks: N = 14336, K = 4096.
  w = FindFusedMoeWorkspace(rank->graph);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->bytes, int64_t{2} * (8192 * 2 * 7168) + int64_t{2} * (8192 * 2 * 14336));
  StatusOr<FusedMoeWorkspace> none = FindFusedMoeWorkspace(Graph{});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->bytes, 0);
}


TEST(ServingTest, PagesHoldEveryLayersKeysAndValues) {
  RunConfig c = Served("h100-80gb", 0.95);
  c.serving.max_model_len = 8192;
  const ServingReport s = Serve(HfModel("llama-3.1-8b"), c);
  // 32 layers x (8 KV heads x 128 dims) x 2 (keys, values) x 2 bytes.
  EXPECT_EQ(s.kv_bytes_per_token, 32 * 8 * 128 * 2 * 2);
  EXPECT_EQ(s.kv_layers, 32);
  EXPECT_EQ(s.kv_cache_dtype, "bfloat16");
  EXPECT_EQ(s.num_blocks, s.kv_cache_bytes / (16 * s.kv_bytes_per_token));
  EXPECT_EQ(s.kv_tokens, s.num_blocks * 16);
  EXPECT_DOUBLE_EQ(s.max_concurrency, static_cast<double>(s.num_blocks) / 512);
  EXPECT_EQ(s.kv_cache_bytes,
            s.requested_bytes - s.weights_bytes - s.activation_peak_bytes - s.non_torch_bytes);
  EXPECT_EQ(s.requested_bytes, static_cast<int64_t>(std::floor(85'031'714'816 * 0.95)));
  // Requests of max_model_len: the null block aside, the pool's blocks over 512 a request.
  EXPECT_EQ(s.request_tokens, 8192);
  EXPECT_EQ(s.concurrent_requests, (s.num_blocks - 1) / 512);
}

TEST(ServingTest, AnswersConcurrencyAndLongestRequest) {
  RunConfig c = Served("h100-80gb");
  c.serving.max_model_len = 32768;
  c.serving.request_tokens = 2000;  // 125 blocks of 16
  c.serving.concurrency = 64;
  const ServingReport s = Serve(HfModel("llama-3.1-8b"), c);
  ASSERT_GT(s.num_blocks, 0);
  EXPECT_EQ(s.concurrent_requests, std::min<int64_t>(1024, (s.num_blocks - 1) / 125));
  EXPECT_EQ(s.longest_request, std::min<int64_t>(32768, (s.num_blocks - 1) / 64 * 16));
  EXPECT_EQ(s.longest_single_request, 32768);
  // Short requests: the scheduler's max_num_seqs bounds them, not the cache.
  c.serving.request_tokens = 16;
  EXPECT_EQ(Serve(HfModel("llama-3.1-8b"), c).concurrent_requests, 1024);
}

TEST(ServingTest, Fp8PagesHoldTwiceTheTokens) {
  RunConfig c = Served("h100-80gb");
  c.serving.max_model_len = 8192;
  const ServingReport bf16 = Serve(HfModel("qwen2.5-7b"), c);
  c.serving.kv_cache_dtype = KvCacheDType::kFp8E5m2;
  const ServingReport fp8 = Serve(HfModel("qwen2.5-7b"), c);
  EXPECT_EQ(fp8.kv_cache_dtype, "fp8_e5m2");
  EXPECT_EQ(fp8.kv_cache_bytes, bf16.kv_cache_bytes);  // the profile does not change
  EXPECT_EQ(fp8.kv_bytes_per_token * 2, bf16.kv_bytes_per_token);
  EXPECT_NEAR(static_cast<double>(fp8.kv_tokens) / static_cast<double>(bf16.kv_tokens), 2.0,
              1e-3);
}

TEST(ServingTest, DefaultsFollowTheGpu) {
  // vllm serve: 1024 sequences and 8192 tokens on a GPU of 70 GiB or more that is not an A100;
  // 256 and 2048 elsewhere. max_model_len: the config's context (Llama 3.1: 131072, rope type
  // llama3 not scaled).
  const ServingReport h100 = Serve(HfModel("llama-3.1-8b"), Served("h100-80gb"));
  EXPECT_EQ(h100.max_num_seqs, 1024);
  EXPECT_EQ(h100.max_num_batched_tokens, 8192);
  EXPECT_EQ(h100.max_model_len, 131072);
  EXPECT_EQ(h100.profile_requests, 1024);
  EXPECT_DOUBLE_EQ(h100.gpu_memory_utilization, 0.9);
  EXPECT_EQ(h100.block_size, 16);
  const ServingReport a100 = Serve(HfModel("llama-3.1-8b"), Served("a100-80gb"));
  EXPECT_EQ(a100.max_num_seqs, 256);
  EXPECT_EQ(a100.max_num_batched_tokens, 2048);
  // Fewer sampled requests: a smaller profile peak.
  EXPECT_LT(a100.activation_peak_bytes, h100.activation_peak_bytes);
}

TEST(ServingTest, ALongContextThatDoesNotFitIsRefusedAsVllmRefusesIt) {
  // Llama 3.1 8B on a 24 GB L4 at its full 131072-token context: 16 GB of KV cache needed.
  StatusOr<Report> r = Estimate(HfModel("llama-3.1-8b"), Served("l4"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ServingReport& s = *r->serving;
  EXPECT_FALSE(s.starts);
  EXPECT_NE(s.refusal.find("To serve at least one request"), std::string::npos) << s.refusal;
  EXPECT_LT(s.longest_single_request, 131072);
  EXPECT_GT(s.longest_single_request, 0);
  ASSERT_TRUE(r->fit.has_value());
  EXPECT_FALSE(r->fit->fits);
  // At the length it names, it starts.
  RunConfig c = Served("l4");
  c.serving.max_model_len = s.longest_single_request;
  EXPECT_TRUE(Serve(HfModel("llama-3.1-8b"), c).starts);
}

TEST(ServingTest, SaysWhenTheRestOfTheGpuCannotHoldCudaGraphs) {
  auto warns = [](double utilization) {
    RunConfig c = Served("h100-80gb", utilization);
    c.serving.max_model_len = 8192;
    StatusOr<Report> r = Estimate(HfModel("llama-3.1-8b"), c);
    EXPECT_TRUE(r.ok() && r->serving->starts);
    bool note = false;
    for (const std::string& n : r->notes) note |= n.find("CUDA graphs vLLM 0.19.0") != n.npos;
    return note;
  };
  EXPECT_FALSE(warns(0.9));  // 7.4 GiB left
  EXPECT_TRUE(warns(0.99));  // 0.3 GiB left
}

TEST(ServingTest, NoRoomForTheCacheIsRefused) {
  const ServingReport s = Serve(HfModel("llama-3.1-8b"), Served("h100-80gb", 0.15));
  EXPECT_FALSE(s.starts);
  EXPECT_LT(s.kv_cache_bytes, 0);
  EXPECT_EQ(s.num_blocks, 0);
  EXPECT_NE(s.refusal.find("No available memory for the cache blocks"), std::string::npos);
}

TEST(ServingTest, SlidingWindowLayersAreGroupedAsVllmGroupsThem) {
  // Gemma 3 1B: 26 layers, every sixth global (4) and the rest a 512-token window (22). vLLM's
  // hybrid manager: groups of 4 layers, the windowed ones padded to 6 groups (2 padding
  // layers), 7 groups drawing from one pool of blocks of 4 pages each.
  RunConfig c = Served("h100-80gb");
  c.serving.max_model_len = 32768;
  const ServingReport s = Serve(HfModel("gemma-3-1b-it"), c);
  EXPECT_EQ(s.kv_layers, 26);
  const int64_t page = 16 * s.kv_bytes_per_token / 26;  // every layer alike: 1 KV head of 256
  EXPECT_EQ(s.num_blocks, s.kv_cache_bytes / (4 * page));
  EXPECT_EQ(s.kv_tokens, s.num_blocks / 7 * 16);
  // A request of 32768 tokens: 2048 blocks in the global group, ceil((512 - 1 + 8192) / 16) + 1
  // = 545 in each windowed one (the window and a step's batched tokens).
  EXPECT_DOUBLE_EQ(s.max_concurrency, static_cast<double>(s.num_blocks) / (2048 + 6 * 545));
  // Gemma 3's context is its max_position_embeddings: vLLM does not scale it by rope_scaling.
  RunConfig d = Served("h100-80gb");
  const ServingReport four = Serve(HfModel("gemma-3-4b-text"), d);
  EXPECT_EQ(four.max_model_len, 131072);
  // Its weights: 3,880,263,168 parameters in bf16, and two rotary caches of head_dim 256 in
  // bf16: the global layers' for 131072 x 8 positions (linear rope scaling), the local ones'
  // for 131072.
  const int64_t expected = 3'880'263'168LL * 2 + (1'048'576LL + 131'072LL) * 256 * 2;
  EXPECT_NEAR(static_cast<double>(four.weights_bytes), static_cast<double>(expected), 1 << 20);
}

TEST(ServingTest, DefaultBatchedTokensStopAtWhatTheRequestsCanHold) {
  // vLLM 0.19: the default max_num_batched_tokens at most max_num_seqs * max_model_len.
  RunConfig c = Served("h100-80gb");
  c.serving.max_num_seqs = 1;
  c.serving.max_model_len = 2048;
  const ServingReport s = Serve(HfModel("llama-3.1-8b"), c);
  EXPECT_EQ(s.max_num_batched_tokens, 2048);
  EXPECT_EQ(s.profile_requests, 1);
}

TEST(ServingTest, MixtralsExpertsSplitOverTheRanks) {
  RunConfig c = Served("h100-80gb");
  c.serving.max_model_len = 8192;
  const ServingReport one = Serve(HfModel("mixtral-8x7b"), c);
  c.parallelism.tensor = 2;
  const ServingReport two = Serve(HfModel("mixtral-8x7b"), c);
  // 46.7 B parameters in bf16: 87 GiB on one GPU (it does not start), half on each of two.
  EXPECT_FALSE(one.starts);
  EXPECT_NE(one.refusal.find("CUDA out of memory"), std::string::npos) << one.refusal;
  EXPECT_TRUE(two.starts) << two.refusal;
  EXPECT_NEAR(static_cast<double>(two.weights_bytes) / one.weights_bytes, 0.5, 0.01);
}

TEST(ServingTest, APresetServesAtItsContext) {
  ModelSpec m;
  m.source = PresetSpec{"llama-7b", {}};
  const ServingReport s = Serve(m, Served("a100-80gb"));
  EXPECT_EQ(s.max_model_len, 4096);
  EXPECT_EQ(s.kv_bytes_per_token, 32 * 32 * 128 * 2 * 2);
  EXPECT_TRUE(s.starts) << s.refusal;
}

TEST(ServingTest, RefusesWhatVllmDoesNotRunHere) {
  struct Case {
    const char* field;
    void (*edit)(RunConfig*);
  };
  const Case cases[] = {
      {"config.batch_size", [](RunConfig* c) { c->batch_size = 8; }},
      {"config.attention", [](RunConfig* c) { c->attention = AttentionImpl::kEager; }},
      {"config.precision", [](RunConfig* c) { c->precision = Precision::kBf16Amp; }},
      {"config.serving.max_model_len", [](RunConfig* c) { c->serving.max_model_len = 200000; }},
      {"config.serving.max_num_seqs", [](RunConfig* c) { c->serving.max_num_seqs = 9000; }},
      {"config.serving.request_tokens", [](RunConfig* c) { c->serving.request_tokens = 200000; }},
      {"config.serving.concurrency", [](RunConfig* c) { c->serving.concurrency = 5000; }},
      {"config.serving.block_size", [](RunConfig* c) { c->serving.block_size = 24; }},
      {"config.serving.gpu_memory_utilization",
       [](RunConfig* c) { c->serving.gpu_memory_utilization = 1.5; }},
      {"config.serving", [](RunConfig* c) { c->device.clear(); }},
      {"config.mode", [](RunConfig* c) { c->mode = Mode::kTraining; }},
      {"config.generate_tokens", [](RunConfig* c) { c->generate_tokens = 16; }},
      // More ranks than query heads (vLLM: num_heads % tensor_parallel_size).
      {"config.parallelism.tensor", [](RunConfig* c) { c->parallelism.tensor = 64; }},
  };
  for (const Case& k : cases) {
    RunConfig c = Served("h100-80gb");
    k.edit(&c);
    StatusOr<Report> r = Estimate(HfModel("llama-3.1-8b"), c);
    ASSERT_FALSE(r.ok()) << k.field;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << k.field;
    EXPECT_EQ(r.status().message().rfind(k.field, 0), 0u) << r.status().message();
  }
  ModelSpec preset;
  preset.source = PresetSpec{"llama-7b", {{"seq", 0}}};
  StatusOr<Report> zero = Estimate(preset, Served("h100-80gb"));
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().message().rfind("model.preset.params.seq", 0), 0u);
  ModelSpec layers;
  layers.source = LayerModelSpec{{16}, DType::kFloat32, {{"linear", "", {}}}, "sum"};
  StatusOr<Report> r = Estimate(layers, Served("h100-80gb"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("model: a layer list is not served", 0), 0u)
      << r.status().message();
}

}  // namespace
}  // namespace memest
