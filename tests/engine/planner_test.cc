// Plans that fit (engine/plan/planner.h): every plan emitted is an estimate that fits, re-run
// to the byte; the fewest GPUs come first; pruning keeps the counts that cannot fit out; the
// query's nonsense is refused naming the field.
#include "engine/plan/planner.h"

#include <gtest/gtest.h>

#include <vector>

#include "engine/estimator.h"
#include "tests/engine/hf_json.h"

namespace memest {
namespace {

PlanQuery Llama7b(const char* device, int64_t max_gpus) {
  PlanQuery q;
  q.model.source = PresetSpec{"llama-7b", {{"seq", 1024}}};
  q.run.batch_size = 16;  // the global batch
  q.run.precision = Precision::kBf16Pure;
  q.devices = {device};
  q.max_gpus = max_gpus;
  q.max_plans = 6;
  return q;
}

// The run a plan describes, for Estimate: one data-parallel rank's share of the global batch.
RunConfig ConfigOf(const PlanQuery& q, const Plan& p) {
  RunConfig c = q.run;
  c.batch_size = q.run.batch_size / p.parallelism.data;
  c.grad_accum_steps = p.grad_accum_steps;
  c.device = p.device;
  c.checkpoint.policy = p.checkpoint;
  c.parallelism = p.parallelism;
  return c;
}

std::vector<Plan> Plans(const PlanQuery& q, PlanStats* stats = nullptr) {
  std::vector<Plan> out;
  Budget unlimited;
  const Status s = PlanJob(q, &unlimited, [&](const Plan& p) {
    out.push_back(p);
    return true;
  }, stats);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

// Llama-7B's bf16 model states (2 + 2 + 4 bytes per parameter, 50 GiB) do not fit one 40 GB
// A100: the plans start where sharding makes them fit, and each is what Estimate says.
TEST(PlannerTest, PlansFitAndAreTheirEstimates) {
  PlanStats stats;
  const PlanQuery q = Llama7b("a100-40gb", 64);
  const std::vector<Plan> plans = Plans(q, &stats);
  ASSERT_FALSE(plans.empty());
  EXPECT_GE(plans.size(), 6u);
  EXPECT_GT(plans.front().gpus, 1);
  EXPECT_EQ(stats.skipped_counts, 1);  // one GPU: the model states alone do not fit
  for (size_t k = 1; k < plans.size(); ++k) EXPECT_LE(plans[k - 1].gpus, plans[k].gpus);
  bool tensor = false;
  for (const Plan& p : plans) {
    EXPECT_GE(p.headroom_bytes, 0);
    EXPECT_EQ(p.gpus, p.parallelism.data * p.parallelism.tensor * p.parallelism.pipeline);
    EXPECT_EQ(p.parallelism.sequence_parallel, p.parallelism.tensor > 1);
    tensor |= p.parallelism.tensor > 1;
    EXPECT_EQ(16 / p.parallelism.data, p.micro_batch * p.grad_accum_steps);
    const Report r = Estimate(q.model, ConfigOf(q, p), {1'000'000, false}).value();
    ASSERT_TRUE(r.fit.has_value());
    EXPECT_TRUE(r.fit->fits);
    EXPECT_EQ(r.fit->required_bytes, p.required_bytes);
    EXPECT_EQ(p.recompute_fraction > 0, p.checkpoint != CheckpointPolicy::kNone);
    if (p.parallelism.data > 1) EXPECT_GT(p.communicated_bytes, 0);
  }
  EXPECT_TRUE(tensor);  // Megatron's split is among the plans
}

// A 1F1B pipeline with a large bubble is also tried interleaved (Megatron's virtual stages, two
// model chunks a stage, the micro-batches a multiple of the stages): its bubble is (p - 1) / v
// of a micro-batch's time against m of work, and it is what Estimate says.
TEST(PlannerTest, BigBubblesAreTriedInterleaved) {
  PlanQuery q = Llama7b("a100-40gb", 2);
  q.run.batch_size = 32;
  q.max_plans = 100;
  const Plan* inter = nullptr;
  const std::vector<Plan> plans = Plans(q);
  for (const Plan& p : plans) {
    if (p.parallelism.pipeline_virtual_stages == 2) inter = &p;
  }
  ASSERT_NE(inter, nullptr);
  const int64_t stages = inter->parallelism.pipeline;
  const double m = static_cast<double>(inter->grad_accum_steps);
  EXPECT_EQ(inter->grad_accum_steps % stages, 0);
  EXPECT_DOUBLE_EQ(inter->bubble_fraction, (stages - 1) / 2.0 / (m + (stages - 1) / 2.0));
  const Report r = Estimate(q.model, ConfigOf(q, *inter), {1'000'000, false}).value();
  EXPECT_EQ(r.fit->required_bytes, inter->required_bytes);
}

// Tensor-parallel groups stay within a node: with 2 GPUs per node no plan splits over 4 or 8, and
// the plans' figures count the NCCL buffers of their groups as laid out on such nodes.
TEST(PlannerTest, TensorGroupsStayWithinANode) {
  PlanQuery q = Llama7b("a100-40gb", 16);
  q.run.parallelism.gpus_per_node = 2;
  const std::vector<Plan> plans = Plans(q);
  ASSERT_FALSE(plans.empty());
  bool tensor = false;
  for (const Plan& p : plans) {
    EXPECT_LE(p.parallelism.tensor, 2);
    EXPECT_EQ(p.parallelism.gpus_per_node, 2);
    tensor |= p.parallelism.tensor == 2;
  }
  EXPECT_TRUE(tensor);
}

// With DTensor's layers (torchtitan) the tensor-parallel plans run over FSDP2 or no
// data-parallel strategy, each its estimate with those layers; plans without tensor
// parallelism are found as before.
TEST(PlannerTest, DTensorLayersPlanWithFsdp2) {
  PlanQuery q = Llama7b("a100-40gb", 4);
  q.run.parallelism.tensor_layers = TensorParallelLayers::kDTensor;
  q.max_plans = 100;
  const std::vector<Plan> plans = Plans(q);
  bool tensor = false, plain = false;
  for (const Plan& p : plans) {
    if (p.parallelism.tensor == 1) {
      plain = true;
      continue;
    }
    tensor = true;
    EXPECT_EQ(p.parallelism.tensor_layers, TensorParallelLayers::kDTensor);
    EXPECT_TRUE(p.parallelism.sharding == DataSharding::kFsdp2 ||
                p.parallelism.sharding == DataSharding::kNone)
        << DataShardingName(p.parallelism.sharding);
    StatusOr<Report> r = Estimate(q.model, ConfigOf(q, p), {});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->fit->required_bytes, p.required_bytes);
  }
  EXPECT_TRUE(tensor);
  EXPECT_TRUE(plain);
}

// FSDP's data ranks spanning nodes are also tried as hybrid sharding within a node (the shard
// group a node's data ranks); each such plan is its estimate.
TEST(PlannerTest, HybridShardingWithinANode) {
  PlanQuery q;
  q.model.source = PresetSpec{"gpt2-small", {{"seq", 256}, {"layers", 4}}};
  q.run.batch_size = 8;
  q.run.parallelism.gpus_per_node = 2;
  q.devices = {"t4"};
  q.max_gpus = 4;
  q.max_plans = 1000;
  bool hybrid = false;
  for (const Plan& p : Plans(q)) {
    const ParallelismConfig& par = p.parallelism;
    if (par.data_shard == 0) continue;
    hybrid = true;
    EXPECT_TRUE(par.sharding == DataSharding::kFsdp1 || par.sharding == DataSharding::kFsdp2);
    EXPECT_EQ(par.data_shard, 2 / par.tensor);  // a node of 2 GPUs
    EXPECT_GT(par.data, par.data_shard);
    const Report r = Estimate(q.model, ConfigOf(q, p)).value();
    EXPECT_EQ(r.fit->required_bytes, p.required_bytes);
  }
  EXPECT_TRUE(hybrid);
}

// Context parallelism where nothing else splits a count: one head (no tensor parallelism),
// two blocks, a batch of one; 4 GPUs take only ring attention over 4 (or 2 x 2 stages).
TEST(PlannerTest, ContextParallelWhereNothingElseFits) {
  PlanQuery q;
  q.model.source = PresetSpec{"llama-7b", {{"seq", 262144}, {"layers", 2}, {"heads", 1},
                                           {"kv_heads", 1}, {"d_model", 1024}, {"ffn", 2048},
                                           {"vocab", 1024}}};
  q.run.batch_size = 1;
  q.run.precision = Precision::kBf16Pure;
  q.devices = {"l4"};
  q.max_gpus = 4;
  q.max_plans = 1000;
  bool context = false;
  for (const Plan& p : Plans(q)) {
    const ParallelismConfig& par = p.parallelism;
    EXPECT_EQ(p.gpus, par.data * par.tensor * par.context * par.pipeline);
    if (par.context == 1) continue;
    context = true;
    EXPECT_EQ(p.gpus, 4);  // 1 and 2 GPUs have plans without it
    const Report r = Estimate(q.model, ConfigOf(q, p)).value();
    EXPECT_EQ(r.fit->required_bytes, p.required_bytes);
  }
  EXPECT_TRUE(context);
}

// A model that fits one GPU is planned on one GPU first, without recomputation first; the
// search stops at the count where enough plans fit.
TEST(PlannerTest, OneGpuFirstAndStopsWhenEnoughFit) {
  PlanQuery q;
  q.model.source = PresetSpec{"gpt2-small", {{"seq", 256}}};
  q.run.batch_size = 8;
  q.devices = {"h100-80gb"};
  q.max_gpus = 1024;
  q.max_plans = 1;
  const std::vector<Plan> plans = Plans(q);
  ASSERT_EQ(plans.size(), 1u);  // one GPU, no checkpointing (with it, the second plan)
  EXPECT_EQ(plans[0].gpus, 1);
  EXPECT_EQ(plans[0].checkpoint, CheckpointPolicy::kNone);
  EXPECT_EQ(plans[0].micro_batch, 8);  // the whole batch at once
  EXPECT_EQ(plans[0].communicated_bytes, 0);
}

// Several GPU types: for each count the smallest that fits comes first; "all" is the catalog.
TEST(PlannerTest, TheSmallestGpuTypeThatFitsComesFirst) {
  PlanQuery q;
  q.model.source = PresetSpec{"gpt2-medium", {{"seq", 512}}};
  q.run.batch_size = 8;
  q.devices = {"h100-80gb", "t4"};
  q.max_gpus = 1;
  const std::vector<Plan> plans = Plans(q);
  ASSERT_FALSE(plans.empty());
  EXPECT_EQ(plans.front().device, "t4");  // 16 GB is enough for GPT-2 medium at this batch
  q.devices = {"all"};
  q.max_plans = 100;
  const std::vector<Plan> all = Plans(q);
  ASSERT_FALSE(all.empty());
  for (size_t k = 1; k < all.size(); ++k) {
    EXPECT_LE(all[k - 1].capacity_bytes, all[k].capacity_bytes);  // one GPU count here
  }
}

TEST(PlannerTest, QueriesThatMakeNoSenseAreRefused) {
  Budget b;
  auto refusal = [&](const PlanQuery& q) {
    return PlanJob(q, &b, [](const Plan&) { return true; }).message();
  };
  PlanQuery q = Llama7b("a100-40gb", 8);
  q.max_gpus = 0;
  EXPECT_NE(refusal(q).find("max_gpus"), std::string::npos);
  q = Llama7b("a100-40gb", 8);
  q.run.grad_accum_steps = 4;
  EXPECT_NE(refusal(q).find("config.grad_accum_steps"), std::string::npos);
  q = Llama7b("a100-40gb", 8);
  q.run.parallelism.pipeline = 2;
  EXPECT_NE(refusal(q).find("config.parallelism"), std::string::npos);
  q = Llama7b("no-such-gpu", 8);
  EXPECT_NE(refusal(q).find("devices"), std::string::npos);
  q = Llama7b("a100-40gb", 8);
  q.devices.clear();
  EXPECT_NE(refusal(q).find("devices"), std::string::npos);
}

// The caller's deadline stops the search with its status.
TEST(PlannerTest, HonoursTheDeadline) {
  Budget past;
  past.set_deadline(Budget::Clock::now() - std::chrono::seconds(1));
  const Status s = PlanJob(Llama7b("a100-40gb", 64), &past, [](const Plan&) { return true; });
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
}

// A search the op-step budget stops mid-count still hands on what it found to fit there, each a
// real plan, and says why it stopped.
TEST(PlannerTest, ABudgetSpentMidCountEmitsWhatFits) {
  PlanQuery q;
  q.model.source = PresetSpec{"gpt2-small", {{"seq", 256}}};
  q.run.batch_size = 8;
  q.devices = {"h100-80gb"};
  q.max_gpus = 8;
  q.max_plans = 50;
  Budget unlimited;
  PlanStats all;
  std::vector<Plan> every;
  ASSERT_TRUE(PlanJob(q, &unlimited, [&](const Plan& p) { every.push_back(p); return true; }, &all).ok());
  ASSERT_GT(every.size(), 2u);
  // A budget that runs out just before the first count, one GPU, is searched to its end.
  PlanQuery one = q;
  one.max_gpus = 1;
  Budget counted;
  ASSERT_TRUE(PlanJob(one, &counted, [](const Plan&) { return true; }).ok());
  Budget tight;
  tight.set_max_op_steps(counted.spent() - 1);
  std::vector<Plan> got;
  const Status s = PlanJob(q, &tight, [&](const Plan& p) { got.push_back(p); return true; });
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  ASSERT_FALSE(got.empty());
  for (const Plan& p : got) EXPECT_GE(p.headroom_bytes, 0);
  EXPECT_LT(got.size(), every.size());
}

// A mixture-of-experts config: Megatron's plans also split the experts over some of the data
// ranks, with or without tensor ranks (and sequence parallelism, which its MoELayer needs with
// them), and each such plan is what Estimate says of it.
TEST(PlannerTest, MixtureOfExpertsPlansSplitTheExperts) {
  PlanQuery q;
  const nlohmann::json config = {
      {"model_type", "mixtral"},  {"hidden_size", 256},        {"num_hidden_layers", 2},
      {"num_attention_heads", 4}, {"num_key_value_heads", 2},  {"intermediate_size", 1024},
      {"vocab_size", 1024},       {"num_local_experts", 8},    {"num_experts_per_tok", 2}};
  q.model.source = HfConfigSpec{enginetest::FromJson(config), 256};
  q.run.batch_size = 8;
  q.run.precision = Precision::kBf16Pure;
  q.devices = {"h100-80gb"};
  q.max_gpus = 8;
  q.max_plans = 1000;
  bool split = false, with_tensor = false;
  for (const Plan& p : Plans(q)) {
    if (p.parallelism.expert == 1) continue;
    split = true;
    with_tensor |= p.parallelism.tensor > 1;
    EXPECT_TRUE(IsMegatron(p.parallelism.sharding));
    EXPECT_EQ(p.parallelism.sequence_parallel, p.parallelism.tensor > 1);
    EXPECT_EQ(p.parallelism.data % p.parallelism.expert, 0);
    StatusOr<Report> r = Estimate(q.model, ConfigOf(q, p), {1'000'000, false});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->expert_parallel.has_value());
    EXPECT_EQ(r->fit->required_bytes, p.required_bytes);
  }
  EXPECT_TRUE(split);
  EXPECT_TRUE(with_tensor);
}

}  // namespace
}  // namespace memest
