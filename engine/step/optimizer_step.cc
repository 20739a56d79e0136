// The step simulator's optimizer step (state, scratch per implementation) and the layer table's
// parameter bytes (engine/step/simulator.h).
#include <algorithm>
#include <string>
#include <vector>

#include "engine/step/optimizers.h"
#include "engine/step/simulator.h"

namespace memest {

void StepSimulator::AllocOptimizerState(const Tensor& p) {
  const OptimizerCosts oc = CostsOf(cfg_.optimizer, cfg_.runtime);
  // One tensor per state entry: each is rounded by the allocator on its own.
  for (int i = 0; i < oc.state; ++i) NewBuffer(Bytes(p.shape, p.dtype), Category::kOptimizerState);
  for (int64_t bytes : ExtraStateBytes(cfg_.optimizer, p)) {
    NewBuffer(bytes, Category::kOptimizerState);
  }
  if (oc.device_step) NewBuffer(4, Category::kOptimizerState);
}

void StepSimulator::OptimizerStep() {
  Context(Phase::kOptimizerStep, -1);
  hooks_->OptimizerStepStarts(memory());
  const OptimizerCosts oc = CostsOf(cfg_.optimizer, cfg_.runtime);
  std::vector<const Tensor*> params;
  std::vector<int64_t> extra;  // per entry of params: the strategy's scratch (OptimizerScratch)
  for (size_t t = 0; t < g_.tensors.size(); ++t) {
    const Tensor& p = g_.tensors[t];
    if (p.role != TensorRole::kParameter || !p.requires_grad) continue;
    if (param_grad_[t] == kNoGrad && !hooks_->HoldsGrad(static_cast<int>(t))) continue;
    if (const Tensor* owned = hooks_->OptimizerParam(g_, static_cast<int>(t))) {
      params.push_back(owned);
      extra.push_back(hooks_->OptimizerScratch(static_cast<int>(t)));
    }
  }
  // _init_group creates the state of every parameter before updating, except SGD's momentum
  // buffers: the for-loop clones each inside the loop, after its weight-decay scratch.
  const OptimizerImpl impl = EffectiveImpl(cfg_.optimizer);
  // transformers' optimizers create each parameter's state inside their loop too.
  const bool state_in_loop = (cfg_.optimizer.kind == OptimizerKind::kSgdMomentum &&
                              impl == OptimizerImpl::kForLoop) ||
                             cfg_.optimizer.kind == OptimizerKind::kHfAdamW ||
                             cfg_.optimizer.kind == OptimizerKind::kHfAdafactor;
  const bool first = cfg_.step == StepKind::kFirstStep && !oc.state_at_init;
  if (first && !state_in_loop) {
    for (const Tensor* p : params) AllocOptimizerState(*p);
  }
  // The strategy's scratch (OptimizerScratch): the multi-tensor kernels take every
  // parameter's at once (beside the foreach ops' own scratch); the for-loop one parameter's at
  // a time, below.
  std::vector<int> redistributed;
  if (impl != OptimizerImpl::kForLoop) {
    for (int64_t bytes : extra) {
      if (bytes > 0) redistributed.push_back(NewBuffer(bytes, Category::kTemporaries));
    }
  }
  if (impl == OptimizerImpl::kForeach) {
    std::vector<int> scratch = std::move(redistributed);
    for (const Tensor* p : params) {
      const int64_t bytes = ScratchBytes(oc, *p);
      for (int k = 0; k < oc.all_scratch; ++k) {
        scratch.push_back(NewBuffer(bytes, Category::kTemporaries));
      }
    }
    for (int b : scratch) FreeBuffer(b);
  } else if (impl == OptimizerImpl::kForLoop) {
    std::vector<int> carried;  // the previous parameter's scratch that a local still holds
    for (size_t j = 0; j < params.size(); ++j) {
      const Tensor* p = params[j];
      const int64_t bytes = ScratchBytes(oc, *p);
      // The strategy's redistributions come and go inside the ops before the update's own
      // scratch (DTensor's lerp_ and addcmul_ before sqrt and div), beside what a local still
      // holds of the previous parameter.
      if (extra[j] > 0) FreeBuffer(NewBuffer(extra[j], Category::kTemporaries));
      std::vector<int> scratch;
      for (int k = 0; k < UpcastCopies(oc, *p); ++k) {  // grad.float(), p.float()
        scratch.push_back(NewBuffer(Numel(p->shape) * 4, Category::kTemporaries));
      }
      for (int64_t side : LoopSideScratchBytes(cfg_.optimizer, *p)) {
        scratch.push_back(NewBuffer(side, Category::kTemporaries));
      }
      for (int k = 0; k < oc.loop_scratch; ++k) {
        scratch.push_back(NewBuffer(bytes, Category::kTemporaries));
      }
      if (first && state_in_loop) AllocOptimizerState(*p);
      for (int b : carried) FreeBuffer(b);
      carried.clear();
      const size_t keep = std::min<size_t>(oc.loop_carry, scratch.size());
      for (size_t k = 0; k < scratch.size(); ++k) {
        if (k + keep >= scratch.size()) carried.push_back(scratch[k]);
        else FreeBuffer(scratch[k]);
      }
    }
    for (int b : carried) FreeBuffer(b);
  } else {  // fused: one kernel over every parameter, the redistributions its arguments
    for (int b : redistributed) FreeBuffer(b);
  }
}

void StepSimulator::FillParameterBytes() {
  for (const Tensor& t : g_.tensors) {
    if (t.role != TensorRole::kParameter) continue;
    const size_t dot = t.name.rfind('.');
    auto it = layer_index_.find(dot == std::string::npos ? std::string() : t.name.substr(0, dot));
    if (it != layer_index_.end()) {
      Sum(&s_.layers[it->second].parameter_bytes, Bytes(t.shape, t.dtype));
    }
  }
}

}  // namespace memest
