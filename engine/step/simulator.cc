// The step simulator (engine/step/simulator.h): construction, Run, events, the step's structure
// (parameters, optimizer state carried into a steady-state step, workspaces) and the
// micro-batch.
#include "engine/step/simulator.h"

#include <utility>
#include <vector>

#include "engine/ir/budget.h"
#include "engine/step/optimizers.h"

namespace memest {

StepSimulator::StepSimulator(const Graph& g, const RunConfig& cfg, const CheckpointRegions& regions,
                             const ScheduleOptions& opt, bool folded)
    : g_(g),
      cfg_(cfg),
      opt_(opt),
      training_(cfg.mode == Mode::kTraining),
      hold_outputs_(cfg.hold_outputs && opt.pipeline == nullptr),
      folded_(folded) {
  const size_t n = g.tensors.size();
  base_.resize(n);
  for (size_t t = 0; t < n; ++t) base_[t] = static_cast<int>(t);
  rules_.reserve(g.ops.size());
  memo_slot_.reserve(g.ops.size());
  weight_cast_.reserve(g.ops.size());
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    int slot = static_cast<int>(i);
    if (i < g.copy_of.size() && g.copy_of[i] >= 0 && OpsAlikeToRules(g, slot, g.copy_of[i])) {
      slot = g.copy_of[i];
    }
    memo_slot_.push_back(slot);
    const OpRule* rule = slot == static_cast<int>(i) ? FindOpRule(op.kind) : rules_[slot];
    rules_.push_back(rule);
    weight_cast_.push_back(WeightCast(op));
    const bool eval_identity = !training_ && rule && rule->identity_in_eval;
    for (int o : op.outputs) {
      const Tensor& t = g.tensors[o];
      if (t.alias_of >= 0) base_[o] = base_[t.alias_of];
      else if (eval_identity) base_[o] = base_[op.inputs[0]];
    }
  }
  refs_ = PlanPythonRefs(g, base_, cfg.mode, OutputsHoldCache(cfg));
  kv_cache_.assign(n, 0);
  if (!training_) {
    for (int t : g.cache) kv_cache_[base_[t]] = 1;
  }
  region_of_.assign(g.ops.size(), -1);
  for (size_t r = 0; r < regions.size(); ++r) {
    for (int i = regions[r].first; i <= regions[r].second; ++i) region_of_[i] = static_cast<int>(r);
  }
  regions_ = regions;
  // The model's own regions carry their kind; a policy's take the config's.
  non_reentrant_.assign(regions.size(), cfg.checkpoint.non_reentrant);
  rng_state_of_.assign(regions.size(), -1);
  if (!g.checkpoints.empty() &&
      regions == CheckpointRegions(g.checkpoints.begin(), g.checkpoints.end())) {
    for (size_t r = 0; r < regions.size(); ++r) non_reentrant_[r] = g.checkpoint_non_reentrant[r];
  }
  main_.Resize(n);
  seen_.assign(n, 0);
  for (size_t i = 0; i < g.ops.size() && !uses_cublas_; ++i) {
    uses_cublas_ = UsesCublas(g.ops[i].kind);
  }
  param_grad_.assign(n, -1);
  pending_.assign(n, Pending{});
  first_reader_.assign(n, -1);
  for (size_t i = g.ops.size(); i-- > 0;) {
    for (int t : g.ops[i].inputs) {
      if (IsGradLeaf(g.tensors[t])) first_reader_[t] = static_cast<int>(i);
    }
  }
  op_saved_.resize(g.ops.size());
  memo_.resize(g.ops.size());
  last_op_ = static_cast<int>(g.ops.size()) - 1;
  loss_ = g.loss;
  // About a context, a few allocations and frees per op, forward and backward.
  s_.events.reserve(g.ops.size() * 12 + g.tensors.size());
  s_.contexts.reserve(g.ops.size() * 2 + 8);
  has_memo_.assign(g.ops.size(), false);
  slot_ready_.assign(g.ops.size(), false);
  hooks_ = MakeRankHooks(opt.rank, g, cfg);
  if (opt.tensor != nullptr) hooks_ = MakeTensorParallelHooks(*opt.tensor, g, cfg, std::move(hooks_));
}

StatusOr<Schedule> StepSimulator::Run() {
  StartOfStep();
  if (opt_.pipeline != nullptr) {
    RunPipeline();
  } else {
    micro_batches_ = training_ && cfg_.grad_accum_steps > 1 ? 2 : 1;
    for (int mb = 0; mb < micro_batches_ && !failed(); ++mb) {
      mb_ = mb;
      RunMicroBatch();
    }
  }
  if (training_ && !failed()) OptimizerStep();
  FillParameterBytes();
  if (failed()) return status_;
  s_.num_buffers = next_buffer_;
  return std::move(s_);
}

void StepSimulator::Context(Phase phase, int op, bool recompute) {
  if (opt_.budget != nullptr && status_.ok()) {
    Status charged = opt_.budget->Charge(1);
    if (!charged.ok()) status_ = std::move(charged);
  }
  s_.contexts.push_back({phase, op, mb_, recompute});
  if (opt_.record_operands) s_.operands.emplace_back();
  s_.events.push_back({EventKind::kContext, Category::kTemporaries,
                       static_cast<int>(s_.contexts.size()) - 1, 0});
}

Category StepSimulator::LeafCategory(const Tensor& t) const {
  switch (t.role) {
    case TensorRole::kParameter: return Category::kParameters;
    case TensorRole::kBuffer: return t.kv_cache ? Category::kKvCache : Category::kParameters;
    case TensorRole::kInput:
    case TensorRole::kTarget: return Category::kInputs;
    case TensorRole::kActivation: break;
  }
  return Category::kTemporaries;
}

void StepSimulator::StartOfStep() {
  Context(Phase::kData, -1);
  for (size_t t = 0; t < g_.tensors.size(); ++t) {
    const Tensor& ten = g_.tensors[t];
    if (ten.role != TensorRole::kParameter && ten.role != TensorRole::kBuffer) continue;
    main_.buffer[t] = NewBuffer(hooks_->ParameterBytes(static_cast<int>(t),
                                                      Bytes(ten.shape, ten.dtype)),
                                LeafCategory(ten));
    main_.pins[t] = 1;
  }
  if (!training_) {
    // An inference step is one of many forwards (an evaluation loop, a server): its cuBLAS
    // handle's workspace is cached from the one before, so it is there before the first op
    // (measured on an H200: ResNet-50's only matmul is its last layer, and the workspace counted
    // in its peak). vLLM's profile run is its process's first forward: allocated at the first
    // matmul, as it happens.
    if (uses_cublas_ && !cfg_.serving.enabled) {
      AllocWorkspace();
      workspace_seen_ = true;
    }
    return;
  }
  hooks_->StepStarts(memory());
  const bool steady = cfg_.step == StepKind::kSteadyState;
  const OptimizerCosts oc = CostsOf(cfg_.optimizer, cfg_.runtime);
  for (size_t t = 0; t < g_.tensors.size(); ++t) {
    const Tensor& p = g_.tensors[t];
    if (p.role != TensorRole::kParameter || !p.requires_grad) continue;
    const Tensor* owned = hooks_->OptimizerParam(g_, static_cast<int>(t));
    if ((steady || oc.state_at_init) && owned != nullptr) AllocOptimizerState(*owned);
    if (steady && !cfg_.zero_grad_set_to_none) {  // zero_grad() keeps zeroed grads
      param_grad_[t] = hooks_->KeptGrad(memory(), static_cast<int>(t), Bytes(p.shape, p.dtype));
    }
  }
  if (steady && uses_cublas_) {  // the forward and the backward thread's handles, both cached
    AllocWorkspace();
    AllocWorkspace();
    workspace_seen_ = workspace_seen_bwd_ = true;
  }
  if (steady && hold_outputs_) CarryOverOutputs();
}

void StepSimulator::AllocWorkspace() {
  if (opt_.cublas_workspace_bytes > 0 && workspaces_ < (training_ ? 2 : 1)) {
    NewBuffer(opt_.cublas_workspace_bytes, Category::kWorkspace);
    ++workspaces_;
  }
}

// The micro-batch's data (in a pipeline, a received activation too).
void StepSimulator::AllocMicroBatchInputs() {
  Context(Phase::kData, -1);
  for (size_t t = 0; t < g_.tensors.size(); ++t) {
    const Tensor& ten = g_.tensors[t];
    if (ten.role != TensorRole::kInput && ten.role != TensorRole::kTarget) continue;
    if (!ReadInRange(static_cast<int>(t))) continue;  // another model chunk's
    main_.buffer[t] = NewBuffer(Bytes(ten.shape, ten.dtype), Category::kInputs);
    main_.pins[t] = 1;
  }
}

void StepSimulator::RunMicroBatch() {
  AllocMicroBatchInputs();
  for (auto& s : op_saved_) s = SavedByOp{};
  graph_held_.clear();
  Forward();
  if (failed()) return;
  if (mb_ == 0) s_.saved_for_backward_bytes = saved_bytes_;
  if (training_ && loss_ >= 0) Backward();
  if (failed()) return;
  EndMicroBatch();
}

// End of the micro-batch: the data batch (with an input's .grad) and whatever the graph still
// holds go, but for the outputs a loop keeps.
void StepSimulator::EndMicroBatch() {
  if (training_ && hold_outputs_) KeepOutputsInLoop();
  for (size_t t = 0; t < g_.tensors.size(); ++t) {
    const Tensor& ten = g_.tensors[t];
    if (ten.role == TensorRole::kParameter || ten.role == TensorRole::kBuffer) continue;
    if (kv_cache_[t]) continue;  // inference: the prompt's cache, which generation goes on from
    if (ten.role == TensorRole::kInput && param_grad_[t] >= 0) {
      FreeBuffer(param_grad_[t]);
      param_grad_[t] = -1;
    }
    if (main_.buffer[t] >= 0) {
      main_.pins[t] = main_.uses[t] = 0;
      while (main_.saved[t] > 0) Unhold(main_, static_cast<int>(t));
      MaybeFree(main_, static_cast<int>(t));
    }
  }
}

OpCall StepSimulator::MakeCall(int i, bool grad) const {
  const Op& op = g_.ops[i];
  OpCall c{op, {}, {}, "", grad, cfg_.runtime, cfg_.cpu_isa, cfg_.cpu_l1_bytes, cfg_.cpu_l2_bytes};
  c.gpu = opt_.gpu;
  c.rule = rules_[i];
  c.inputs.reserve(op.inputs.size());
  for (int t : op.inputs) c.inputs.push_back(&g_.tensors[t]);
  c.outputs.reserve(op.outputs.size());
  for (int t : op.outputs) c.outputs.push_back(&g_.tensors[t]);
  return c;
}

}  // namespace memest
