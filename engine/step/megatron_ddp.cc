// Megatron-LM's DistributedDataParallel and optimizers on one rank's step
// (engine/passes/megatron_ddp.h): the contiguous buffers, each gradient added into the float32
// buffer and dropped, and the optimizer's float32 master copy and state.
#include <memory>

#include "engine/step/rank_hooks.h"

namespace memest {
namespace {

class MegatronDdpHooks : public RankHooks {
 public:
  MegatronDdpHooks(const MegatronDdp& m, const RunConfig& c) : m_(m), c_(c) {}

  // With the distributed optimizer the trainable parameters live in param_data (StepStarts);
  // buffers and frozen parameters keep their own storage.
  int64_t ParameterBytes(int t, int64_t whole) const override {
    return m_.in_param_buffer[t] ? 0 : whole;
  }
  // The optimizer steps the float32 masters; no parameter has state of its own.
  const Tensor* OptimizerParam(const Graph& /*g*/, int /*t*/) const override { return nullptr; }
  // zero_grad_buffer zeroes the buffer; .grad stays None.
  int KeptGrad(RankMemory& /*m*/, int /*t*/, int64_t /*whole*/) override { return kNoGrad; }

  void StepStarts(RankMemory& m) override {
    if (m_.param_buffer_bytes > 0) m.Allocate(m_.param_buffer_bytes, Category::kParameters);
    m.Allocate(m_.grad_buffer_bytes, Category::kGradients);
    if (m_.master_bytes > 0) m.Allocate(m_.master_bytes, Category::kMasterAndCasts);
    if (c_.step == StepKind::kSteadyState && m_.state_bytes > 0) {
      m.Allocate(m_.state_bytes, Category::kOptimizerState);
    }
  }
  // DDP's hook: param.main_grad.add_(param.grad); param.grad = None.
  void GradReady(RankMemory& m, int t) override { m.ReleaseGrad(t, false); }
  // The fused optimizer makes its state on the first step.
  void OptimizerStepStarts(RankMemory& m) override {
    if (c_.step == StepKind::kFirstStep && m_.state_bytes > 0) {
      m.Allocate(m_.state_bytes, Category::kOptimizerState);
    }
  }

 private:
  const MegatronDdp& m_;
  const RunConfig& c_;
};

}  // namespace

std::unique_ptr<RankHooks> MakeMegatronDdpHooks(const RankView& view, const RunConfig& config) {
  return std::make_unique<MegatronDdpHooks>(*view.megatron, config);
}

}  // namespace memest
