// Plans with CPU offload (engine/plan/plan_space.h, OffloadsOf): tried only at GPU counts where
// nothing fits on the GPUs alone, and only within the host memory the query allows; each plan
// is its estimate, host memory included.
#include <gtest/gtest.h>

#include <vector>

#include "engine/estimator.h"
#include "engine/plan/plan_space.h"
#include "engine/plan/planner.h"

namespace memest {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// Llama-7B's bf16 model states (50 GiB) on 24 GB cards: nothing fits on 1 or 2 of them.
PlanQuery Llama7bOn4090(int64_t host_bytes_per_gpu) {
  PlanQuery q;
  q.model.source = PresetSpec{"llama-7b", {{"seq", 1024}}};
  q.run.batch_size = 16;
  q.run.precision = Precision::kBf16Pure;
  q.devices = {"rtx-4090"};
  q.max_gpus = 2;
  q.max_plans = 50;
  q.host_bytes_per_gpu = host_bytes_per_gpu;
  return q;
}

std::vector<Plan> Plans(const PlanQuery& q) {
  std::vector<Plan> out;
  const Status s = PlanJob(q, nullptr, [&](const Plan& p) {
    out.push_back(p);
    return true;
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

TEST(PlannerOffloadTest, WithoutHostMemoryNothingFits) {
  EXPECT_TRUE(Plans(Llama7bOn4090(0)).empty());
}

// With 256 GiB of host memory per GPU, one 24 GB card fits Llama-7B with ZeRO-3's parameter
// and optimizer offload; every plan re-estimates to its bytes and stays within the host budget.
TEST(PlannerOffloadTest, OffloadFitsWhereTheGpusAloneDoNot) {
  const PlanQuery q = Llama7bOn4090(256 * kGiB);
  const std::vector<Plan> plans = Plans(q);
  ASSERT_FALSE(plans.empty());
  EXPECT_EQ(plans.front().gpus, 1);
  bool param = false;
  for (const Plan& p : plans) {
    const ParallelismConfig& par = p.parallelism;
    EXPECT_TRUE(par.offload_optimizer || par.fsdp_cpu_offload);
    param |= par.offload_param;
    EXPECT_GT(p.host_bytes, 0);
    EXPECT_LE(p.host_bytes, q.host_bytes_per_gpu);
    EXPECT_GT(p.host_transfer_bytes, 0);
    RunConfig c = q.run;
    c.batch_size = q.run.batch_size / par.data;
    c.grad_accum_steps = p.grad_accum_steps;
    c.device = p.device;
    c.checkpoint.policy = p.checkpoint;
    c.parallelism = par;
    const Report r = Estimate(q.model, c).value();
    EXPECT_EQ(r.fit->required_bytes, p.required_bytes);
    EXPECT_EQ(r.data_parallel->host_bytes, p.host_bytes);
  }
  EXPECT_TRUE(param);
  for (size_t k = 1; k < plans.size(); ++k) EXPECT_LE(plans[k - 1].gpus, plans[k].gpus);
}

// A host budget below what any offload takes leaves nothing.
TEST(PlannerOffloadTest, TheHostBudgetBounds) {
  EXPECT_TRUE(Plans(Llama7bOn4090(8 * kGiB)).empty());
  PlanQuery bad = Llama7bOn4090(-1);
  const Status s = PlanJob(bad, nullptr, [](const Plan&) { return true; });
  EXPECT_NE(s.message().find("host_memory_per_gpu_bytes"), std::string::npos) << s.ToString();
}

// The transfer cost, by strategy (docs/planning.md): 1 GiB of parameters and of gradients on
// one GPU, over 2 data ranks, 4 micro-batches.
TEST(PlannerOffloadTest, HostTransferBytesCountEachCopy) {
  const States s{kGiB, kGiB, 0};
  const int64_t half = kGiB / 2;
  EXPECT_EQ(HostTransferBytes(s, DataSharding::kFsdp2, Offload{false, false, true}, 2, 1, 1, 4),
            4 * (2 * half + half));
  EXPECT_EQ(HostTransferBytes(s, DataSharding::kDeepSpeedZero3, Offload{true, true, false}, 2,
                              1, 1, 4),
            4 * 4 * half);
  EXPECT_EQ(HostTransferBytes(s, DataSharding::kDeepSpeedZero3, Offload{true, false, false}, 2,
                              1, 1, 4),
            4 * 2 * half + half);
  EXPECT_EQ(HostTransferBytes(s, DataSharding::kDeepSpeedZero2, Offload{true, false, false}, 2,
                              1, 1, 4),
            4 * half + half);
}

}  // namespace
}  // namespace memest
