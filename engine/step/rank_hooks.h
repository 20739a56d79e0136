// What a parallelism strategy does to one rank's step, as hooks the step simulator calls at
// fixed points (engine/step/simulator.h). The pass (engine/passes/data_parallel.h) decides what
// one rank holds; its RankHooks say when: the simulator walks the graph as PyTorch runs it and
// knows no strategy by name.
//
// The points, in the order of a step:
//   ParameterBytes, OptimizerParam, KeptGrad   the step starts: what the rank keeps of each
//                                              parameter, its optimizer state, zeroed grads
//   StepStarts                                 buffers the strategy keeps for its life
//   ForwardOpStarts / ForwardOpEnds            around each forward op (not recomputation)
//   BackwardStarts                             before loss.backward()'s first op
//   BackwardReaches                            the backward walk is at op i (descending)
//   BackwardRecomputes                         it reached a checkpointed region [first, last]:
//                                              recomputed and back-propagated whole, with no
//                                              BackwardReaches inside it
//   GradReady                                  after a parameter's AccumulateGrad
//   BackwardEnds                               loss.backward() has returned
//   OptimizerStepStarts                        before the optimizer's per-parameter work
// Every hook allocates and frees through RankMemory, so its buffers enter the same schedule and
// allocator model as the step's own tensors.
#ifndef MEMEST_ENGINE_STEP_RANK_HOOKS_H_
#define MEMEST_ENGINE_STEP_RANK_HOOKS_H_

#include <cstdint>
#include <memory>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/passes/data_parallel.h"
#include "engine/passes/tensor_parallel.h"
#include "engine/report/report.h"

namespace memest {

// A parameter's .grad slot: a buffer id, or one of these.
constexpr int kNoGrad = -1;             // .grad is None
constexpr int kGradInRankBuffer = -2;   // .grad is a view into a buffer the strategy keeps

// The CUDA streams a strategy allocates on: the caching allocator keeps each stream's blocks
// apart (a block freed on one is not reused by another's requests).
constexpr int kDefaultStream = 0;
constexpr int kAllGatherStream = 1;      // FSDP2's all_gather_copy_in_stream, FSDP1's unshard
constexpr int kReduceScatterStream = 2;  // FSDP2's reduce_scatter_stream, FSDP1's post_backward
constexpr int kPreAllGatherStream = 3;   // FSDP1's pre_unshard (mixed-precision, offload copies)

// The step's memory as a hook sees it.
class RankMemory {
 public:
  virtual ~RankMemory() = default;
  // A buffer id; `stream` is the CUDA stream the strategy allocates it on (kDefaultStream...).
  virtual int Allocate(int64_t bytes, Category category, int stream) = 0;
  int Allocate(int64_t bytes, Category category) {
    return Allocate(bytes, category, kDefaultStream);
  }
  virtual void Deallocate(int buffer) = 0;
  // Whether parameter t has a .grad of its own storage now.
  virtual bool HasOwnGrad(int t) const = 0;
  // Frees parameter t's own .grad. With `into_rank_buffer`, .grad becomes a view into a buffer
  // the strategy keeps (a DDP bucket), into which later gradients are added in place; without
  // it, .grad is None again.
  virtual void ReleaseGrad(int t, bool into_rank_buffer) = 0;
  // Whether this micro-batch is the last of the step (the one that synchronizes gradients).
  virtual bool LastMicroBatch() const = 0;
};

class RankHooks {
 public:
  virtual ~RankHooks() = default;
  // Bytes the rank keeps of parameter (or buffer) t for the whole step; `whole` by default.
  virtual int64_t ParameterBytes(int t, int64_t whole) const { return whole; }
  // The tensor whose shape and dtype parameter t's optimizer state and update scratch take on
  // this rank (the parameter itself by default), or null when this rank's optimizer does not
  // step it.
  virtual const Tensor* OptimizerParam(const Graph& g, int t) const { return &g.tensors[t]; }
  // Whether the optimizer steps parameter t although it has no .grad of its own (its gradient
  // is held by the strategy: a sharded gradient).
  virtual bool HoldsGrad(int /*t*/) const { return false; }
  // Bytes of scratch the strategy's tensors add while the optimizer updates parameter t (beside
  // the implementation's own): DTensor redistributing a gradient whose placement is not the
  // parameter's.
  virtual int64_t OptimizerScratch(int /*t*/) const { return 0; }
  // A steady step with zero_grad(set_to_none=False) starts with zeroed gradients: parameter
  // t's .grad as the strategy keeps it: a buffer of its own (by default, `whole` bytes), or
  // kGradInRankBuffer, or kNoGrad when the strategy keeps the zeroed gradient itself.
  virtual int KeptGrad(RankMemory& m, int /*t*/, int64_t whole) {
    return m.Allocate(whole, Category::kGradients);
  }
  virtual void StepStarts(RankMemory& /*m*/) {}
  virtual void ForwardOpStarts(RankMemory& /*m*/, int /*op*/) {}
  virtual void ForwardOpEnds(RankMemory& /*m*/, int /*op*/) {}
  virtual void BackwardStarts(RankMemory& /*m*/) {}
  virtual void BackwardReaches(RankMemory& /*m*/, int /*op*/) {}
  virtual void BackwardRecomputes(RankMemory& /*m*/, int /*first_op*/, int /*last_op*/) {}
  virtual void GradReady(RankMemory& /*m*/, int /*t*/) {}
  virtual void BackwardEnds(RankMemory& /*m*/) {}
  virtual void OptimizerStepStarts(RankMemory& /*m*/) {}
};

// The hooks of `view`'s strategy; the identity (one GPU, every parameter whole) for null.
std::unique_ptr<RankHooks> MakeRankHooks(const RankView* view, const Graph& graph,
                                         const RunConfig& config);

// The strategies' hooks (each in its own file of engine/step).
std::unique_ptr<RankHooks> MakeDdpHooks(const RankView& view);                     // ddp.cc
std::unique_ptr<RankHooks> MakeDeepSpeedZeroHooks(const RankView& view, const Graph& graph,
                                                  const RunConfig& config);  // deepspeed_zero.cc
std::unique_ptr<RankHooks> MakeDeepSpeedZero3Hooks(const RankView& view, const Graph& graph,
                                                   const RunConfig& config);  // deepspeed_zero3.cc
std::unique_ptr<RankHooks> MakeFsdp1Hooks(const RankView& view, const Graph& graph);  // fsdp1.cc
std::unique_ptr<RankHooks> MakeFsdp2Hooks(const RankView& view, const Graph& graph);  // fsdp2.cc
std::unique_ptr<RankHooks> MakeMegatronDdpHooks(const RankView& view,
                                                const RunConfig& config);  // megatron_ddp.cc

// Tensor parallelism's buffers around `inner`, the data-parallel strategy's hooks
// (tensor_parallel.cc).
std::unique_ptr<RankHooks> MakeTensorParallelHooks(const TensorParallelView& view,
                                                   const Graph& graph, const RunConfig& config,
                                                   std::unique_ptr<RankHooks> inner);

}  // namespace memest

#endif  // MEMEST_ENGINE_STEP_RANK_HOOKS_H_
