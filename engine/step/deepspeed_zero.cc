// DeepSpeed ZeRO-1/2's hooks on one rank's step (engine/step/rank_hooks.h; the rank's buffers
// are planned by engine/passes/deepspeed_zero.h, which says what stage_1_and_2.py does): the
// flat partitions, the ipg buckets, the reduction into grads_in_partition (or, offloaded, the
// copies to the host), averaged_gradients, and the step over the flat partition.
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/ir/shape.h"
#include "engine/step/rank_hooks.h"

namespace memest {
namespace {

class DeepSpeedZeroHooks : public RankHooks {
 public:
  DeepSpeedZeroHooks(const RankView& view, const Graph& g, const RunConfig& c)
      : z_(*view.deepspeed), g_(g), c_(c) {}

  // Its optimizer steps the flat partition; no parameter has state of its own.
  const Tensor* OptimizerParam(const Graph& /*g*/, int /*t*/) const override { return nullptr; }

  // The fp32 master partition and, in a steady step, the optimizer state over it (both on the
  // host with offload); offloaded, the GPU's gradient staging buffer.
  void StepStarts(RankMemory& m) override {
    if (z_.master_bytes > 0) m.Allocate(z_.master_bytes, Category::kMasterAndCasts);
    if (c_.step == StepKind::kSteadyState && z_.state_bytes > 0) {
      m.Allocate(z_.state_bytes, Category::kOptimizerState);
    }
    if (z_.offload_buffer_bytes > 0) m.Allocate(z_.offload_buffer_bytes, Category::kCommunication);
  }

  // optimizer.backward(), before loss.backward(): `self.ipg_buffer = []` drops the buffers an
  // earlier micro-batch made (stage 1 keeps them to the boundary), then the new ones.
  void BackwardStarts(RankMemory& m) override {
    for (int b : ipg_buffers_) m.Deallocate(b);
    ipg_buffers_.clear();
    for (int k = 0; k < z_.ipg_buffers; ++k) {
      ipg_buffers_.push_back(m.Allocate(z_.ipg_bytes, Category::kCommunication));
    }
  }

  // The hook on the parameter's AccumulateGrad: registered by stage 2, and by stage 1 with
  // overlap_comm, where it acts only at the accumulation boundary.
  void GradReady(RankMemory& m, int t) override {
    if (z_.partition_gradients || (z_.overlap_comm && m.LastMicroBatch())) Bucket(m, t);
  }

  // Stage 2 (every micro-batch) and stage 1 (the boundary) end with the epilogue; stage 1
  // without overlap_comm first reduces every gradient, in model order (reduce_gradients).
  void BackwardEnds(RankMemory& m) override {
    if (!z_.partition_gradients) {
      if (!m.LastMicroBatch()) return;
      if (!z_.overlap_comm) {
        for (size_t t = 0; t < g_.tensors.size(); ++t) {
          const Tensor& p = g_.tensors[t];
          if (p.role == TensorRole::kParameter && p.requires_grad &&
              m.HasOwnGrad(static_cast<int>(t))) {
            Bucket(m, static_cast<int>(t));
          }
        }
      }
    }
    Epilogue(m);
  }

  // step(): state on the first step; the checks of each slice (norm, fp16's overflow);
  // single_grad_partition = flatten(averaged_gradients).to(float32); averaged_gradients =
  // None; the fused update; the fp32 gradient goes. Offloaded: the update runs on the CPU and
  // the fp32 partition comes back to the GPU to be copied into the 16-bit parameters.
  void OptimizerStepStarts(RankMemory& m) override {
    if (z_.offload) {
      m.Deallocate(m.Allocate(z_.copy_back_bytes, Category::kTemporaries));
      return;
    }
    if (c_.step == StepKind::kFirstStep) m.Allocate(z_.state_bytes, Category::kOptimizerState);
    if (z_.step_scratch_bytes > 0) {
      m.Deallocate(m.Allocate(z_.step_scratch_bytes, Category::kTemporaries));
    }
    const int64_t flat_bytes = z_.partition_elements * z_.grad_element_bytes;
    const int flat = m.Allocate(flat_bytes, Category::kTemporaries);
    int fp32 = -1;
    if (z_.step_fp32_bytes > 0) {
      fp32 = m.Allocate(z_.step_fp32_bytes, Category::kTemporaries);
      m.Deallocate(flat);
    }
    for (int b : averaged_) m.Deallocate(b);
    averaged_.clear();
    m.Deallocate(fp32 >= 0 ? fp32 : flat);
  }

 private:
  // reduce_independent_p_g_buckets_and_remove_grads: a bucket that would overflow is reduced
  // first; the gradient is copied into the ipg buffer and autograd's tensor goes.
  void Bucket(RankMemory& m, int t) {
    const int64_t n = Numel(g_.tensors[t].shape);
    if (ipg_elements_ + n > z_.ipg_elements) Reduce(m);
    ipg_elements_ += n;
    bucket_.push_back(t);
    m.ReleaseGrad(t, false);
  }

  // reduce_ipg_grads: allreduce_bucket flattens the bucket into a new tensor; then each
  // gradient that overlaps the partition goes on (copy_grads_in_partition).
  void Reduce(RankMemory& m) {
    if (ipg_elements_ == 0) return;
    int64_t bytes = 0;
    if (!AddBytes(&bytes, ipg_elements_ * z_.grad_element_bytes)) bytes = kMaxBytes;
    m.Deallocate(m.Allocate(bytes, Category::kTemporaries));
    for (int t : bucket_) {
      if (z_.slice[t] > 0) CopyInPartition(m, t);
    }
    bucket_.clear();
    ipg_elements_ = 0;
  }

  // Without offload the first one makes grads_in_partition. Offloaded, at the boundary:
  // set_norm_for_param_grad_in_gpu (a float64 copy of the slice), the inf/NaN check of the
  // whole gradient, and the float32 copy of the slice sent to the host (accumulation into the
  // host buffers goes through the staging buffer the GPU keeps).
  void CopyInPartition(RankMemory& m, int t) {
    if (!z_.offload) {
      if (grads_in_partition_ < 0) {
        grads_in_partition_ = m.Allocate(z_.grads_in_partition_bytes, Category::kGradients);
      }
      return;
    }
    if (!m.LastMicroBatch()) return;
    const int64_t slice = z_.slice[t];  // below 2^62 / 11: a parameter's elements
    m.Deallocate(m.Allocate(8 * slice, Category::kTemporaries));
    m.Deallocate(m.Allocate(
        OverflowCheckBytes(Numel(g_.tensors[t].shape), z_.grad_element_bytes),
        Category::kTemporaries));
    if (z_.grad_element_bytes != 4) {
      m.Deallocate(m.Allocate(4 * slice, Category::kTemporaries));
    }
  }

  // independent_gradient_partition_epilogue: the last bucket; averaged_gradients views the
  // first micro-batch's grads_in_partition (with the last rank's zeros), a later micro-batch's
  // is added into it and goes; the ipg buffers go.
  void Epilogue(RankMemory& m) {
    Reduce(m);
    if (grads_in_partition_ >= 0) {
      if (averaged_.empty()) {
        averaged_.push_back(grads_in_partition_);
        if (z_.padding_bytes > 0) {
          averaged_.push_back(m.Allocate(z_.padding_bytes, Category::kGradients));
        }
      } else {  // avg_new: the same views (and zeros), added in place
        if (z_.padding_bytes > 0) {
          m.Deallocate(m.Allocate(z_.padding_bytes, Category::kTemporaries));
        }
        m.Deallocate(grads_in_partition_);
      }
      grads_in_partition_ = -1;
    }
    for (int b : ipg_buffers_) m.Deallocate(b);
    ipg_buffers_.clear();
  }

  const DeepSpeedZero& z_;
  const Graph& g_;
  const RunConfig& c_;
  int64_t ipg_elements_ = 0;
  std::vector<int> bucket_;  // the parameters whose gradients are in the open bucket
  std::vector<int> ipg_buffers_;
  int grads_in_partition_ = -1;
  std::vector<int> averaged_;  // the buffers averaged_gradients keeps
};

}  // namespace

std::unique_ptr<RankHooks> MakeDeepSpeedZeroHooks(const RankView& view, const Graph& graph,
                                                  const RunConfig& config) {
  return std::make_unique<DeepSpeedZeroHooks>(view, graph, config);
}

}  // namespace memest
