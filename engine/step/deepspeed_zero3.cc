// DeepSpeed ZeRO-3's hooks on one rank's step (engine/step/rank_hooks.h; the buffers are planned
// by engine/passes/deepspeed_zero3.h, which says what stage3.py does): what initialisation made
// and keeps, the ipg bucket and its reduce-scatter, and the optimizer step. The gathering of
// each module's parameters is the coordinator's (engine/step/zero3_coordinator.h).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/ir/shape.h"
#include "engine/step/rank_hooks.h"
#include "engine/step/zero3_coordinator.h"

namespace memest {
namespace {

class DeepSpeedZero3Hooks : public RankHooks {
 public:
  DeepSpeedZero3Hooks(const DeepSpeedZero3& z, const Graph& g, const RunConfig& c)
      : z_(z), g_(g), c_(c), coordinator_(z, g, c) {}

  // The rank keeps each parameter's partition (trainable ones in lp_param_buffer), on the
  // host with offload_param.
  int64_t ParameterBytes(int t, int64_t whole) const override {
    if (g_.tensors[t].role != TensorRole::kParameter) return whole;
    if (z_.on_host[t]) return 0;
    return Zero3Bytes(z_, t, z_.partition[t]);  // at most the parameter's own bytes and a pad
  }

  // The optimizer steps the fp32 partitions; no parameter has state of its own.
  const Tensor* OptimizerParam(const Graph& /*g*/, int /*t*/) const override { return nullptr; }

  // What initialisation made and keeps: the fp32 masters, the gradient partitions (none of
  // them on the GPU with offload_optimizer), the ipg bucket; in a steady step also the
  // optimizer state and the persistent parameters the last step gathered.
  void StepStarts(RankMemory& m) override {
    m.Allocate(z_.master_bytes, Category::kMasterAndCasts);
    m.Allocate(z_.grad_partition_bytes, Category::kGradients);
    m.Allocate(z_.ipg_bytes, Category::kCommunication);
    if (c_.step == StepKind::kSteadyState) {
      if (z_.state_bytes > 0) m.Allocate(z_.state_bytes, Category::kOptimizerState);
      coordinator_.GatherPersistent(m, /*transient=*/false);
    }
  }

  void ForwardOpStarts(RankMemory& m, int op) override { coordinator_.ForwardOpStarts(m, op); }
  void ForwardOpEnds(RankMemory& m, int op) override { coordinator_.ForwardOpEnds(m, op); }
  void BackwardStarts(RankMemory& /*m*/) override { coordinator_.BackwardStarts(); }
  void BackwardReaches(RankMemory& m, int op) override { coordinator_.BackwardReaches(m, op); }
  void BackwardRecomputes(RankMemory& m, int first_op, int /*last_op*/) override {
    coordinator_.BackwardRecomputes(m, first_op);
  }

  // reduce_independent_p_g_buckets_and_remove_grads: a bucket that would overflow is reduced
  // first; the gradient is copied into the ipg bucket and autograd's tensor goes (one larger
  // than the bucket keeps its own until its reduction).
  void GradReady(RankMemory& m, int t) override {
    const int64_t n = z_.numel[t];
    if (!bucket_.empty() && ipg_used_ + n > z_.ipg_elements) Reduce(m);
    bucket_.push_back(t);
    ipg_used_ += n;
    if (ipg_used_ <= z_.ipg_elements) m.ReleaseGrad(t, false);
  }

  // The last modules' post-backward hooks, then the epilogue's reduction of the last bucket.
  void BackwardEnds(RankMemory& m) override {
    coordinator_.BackwardEnds(m);
    Reduce(m);
  }

  void OptimizerStepStarts(RankMemory& m) override {
    coordinator_.ReleaseAll(m);  // _partition_all_parameters: release_and_reset_all
    if (!z_.offload_optimizer) GpuStep(m);  // else the CPU steps on host memory
    coordinator_.GatherPersistent(m, /*transient=*/true);  // _post_step
  }

 private:
  // The step on the GPU: the overflow check, the norm, each sub-group's fp32 gradient.
  void GpuStep(RankMemory& m) {
    const int64_t s = z_.trainable_partition_elements;
    if (z_.element_bytes == 2 && ParameterDType(c_.precision) == DType::kFloat16) {
      Transient(m, s);  // has_overflow: isinf(...) then isnan(...), each a bool per element
    }
    // The norm: g.double() of each partition in turn.
    Transient(m, SaturatedProduct(z_.largest_partition, 8));
    // _prepare_fp32_grad_for_sub_group: flatten (a model-dtype copy), .to(float32); the update;
    // the fp32 gradient goes (the largest sub-group's are the step's peak).
    // The first step's FusedAdam makes its state inside optimizer.step(), once the flatten
    // has gone (fp32: the flatten is the fp32 gradient).
    const int64_t sg = z_.largest_sub_group;
    int grad = m.Allocate(SaturatedProduct(sg, z_.element_bytes), Category::kTemporaries);
    if (z_.element_bytes != 4) {
      const int fp32 = m.Allocate(SaturatedProduct(sg, 4), Category::kTemporaries);
      m.Deallocate(grad);
      grad = fp32;
    }
    if (c_.step == StepKind::kFirstStep && z_.state_bytes > 0) {
      m.Allocate(z_.state_bytes, Category::kOptimizerState);
    }
    m.Deallocate(grad);
  }

  void Transient(RankMemory& m, int64_t bytes) {
    if (bytes > 0) m.Deallocate(m.Allocate(bytes, Category::kTemporaries));
  }

  // __reduce_and_partition_ipg_grads: reduce_scatter_coalesced cats the bucket's gradients,
  // each padded to N partitions, into one new buffer (a lone gradient that divides by N is
  // used as it is); the partitions are copied (added) into the gradient partitions; the
  // gradients go.
  void Reduce(RankMemory& m) {
    if (bucket_.empty()) return;
    int64_t bytes = 0;
    for (int t : bucket_) bytes = SaturatedSum(bytes, Zero3Gathered(z_, t));
    const bool in_place = bucket_.size() == 1 && z_.numel[bucket_[0]] % z_.world == 0;
    const int cat = in_place ? -1 : m.Allocate(bytes, Category::kCommunication);
    for (int t : bucket_) {  // partition_grads, parameter by parameter
      if (z_.offload_optimizer) OffloadGradient(m, t);
      if (m.HasOwnGrad(t)) m.ReleaseGrad(t, false);
    }
    if (cat >= 0) m.Deallocate(cat);
    bucket_.clear();
    ipg_used_ = 0;
  }

  // partition_grads with offload_optimizer: the partition, copied to the host buffer, comes
  // back to the GPU (`grad_buffer.to(device)`); at the boundary its norm takes a float64 copy
  // of each 250M-element part and its fp32 copy goes to the pinned buffer. (Rank 0's
  // partition always holds real data.)
  void OffloadGradient(RankMemory& m, int t) {
    const int64_t n = z_.partition[t];
    const int copy = m.Allocate(Zero3Bytes(z_, t, n), Category::kCommunication);
    if (m.LastMicroBatch()) {
      Transient(m, SaturatedProduct(std::min<int64_t>(n, 250'000'000), 8));
      if (z_.bytes[t] != 4) Transient(m, SaturatedProduct(n, 4));
    }
    m.Deallocate(copy);
  }

  const DeepSpeedZero3& z_;
  const Graph& g_;
  const RunConfig& c_;
  Zero3Coordinator coordinator_;
  std::vector<int> bucket_;
  int64_t ipg_used_ = 0;
};

}  // namespace

std::unique_ptr<RankHooks> MakeDeepSpeedZero3Hooks(const RankView& view, const Graph& graph,
                                                   const RunConfig& config) {
  return std::make_unique<DeepSpeedZero3Hooks>(*view.zero3, graph, config);
}

}  // namespace memest
