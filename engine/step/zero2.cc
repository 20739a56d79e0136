// The step simulator's DeepSpeed ZeRO-2 buffers (engine/step/simulator.h; the rank's view is
// planned by engine/passes/data_parallel.h): the ipg buckets through backward, the reduction into
// grads_in_partition, averaged_gradients, and the step over the flat partition.
#include <cstdint>
#include <vector>

#include "engine/ir/shape.h"
#include "engine/step/simulator.h"

namespace memest {

// reduce_independent_p_g_buckets_and_remove_grads: a bucket that would overflow is reduced first;
// the gradient is copied into the ipg buffer and autograd's tensor goes.
void StepSimulator::Zero2Take(int t) {
  const DeepSpeedZero2& z = *opt_.rank->zero2;
  const int64_t n = Numel(g_.tensors[t].shape);
  if (ipg_elements_ + n > z.ipg_elements) Zero2Reduce();
  ipg_elements_ += n;
  FreeBuffer(param_grad_[t]);
  param_grad_[t] = -1;
}

// reduce_ipg_grads: allreduce_bucket flattens the bucket into a new tensor; the first
// reduction of a backward makes grads_in_partition.
void StepSimulator::Zero2Reduce() {
  const DeepSpeedZero2& z = *opt_.rank->zero2;
  if (ipg_elements_ == 0) return;
  if (grads_in_partition_ < 0) {
    grads_in_partition_ = NewBuffer(z.grads_in_partition_bytes, Category::kGradients);
  }
  int64_t bytes = 0;
  if (!AddBytes(&bytes, ipg_elements_ * z.grad_element_bytes)) bytes = kMaxBytes;
  FreeBuffer(NewBuffer(bytes, Category::kTemporaries));
  ipg_elements_ = 0;
}

// When backward starts: the ipg buffers.
void StepSimulator::Zero2BackwardStarts() {
  const DeepSpeedZero2& z = *opt_.rank->zero2;
  for (int k = 0; k < z.ipg_buffers; ++k) {
    ipg_buffers_.push_back(NewBuffer(z.ipg_bytes, Category::kCommunication));
  }
}

// The epilogue: the last bucket, averaged_gradients (made on the first micro-batch, added
// into on the later ones through a partition-sized copy), then the ipg buffers and
// grads_in_partition go.
void StepSimulator::Zero2BackwardEnds() {
  const DeepSpeedZero2& z = *opt_.rank->zero2;
  Zero2Reduce();
  if (averaged_ < 0) averaged_ = NewBuffer(z.averaged_bytes, Category::kGradients);
  else FreeBuffer(NewBuffer(z.averaged_bytes, Category::kTemporaries));
  for (int b : ipg_buffers_) FreeBuffer(b);
  ipg_buffers_.clear();
  if (grads_in_partition_ >= 0) FreeBuffer(grads_in_partition_);
  grads_in_partition_ = -1;
}

// step(): state on the first step; single_grad_partition = flatten(averaged_gradients)
// .to(float32); averaged_gradients = None; the fused update; the fp32 gradient goes after.
void StepSimulator::Zero2Step() {
  const DeepSpeedZero2& z = *opt_.rank->zero2;
  if (cfg_.step == StepKind::kFirstStep) NewBuffer(z.state_bytes, Category::kOptimizerState);
  const int flat = NewBuffer(z.averaged_bytes, Category::kTemporaries);
  int fp32 = -1;
  if (z.step_fp32_bytes > 0) {
    fp32 = NewBuffer(z.step_fp32_bytes, Category::kTemporaries);
    FreeBuffer(flat);
  }
  if (averaged_ >= 0) FreeBuffer(averaged_);
  averaged_ = -1;
  FreeBuffer(fp32 >= 0 ? fp32 : flat);
}

}  // namespace memest
