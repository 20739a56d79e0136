// DeepSpeed ZeRO-2's hooks on one rank's step (engine/step/rank_hooks.h; the rank's view is
// planned by engine/passes/data_parallel.h): the flat partitions, the ipg buckets through
// backward, the reduction into grads_in_partition, averaged_gradients, and the step over the
// flat partition.
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/ir/shape.h"
#include "engine/step/rank_hooks.h"

namespace memest {
namespace {

class Zero2Hooks : public RankHooks {
 public:
  Zero2Hooks(const RankView& view, const Graph& g, const RunConfig& c)
      : z_(*view.zero2), g_(g), c_(c) {}

  // Its optimizer steps the flat partition; no parameter has state of its own.
  const Tensor* OptimizerParam(const Graph& /*g*/, int /*t*/) const override { return nullptr; }

  // The fp32 master partition, and in a steady step the optimizer state over it.
  void StepStarts(RankMemory& m) override {
    if (z_.master_bytes > 0) m.Allocate(z_.master_bytes, Category::kMasterAndCasts);
    if (c_.step == StepKind::kSteadyState) m.Allocate(z_.state_bytes, Category::kOptimizerState);
  }

  // DeepSpeed's optimizer.backward, before loss.backward: the ipg buffers.
  void BackwardStarts(RankMemory& m) override {
    for (int k = 0; k < z_.ipg_buffers; ++k) {
      ipg_buffers_.push_back(m.Allocate(z_.ipg_bytes, Category::kCommunication));
    }
  }

  // reduce_independent_p_g_buckets_and_remove_grads: a bucket that would overflow is reduced
  // first; the gradient is copied into the ipg buffer and autograd's tensor goes.
  void GradReady(RankMemory& m, int t) override {
    const int64_t n = Numel(g_.tensors[t].shape);
    if (ipg_elements_ + n > z_.ipg_elements) Reduce(m);
    ipg_elements_ += n;
    m.ReleaseGrad(t, false);
  }

  // The epilogue: the last bucket, averaged_gradients (made on the first micro-batch, added
  // into on the later ones through a partition-sized copy), then the ipg buffers and
  // grads_in_partition go.
  void BackwardEnds(RankMemory& m) override {
    Reduce(m);
    if (averaged_ < 0) averaged_ = m.Allocate(z_.averaged_bytes, Category::kGradients);
    else m.Deallocate(m.Allocate(z_.averaged_bytes, Category::kTemporaries));
    for (int b : ipg_buffers_) m.Deallocate(b);
    ipg_buffers_.clear();
    if (grads_in_partition_ >= 0) m.Deallocate(grads_in_partition_);
    grads_in_partition_ = -1;
  }

  // step(): state on the first step; single_grad_partition = flatten(averaged_gradients)
  // .to(float32); averaged_gradients = None; the fused update; the fp32 gradient goes after.
  void OptimizerStepStarts(RankMemory& m) override {
    if (c_.step == StepKind::kFirstStep) m.Allocate(z_.state_bytes, Category::kOptimizerState);
    const int flat = m.Allocate(z_.averaged_bytes, Category::kTemporaries);
    int fp32 = -1;
    if (z_.step_fp32_bytes > 0) {
      fp32 = m.Allocate(z_.step_fp32_bytes, Category::kTemporaries);
      m.Deallocate(flat);
    }
    if (averaged_ >= 0) m.Deallocate(averaged_);
    averaged_ = -1;
    m.Deallocate(fp32 >= 0 ? fp32 : flat);
  }

 private:
  // reduce_ipg_grads: allreduce_bucket flattens the bucket into a new tensor; the first
  // reduction of a backward makes grads_in_partition.
  void Reduce(RankMemory& m) {
    if (ipg_elements_ == 0) return;
    if (grads_in_partition_ < 0) {
      grads_in_partition_ = m.Allocate(z_.grads_in_partition_bytes, Category::kGradients);
    }
    int64_t bytes = 0;
    if (!AddBytes(&bytes, ipg_elements_ * z_.grad_element_bytes)) bytes = kMaxBytes;
    m.Deallocate(m.Allocate(bytes, Category::kTemporaries));
    ipg_elements_ = 0;
  }

  const DeepSpeedZero2& z_;
  const Graph& g_;
  const RunConfig& c_;
  int64_t ipg_elements_ = 0;
  std::vector<int> ipg_buffers_;
  int grads_in_partition_ = -1;
  int averaged_ = -1;
};

}  // namespace

std::unique_ptr<RankHooks> MakeZero2Hooks(const RankView& view, const Graph& graph,
                                          const RunConfig& config) {
  return std::make_unique<Zero2Hooks>(view, graph, config);
}

}  // namespace memest
