// NCCL's memory per rank (engine/ir/nccl.h): the communicators a parallel layout creates, each
// one's buffers as NCCL 2.22-2.27 allocates them, and how the estimate counts them.
#include "engine/ir/nccl.h"

#include <gtest/gtest.h>

#include "engine/estimator.h"

namespace memest {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

DeviceInfo Device(const char* name) { return FindDevice(name).value(); }

TEST(NcclTest, OneGpuHasNoCommunicator) {
  const NcclMemory m = NcclMemoryOf(ParallelismConfig{}, Device("h100-80gb")).value();
  EXPECT_TRUE(m.communicators.empty());
  EXPECT_EQ(m.bytes, 0);
}

// Eight data-parallel ranks on one H100 node: 24 ring channels of a 10 MiB receive and a 2 MiB
// send connection, NVLink SHARP's 16 x 2 x 1 MiB per local rank, and at init 2 MiB for each of
// 2 + 3 x 32 channel arrays and 24 + 1 NVLS ones.
TEST(NcclTest, DataParallelOnOneHopperNode) {
  ParallelismConfig p;
  p.data = 8;
  const NcclMemory m = NcclMemoryOf(p, Device("h100-80gb")).value();
  ASSERT_EQ(m.communicators.size(), 1u);
  EXPECT_EQ(m.communicators[0].group, "data");
  EXPECT_EQ(m.communicators[0].local_ranks, 8);
  EXPECT_EQ(m.bytes, 2 * kMiB * (2 + 96 + 25) + 24 * 12 * kMiB + 16 * 2 * kMiB * 8);
  // An A100 node has no NVLink SHARP; two ranks never use it.
  EXPECT_EQ(NcclMemoryOf(p, Device("a100-80gb")).value().bytes, 2 * kMiB * 98 + 24 * 12 * kMiB);
  p.data = 2;
  EXPECT_EQ(NcclMemoryOf(p, Device("h100-80gb")).value().bytes, 2 * kMiB * 98 + 24 * 12 * kMiB);
}

// Across nodes: 16 channels, network connections of 10 MiB each way, a tree besides the ring.
TEST(NcclTest, ACommunicatorAcrossNodes) {
  ParallelismConfig p;
  p.data = 64;
  const NcclMemory m = NcclMemoryOf(p, Device("h100-80gb")).value();
  ASSERT_EQ(m.communicators.size(), 1u);
  EXPECT_EQ(m.communicators[0].local_ranks, 8);
  EXPECT_EQ(m.bytes, 2 * kMiB * (2 + 48) + 2 * 16 * 20 * kMiB);
  p.gpus_per_node = 64;  // the same ranks on one (large) node
  EXPECT_LT(NcclMemoryOf(p, Device("a100-80gb")).value().bytes, m.bytes);
}

// Megatron's order: tensor innermost (one node), data across the tensor groups, pipeline
// outermost. A pipeline stage sends to and receives from two neighbours over the network.
TEST(NcclTest, MegatronLayoutPutsTensorGroupsOnANode) {
  ParallelismConfig p;
  p.tensor = 8;
  p.data = 4;
  p.pipeline = 4;
  const NcclMemory m = NcclMemoryOf(p, Device("h100-80gb")).value();
  ASSERT_EQ(m.communicators.size(), 3u);
  EXPECT_EQ(m.communicators[0].group, "tensor");
  EXPECT_EQ(m.communicators[0].local_ranks, 8);
  EXPECT_EQ(m.communicators[1].group, "data");
  EXPECT_EQ(m.communicators[1].local_ranks, 1);  // stride 8: one rank per node
  EXPECT_EQ(m.communicators[2].group, "pipeline");
  EXPECT_EQ(m.communicators[2].p2p_peers, 2);
  EXPECT_FALSE(m.communicators[2].collectives);
  // Pipeline: init arrays, two peers x 2 channels x 12 MiB, two network pools of 16 x 16 x 128 KiB.
  EXPECT_EQ(m.communicators[2].bytes, 2 * kMiB * 50 + 2 * 2 * 12 * kMiB + 2 * 32 * kMiB);
  EXPECT_EQ(m.bytes, m.communicators[0].bytes + m.communicators[1].bytes + m.communicators[2].bytes);
}

// Megatron-LM's training loop adds the world's communicator (the start-up barrier; the
// distributed optimizer's gradient norm) and, with its plain optimizer, the model-parallel
// group's (tensor x pipeline: the gradient norm).
TEST(NcclTest, MegatronAddsTheWorldAndTheModelParallelGroup) {
  ParallelismConfig p;
  p.tensor = 8;
  p.data = 4;
  p.pipeline = 4;
  const int64_t plain = NcclMemoryOf(p, Device("h100-80gb")).value().bytes;
  p.sharding = DataSharding::kMegatronDistOpt;
  const NcclMemory distopt = NcclMemoryOf(p, Device("h100-80gb")).value();
  ASSERT_EQ(distopt.communicators.size(), 4u);
  const NcclCommunicator& world = distopt.communicators[3];
  EXPECT_EQ(world.group, "world");
  EXPECT_EQ(world.ranks, 128);
  EXPECT_EQ(world.local_ranks, 8);
  // across nodes, as ACommunicatorAcrossNodes: init arrays, a ring and a tree of 16 channels
  EXPECT_EQ(world.bytes, 2 * kMiB * (2 + 48) + 2 * 16 * 20 * kMiB);
  EXPECT_EQ(distopt.bytes, plain + world.bytes);
  p.sharding = DataSharding::kMegatronDdp;
  const NcclMemory ddp = NcclMemoryOf(p, Device("h100-80gb")).value();
  ASSERT_EQ(ddp.communicators.size(), 5u);
  const NcclCommunicator& mp = ddp.communicators[4];
  EXPECT_EQ(mp.group, "model parallel");
  EXPECT_EQ(mp.ranks, 32);
  EXPECT_EQ(mp.local_ranks, 8);  // the tensor group; the stages are 32 ranks apart
  EXPECT_EQ(ddp.bytes, distopt.bytes + mp.bytes);
  // Two tensor ranks of four stages, one data rank: the whole model-parallel group on a node.
  ParallelismConfig small;
  small.tensor = 2;
  small.pipeline = 4;
  small.sharding = DataSharding::kMegatronDdp;
  const NcclMemory on_node = NcclMemoryOf(small, Device("h100-80gb")).value();
  EXPECT_EQ(on_node.communicators.back().group, "model parallel");
  EXPECT_EQ(on_node.communicators.back().local_ranks, 8);
  // One GPU: no communicator at all.
  ParallelismConfig one;
  one.sharding = DataSharding::kMegatronDistOpt;
  EXPECT_TRUE(NcclMemoryOf(one, Device("h100-80gb")).value().communicators.empty());
}

// A tied embedding under Megatron's pipeline: its first and last stages all-reduce the
// weight's gradient over a group of their two ranks (a network pair when the stages are on
// different nodes); GPT-2 ties wte to its head, Llama does not.
TEST(NcclTest, MegatronTiedEmbeddingGroupOfTheEndStages) {
  ParallelismConfig p;
  p.tensor = 8;
  p.data = 4;
  p.pipeline = 4;
  p.sharding = DataSharding::kMegatronDistOpt;
  const NcclMemory plain = NcclMemoryOf(p, Device("h100-80gb")).value();
  const NcclMemory tied = NcclMemoryOf(p, Device("h100-80gb"), true).value();
  ASSERT_EQ(tied.communicators.size(), plain.communicators.size() + 1);
  const NcclCommunicator& e = tied.communicators.back();
  EXPECT_EQ(e.group, "embedding");
  EXPECT_EQ(e.ranks, 2);
  EXPECT_EQ(e.local_ranks, 1);  // the stages are 96 ranks apart
  EXPECT_EQ(e.bytes, 2 * kMiB * (2 + 48) + 2 * 16 * 20 * kMiB);
  p.sharding = DataSharding::kDdp;  // not Megatron's loop: no such group
  EXPECT_EQ(NcclMemoryOf(p, Device("h100-80gb"), true).value().communicators.size(), 3u);

  ModelSpec gpt2, llama;
  gpt2.source = PresetSpec{"gpt2-small", {{"layers", 2}, {"seq", 128}}};
  llama.source = PresetSpec{"llama-7b", {{"layers", 2}, {"seq", 128}}};
  RunConfig c;
  c.batch_size = 4;
  c.grad_accum_steps = 2;
  c.device = "h100-80gb";
  c.precision = Precision::kBf16Pure;
  c.parallelism.pipeline = 2;
  c.parallelism.data = 2;
  c.parallelism.sharding = DataSharding::kMegatronDistOpt;
  const auto nccl = [&](const ModelSpec& m) {
    return Estimate(m, c).value().breakdown[static_cast<int>(Category::kNccl)];
  };
  const NcclMemory two = NcclMemoryOf(c.parallelism, Device("h100-80gb")).value();
  const NcclMemory with_pair = NcclMemoryOf(c.parallelism, Device("h100-80gb"), true).value();
  EXPECT_EQ(nccl(llama), two.bytes);
  EXPECT_EQ(nccl(gpt2), with_pair.bytes);
}

TEST(NcclTest, GpusPerNodeIsChecked) {
  ParallelismConfig p;
  p.data = 2;
  p.gpus_per_node = 0;
  const Status s = NcclMemoryOf(p, Device("h100-80gb")).status();
  EXPECT_NE(s.message().find("config.parallelism.gpus_per_node"), std::string::npos) << s.message();
  RunConfig c;
  c.parallelism.gpus_per_node = -3;
  EXPECT_NE(ValidateRunConfig(c).message().find("gpus_per_node"), std::string::npos);
}

// The estimate counts NCCL like the CUDA context: in the breakdown and in what the device must
// hold, not in the peak of PyTorch's allocator; none on the CPU runtime (gloo).
TEST(NcclTest, TheEstimateCountsItOutsideTheAllocator) {
  ModelSpec model;
  model.source = PresetSpec{"gpt2-small", {{"layers", 2}, {"seq", 128}}};
  RunConfig c;
  c.batch_size = 2;
  c.device = "h100-80gb";
  const Report one = Estimate(model, c).value();
  c.parallelism.data = 8;
  c.parallelism.sharding = DataSharding::kDdp;
  const Report ddp = Estimate(model, c).value();
  const int64_t nccl = NcclMemoryOf(c.parallelism, Device("h100-80gb")).value().bytes;
  EXPECT_EQ(one.breakdown[static_cast<int>(Category::kNccl)], 0);
  EXPECT_EQ(ddp.breakdown[static_cast<int>(Category::kNccl)], nccl);
  ASSERT_TRUE(ddp.fit.has_value());
  EXPECT_EQ(ddp.fit->required_bytes,
            ddp.peak_reserved_bytes + ddp.breakdown[static_cast<int>(Category::kCudaContext)] + nccl);
  EXPECT_EQ(ddp.peak.by_category[static_cast<int>(Category::kNccl)], 0);
  bool noted = false;
  for (const std::string& n : ddp.notes) noted |= n.rfind("NCCL: ", 0) == 0;
  EXPECT_TRUE(noted);
  c.runtime = Runtime::kCpuTorch113;
  c.device.clear();
  EXPECT_EQ(Estimate(model, c).value().breakdown[static_cast<int>(Category::kNccl)], 0);
}

}  // namespace
}  // namespace memest
