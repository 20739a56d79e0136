// Megatron-LM's DistributedDataParallel and optimizers (engine/passes/megatron_ddp.h,
// engine/step/megatron_ddp.cc): the contiguous buffers and their padding, the bytes per
// parameter theoretical_memory_usage.py counts, when the state appears, and the refusals.
#include "engine/passes/megatron_ddp.h"

#include <gtest/gtest.h>

#include <string>

#include "engine/estimator.h"
#include "tests/engine/test_graphs.h"

namespace memest {
namespace {

// x [8, 256] -> fc1 (256 -> 512) -> relu -> fc2 (512 -> 256) -> sum; every parameter a
// multiple of 64 elements and the whole 262,912 elements.
Graph Mlp(DType dtype) {
  GraphBuilder b;
  const int x = b.Input("x", {8, 256}, dtype);
  int h = b.Add1("linear", {x, b.Parameter("fc1.weight", {512, 256}, dtype),
                            b.Parameter("fc1.bias", {512}, dtype)});
  h = b.Add1("relu", {h});
  h = b.Add1("linear", {h, b.Parameter("fc2.weight", {256, 512}, dtype),
                        b.Parameter("fc2.bias", {256}, dtype)});
  b.BeginLoss();
  b.SetLoss(b.Add1("sum", {h}));
  return b.Finish().value();
}

RunConfig Megatron(DataSharding s, int64_t data) {
  RunConfig c;
  c.precision = Precision::kBf16Pure;
  c.optimizer.kind = OptimizerKind::kAdam;
  c.parallelism.data = data;
  c.parallelism.sharding = s;
  return c;
}

int64_t AtEnd(const Report& r, Category c) { return r.end_of_step[static_cast<int>(c)]; }

constexpr int64_t kParams = 512 * 256 + 512 + 256 * 512 + 256;  // 262,912

TEST(MegatronDdpTest, BuffersArePaddedAsParamAndGradBufferLaysThemOut) {
  // Reverse order: fc2.bias (256), fc2.weight, fc1.bias, fc1.weight, each at a multiple of 64
  // (they are already); the end to a multiple of lcm(3, 128) = 384.
  const MegatronDdp m = PlanMegatronDdp(Mlp(DType::kBFloat16),
                                        Megatron(DataSharding::kMegatronDistOpt, 3)).value();
  EXPECT_EQ(m.buffer_elements, (kParams + 383) / 384 * 384);
  EXPECT_EQ(m.shard_elements, m.buffer_elements / 3);
  EXPECT_EQ(m.grad_buffer_bytes, 4 * m.buffer_elements);
  EXPECT_EQ(m.param_buffer_bytes, 2 * m.buffer_elements);
  EXPECT_EQ(m.master_bytes, 4 * m.shard_elements);
  EXPECT_EQ(m.state_bytes, 8 * m.shard_elements);  // Adam's exp_avg and exp_avg_sq
  // A parameter that ends off a multiple of 64 pushes the next one's start.
  GraphBuilder b;
  const int x = b.Input("x", {2, 3}, DType::kBFloat16);
  b.SetLoss(b.Add1("sum", {b.Add1("linear", {x, b.Parameter("w", {5, 3}, DType::kBFloat16),
                                             b.Parameter("b", {5}, DType::kBFloat16)})}));
  const MegatronDdp odd = PlanMegatronDdp(b.Finish().value(),
                                          Megatron(DataSharding::kMegatronDistOpt, 2)).value();
  EXPECT_EQ(odd.buffer_elements, 128);  // b at 0..5, w at 64..79, the end padded to 128
  const MegatronDdp plain = PlanMegatronDdp(Mlp(DType::kBFloat16),
                                            Megatron(DataSharding::kMegatronDdp, 3)).value();
  EXPECT_EQ(plain.buffer_elements, kParams);  // no padding without the distributed optimizer
  EXPECT_EQ(plain.master_bytes, 4 * kParams);
}

// megatron/training/theoretical_memory_usage.py: 18 bytes per parameter without the
// distributed optimizer, 6 + 12/d with it (bf16 parameters, Adam).
TEST(MegatronDdpTest, ModelStatesAreMegatronsBytesPerParameter) {
  for (int64_t d : {int64_t{1}, int64_t{2}, int64_t{4}}) {
    for (DataSharding s : {DataSharding::kMegatronDdp, DataSharding::kMegatronDistOpt}) {
      RunConfig c = Megatron(s, d);
      if (d == 1 && s == DataSharding::kMegatronDistOpt) continue;
      const Report r = EstimateGraph(Mlp(DType::kBFloat16), c, {1'000'000, false}).value();
      const int64_t states = AtEnd(r, Category::kParameters) + AtEnd(r, Category::kGradients) +
                             AtEnd(r, Category::kMasterAndCasts) +
                             AtEnd(r, Category::kOptimizerState);
      // Each buffer as the caching allocator rounds it (512 B); the parameters are whole blocks.
      const auto block = [](int64_t bytes) { return (bytes + 511) / 512 * 512; };
      const int64_t per = s == DataSharding::kMegatronDdp
                              ? 2 * kParams + 4 * kParams + 4 * kParams + 8 * kParams
                              : block(2 * kParams) + block(4 * kParams) +
                                    block(4 * kParams / d) + block(8 * kParams / d);
      EXPECT_EQ(states, per) << DataShardingName(s) << " over " << d;
      // theoretical_memory_usage.py's num_bytes_per_parameter, to the allocator's rounding.
      const double bytes = s == DataSharding::kMegatronDdp ? 18.0 : 6.0 + 12.0 / static_cast<double>(d);
      EXPECT_NEAR(static_cast<double>(states) / kParams, bytes, 0.01);
    }
  }
}

// distributed_data_parallel.py (d98e8a64) 175-181 puts only parameters that require grad in
// param_data: a buffer and a frozen parameter keep their own storage under the distributed
// optimizer, as they do without it.
TEST(MegatronDdpTest, BuffersAndFrozenParametersStayOutOfParamData) {
  const auto graph = [](bool extras) {
    GraphBuilder b;
    const int x = b.Input("x", {8, 256}, DType::kBFloat16);
    int h = b.Add1("linear", {x, b.Parameter("fc.weight", {256, 256}, DType::kBFloat16),
                              b.Parameter("fc.bias", {256}, DType::kBFloat16)});
    if (extras) {
      h = b.Add1("add", {h, b.Buffer("shift", {8, 256}, DType::kBFloat16)});
      h = b.Add1("mul", {h, b.Parameter("scale", {8, 256}, DType::kBFloat16, false)});
    }
    b.SetLoss(b.Add1("sum", {h}));
    return b.Finish().value();
  };
  for (DataSharding s : {DataSharding::kMegatronDdp, DataSharding::kMegatronDistOpt}) {
    const RunConfig c = Megatron(s, 2);
    const Report plain = EstimateGraph(graph(false), c, {1'000'000, false}).value();
    const Report extras = EstimateGraph(graph(true), c, {1'000'000, false}).value();
    // The buffer and the frozen parameter, 4 KiB each, on top of the same trainable ones.
    EXPECT_EQ(AtEnd(extras, Category::kParameters) - AtEnd(plain, Category::kParameters),
              2 * 8 * 256 * 2)
        << DataShardingName(s);
    EXPECT_EQ(AtEnd(extras, Category::kOptimizerState), AtEnd(plain, Category::kOptimizerState));
  }
}

TEST(MegatronDdpTest, StateAppearsAtTheFirstStep) {
  RunConfig c = Megatron(DataSharding::kMegatronDistOpt, 2);
  c.step = StepKind::kFirstStep;
  const Report first = EstimateGraph(Mlp(DType::kBFloat16), c, {1'000'000, false}).value();
  const auto state_at = [](const Report& r, Phase p) {
    return r.phases[static_cast<int>(p)].by_category[static_cast<int>(Category::kOptimizerState)];
  };
  EXPECT_EQ(state_at(first, Phase::kForward), 0);
  EXPECT_EQ(state_at(first, Phase::kOptimizerStep), 8 * kParams / 2);
  c.step = StepKind::kSteadyState;
  const Report steady = EstimateGraph(Mlp(DType::kBFloat16), c, {1'000'000, false}).value();
  EXPECT_EQ(state_at(steady, Phase::kForward), 8 * kParams / 2);
  // Gradients live in the buffer alone: autograd's are dropped as they are added into it.
  EXPECT_EQ(AtEnd(steady, Category::kGradients), 4 * kParams);
}

TEST(MegatronDdpTest, RefusesWhatMegatronDoesNotRun) {
  RunConfig c = Megatron(DataSharding::kMegatronDistOpt, 2);
  c.precision = Precision::kBf16Amp;
  EXPECT_NE(ValidateRunConfig(c).message().find("config.precision: bf16 autocast is torch.autocast"),
            std::string::npos)
      << ValidateRunConfig(c).message();
  c = Megatron(DataSharding::kMegatronDdp, 2);
  c.optimizer.kind = OptimizerKind::kLion;
  EXPECT_NE(ValidateRunConfig(c).message().find("config.optimizer.kind"), std::string::npos);
  c = Megatron(DataSharding::kMegatronDdp, 2);
  c.zero_grad_set_to_none = false;
  EXPECT_NE(ValidateRunConfig(c).message().find("config.zero_grad_keep_grads"), std::string::npos);
  c = Megatron(DataSharding::kMegatronDdp, 2);
  c.runtime = Runtime::kCpuTorch113;
  EXPECT_NE(ValidateRunConfig(c).message().find("config.parallelism.data_parallel"),
            std::string::npos);
  c = Megatron(DataSharding::kMegatronDistOpt, 2);
  c.parallelism.gradient_as_bucket_view = true;
  EXPECT_NE(ValidateRunConfig(c).message().find("config.parallelism.gradient_as_bucket_view"),
            std::string::npos);
}

TEST(MegatronDdpTest, ComposesWithTensorParallelism) {
  RunConfig c = Megatron(DataSharding::kMegatronDistOpt, 4);
  c.parallelism.tensor = 2;
  c.parallelism.tensor_plan = {{"fc1", TensorShardStyle::kColwise}, {"fc2", TensorShardStyle::kRowwise}};
  const Report r = EstimateGraph(Mlp(DType::kBFloat16), c, {1'000'000, false}).value();
  // The rank's shares: fc1 and fc2's weights and fc1's bias halved, fc2's bias whole; the end
  // padded to lcm(4, 128).
  const int64_t rank = 512 * 256 / 2 + 512 / 2 + 256 * 512 / 2 + 256;
  const int64_t buffer = (rank + 127) / 128 * 128;
  EXPECT_EQ(AtEnd(r, Category::kGradients), 4 * buffer);
  EXPECT_EQ(AtEnd(r, Category::kParameters), 2 * buffer);
}

}  // namespace
}  // namespace memest
