// DistributedDataParallel's hooks on one rank's step (engine/step/rank_hooks.h), with
// ZeroRedundancyOptimizer's ownership when the view has one; and the factory of every
// strategy's hooks.
#include <memory>

#include "engine/step/rank_hooks.h"

namespace memest {
namespace {

class DdpHooks : public RankHooks {
 public:
  explicit DdpHooks(const RankView& view) : view_(view) {}

  const Tensor* OptimizerParam(const Graph& g, int t) const override {
    return view_.OptimizerOwns(t) ? &g.tensors[t] : nullptr;
  }

  int KeptGrad(RankMemory& m, int t, int64_t whole) override {
    if (view_.grads_in_buckets) return kGradInRankBuffer;
    return RankHooks::KeptGrad(m, t, whole);
  }

  // The gradient buckets: made with DDP, kept for its life.
  void StepStarts(RankMemory& m) override {
    for (const DdpBucket& b : view_.buckets) m.Allocate(b.bytes, Category::kCommunication);
  }

  // DDP's hook (Reducer::mark_variable_ready_dense) copies the gradient into its bucket on the
  // micro-batch that synchronizes (the last; the others run under no_sync()); with
  // gradient_as_bucket_view .grad then becomes the bucket's view and autograd's tensor goes.
  void GradReady(RankMemory& m, int t) override {
    if (view_.grads_in_buckets && m.LastMicroBatch() && m.HasOwnGrad(t)) m.ReleaseGrad(t, true);
  }

 private:
  const RankView& view_;
};

}  // namespace

std::unique_ptr<RankHooks> MakeDdpHooks(const RankView& view) {
  return std::make_unique<DdpHooks>(view);
}

std::unique_ptr<RankHooks> MakeRankHooks(const RankView* view, const Graph& graph,
                                         const RunConfig& config) {
  if (view == nullptr) return std::make_unique<RankHooks>();
  if (view->deepspeed) return MakeDeepSpeedZeroHooks(*view, graph, config);
  if (view->zero3) return MakeDeepSpeedZero3Hooks(*view, graph, config);
  if (view->fsdp1) return MakeFsdp1Hooks(*view, graph);
  if (view->fsdp2) return MakeFsdp2Hooks(*view, graph);
  if (view->megatron) return MakeMegatronDdpHooks(*view, config);
  return MakeDdpHooks(*view);
}

}  // namespace memest
