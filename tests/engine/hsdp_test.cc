// Hybrid sharding (config.parallelism.data_shard): FSDP1's HYBRID_SHARD and FSDP2 over a 2-D
// (replicate, shard) mesh. A rank holds what FSDP over its shard group holds: the replicas'
// all-reduce of the sharded gradients runs in place (FSDP2's foreach_reduce, FSDP1's
// _reduce_grad). What differs is NCCL's communicators and the bytes communicated.
#include <gtest/gtest.h>

#include "engine/estimator.h"
#include "engine/ir/nccl.h"
#include "engine/passes/data_parallel.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

using enginetest::FsdpStack;
using enginetest::PlainTraining;
using enginetest::WalkRank;

DeviceInfo Device(const char* name) { return FindDevice(name).value(); }

RunConfig Sharded(DataSharding s, int64_t data, int64_t shard) {
  RunConfig c = PlainTraining();
  c.parallelism.data = data;
  c.parallelism.sharding = s;
  c.parallelism.data_shard = shard;
  return c;
}

void ExpectSameSteps(const Liveness& a, const Liveness& b) {
  EXPECT_EQ(a.peak.allocated_bytes, b.peak.allocated_bytes);
  ASSERT_EQ(a.phases.size(), b.phases.size());
  for (size_t k = 0; k < a.phases.size(); ++k) {
    EXPECT_EQ(a.phases[k].allocated_bytes, b.phases[k].allocated_bytes) << k;
    EXPECT_EQ(a.phases[k].by_category, b.phases[k].by_category) << k;
  }
  EXPECT_EQ(a.at_end, b.at_end);
}

// 8 ranks as 2 replicas of 4 shards hold, in every phase, what 4 fully sharded ranks hold; 8
// fully sharded ranks hold less.
TEST(HsdpTest, ARankHoldsWhatItsShardGroupWouldHold) {
  const Graph g = FsdpStack();
  for (DataSharding s : {DataSharding::kFsdp1, DataSharding::kFsdp2}) {
    SCOPED_TRACE(DataShardingName(s));
    const Liveness hybrid = WalkRank(g, Sharded(s, 8, 4));
    ExpectSameSteps(hybrid, WalkRank(g, Sharded(s, 4, 0)));
    const Liveness full = WalkRank(g, Sharded(s, 8, 0));
    EXPECT_LT(full.at_end[static_cast<int>(Category::kParameters)],
              hybrid.at_end[static_cast<int>(Category::kParameters)]);
    // A shard group of every rank is full sharding.
    ExpectSameSteps(WalkRank(g, Sharded(s, 8, 8)), full);
  }
}

// NCCL: the shard group innermost (on the node), the replicas across it; 64 ranks as 8 x 8:
// shard groups of 8 within a node, replicate groups of 8 with one rank per node.
TEST(HsdpTest, ShardAndReplicateGroupsAreCommunicators) {
  ParallelismConfig p;
  p.data = 64;
  p.sharding = DataSharding::kFsdp2;
  p.data_shard = 8;
  const NcclMemory m = NcclMemoryOf(p, Device("h100-80gb")).value();
  ASSERT_EQ(m.communicators.size(), 2u);
  EXPECT_EQ(m.communicators[0].group, "data shard");
  EXPECT_EQ(m.communicators[0].ranks, 8);
  EXPECT_EQ(m.communicators[0].local_ranks, 8);
  EXPECT_EQ(m.communicators[1].group, "data replicate");
  EXPECT_EQ(m.communicators[1].ranks, 8);
  EXPECT_EQ(m.communicators[1].local_ranks, 1);
  p.data_shard = 64;  // one group of every rank: no replicas
  ASSERT_EQ(NcclMemoryOf(p, Device("h100-80gb")).value().communicators.size(), 1u);
  EXPECT_EQ(NcclMemoryOf(p, Device("h100-80gb")).value().communicators[0].group, "data shard");
}

// Per step, within a shard group of s: 2 (s-1)/s of the parameters gathered (forward and
// backward) and (s-1)/s of the gradients reduce-scattered; across r replicas 2 (r-1)/r of the
// sharded gradients all-reduced.
TEST(HsdpTest, CommunicatedBytesAddTheReplicasAllReduce) {
  const Graph g = FsdpStack();
  int64_t params = 0;
  for (const Tensor& t : g.tensors) {
    if (t.role == TensorRole::kParameter) params += Bytes(t.shape, t.dtype);
  }
  const RunConfig c = Sharded(DataSharding::kFsdp2, 8, 4);
  const double expected = 3.0 / 4 * (2 * params + params) + 2.0 * (1.0 / 2) * params / 4;
  EXPECT_NEAR(static_cast<double>(CommunicatedBytesPerStep(g, c)), expected, 1.0);
  // Fully sharded over 8: 7/8 of everything within one group, more than the hybrid's.
  EXPECT_GT(CommunicatedBytesPerStep(g, Sharded(DataSharding::kFsdp2, 8, 0)),
            CommunicatedBytesPerStep(g, c));
}

TEST(HsdpTest, ShardGroupsThatMakeNoSenseAreRefused) {
  struct Case {
    DataSharding sharding;
    int64_t data, shard;
    const char* says;
  };
  for (const Case& k : {Case{DataSharding::kDdp, 8, 4, "an FSDP setting"},
                        Case{DataSharding::kFsdp2, 8, 3, "must divide"},
                        Case{DataSharding::kFsdp2, 8, 16, "must divide"},
                        Case{DataSharding::kFsdp1, 8, -2, "must divide"}}) {
    RunConfig c = Sharded(k.sharding, k.data, k.shard);
    c.runtime = Runtime::kCuda;
    const Status s = ValidateRunConfig(c);
    EXPECT_NE(s.message().find("config.parallelism.data_shard"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(k.says), std::string::npos) << s.message();
  }
}

// An estimate of a preset names the hybrid layout in its notes and counts both groups' NCCL.
TEST(HsdpTest, EstimateNamesTheLayout) {
  ModelSpec model;
  model.source = PresetSpec{"gpt2-small", {{"layers", 2}, {"seq", 128}}};
  RunConfig c;
  c.batch_size = 2;
  c.device = "h100-80gb";
  c.parallelism.data = 16;
  c.parallelism.sharding = DataSharding::kFsdp1;
  c.parallelism.data_shard = 8;
  const Report r = Estimate(model, c).value();
  bool noted = false;
  for (const std::string& n : r.notes) {
    noted |= n.rfind("FSDP1 over 16 ranks, HSDP: sharded within groups of 8, replicated 2", 0) ==
                 0 &&
             n.find("HYBRID_SHARD") != std::string::npos;
  }
  EXPECT_TRUE(noted);
  RunConfig full = c;
  full.parallelism.data = 8;
  full.parallelism.data_shard = 0;
  const Report f = Estimate(model, full).value();
  EXPECT_GT(r.breakdown[static_cast<int>(Category::kNccl)],
            f.breakdown[static_cast<int>(Category::kNccl)]);
  EXPECT_EQ(r.end_of_step[static_cast<int>(Category::kParameters)],
            f.end_of_step[static_cast<int>(Category::kParameters)]);
}

}  // namespace
}  // namespace memest
