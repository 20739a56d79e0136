// Tensor parallelism's buffers beside the step (engine/passes/tensor_parallel.h), wrapped
// around the data-parallel strategy's hooks: the graph the simulator walks is already the
// rank's; what is left is what Megatron keeps outside it.
// - The global memory buffer (megatron/core/utils.py GlobalMemoryBuffer.get_tensor): made by the
//   first sequence-parallel all-gather of the process and kept; a steady-state step starts
//   with it.
// - finalize_model_grads' _allreduce_layernorm_grads under sequence parallelism: the gradients
//   of the `sequence_parallel` parameters flattened into one new tensor, all-reduced and copied
//   back, after the step's last backward (after the data-parallel synchronisation).
// Under DTensor's layers neither exists; what does is a zeroed whole-table gradient kept by
// zero_grad(set_to_none=False), and the optimizer's redistributions (TensorParallelView).
#include "engine/step/rank_hooks.h"

#include "engine/passes/tensor_parallel.h"

namespace memest {

namespace {

class TensorParallelHooks : public RankHooks {
 public:
  TensorParallelHooks(const TensorParallelView& view, const Graph& graph, bool steady,
                      std::unique_ptr<RankHooks> inner)
      : view_(view), steady_(steady), inner_(std::move(inner)) {
    for (int p : view.sequence_parallel_params) {
      (void)AddBytes(&replicated_grad_bytes_, Bytes(graph.tensors[p].shape, graph.tensors[p].dtype));
    }
  }

  int64_t ParameterBytes(int t, int64_t whole) const override {
    return inner_->ParameterBytes(t, whole);
  }
  const Tensor* OptimizerParam(const Graph& g, int t) const override {
    return inner_->OptimizerParam(g, t);
  }
  bool HoldsGrad(int t) const override { return inner_->HoldsGrad(t); }
  int64_t OptimizerScratch(int t) const override {
    int64_t bytes = inner_->OptimizerScratch(t);
    // A strategy that holds the sharded gradient (FSDP2) redistributed it to the parameter's
    // placement before reducing it: the optimizer reads a gradient placed as its parameter.
    if (inner_->HoldsGrad(t)) return bytes;
    for (const TensorParallelView::ParamBytes& p : view_.optimizer_scratch) {
      if (p.param == t) (void)AddBytes(&bytes, p.bytes);
    }
    return bytes;
  }
  int KeptGrad(RankMemory& m, int t, int64_t whole) override {
    for (const TensorParallelView::ParamBytes& p : view_.whole_grads) {
      if (p.param == t) whole = p.bytes;
    }
    return inner_->KeptGrad(m, t, whole);
  }
  void StepStarts(RankMemory& m) override {
    inner_->StepStarts(m);
    if (steady_) MakeBuffer(m);
  }
  void ForwardOpStarts(RankMemory& m, int op) override {
    inner_->ForwardOpStarts(m, op);
    if (op == view_.first_gather_op) MakeBuffer(m);
  }
  void ForwardOpEnds(RankMemory& m, int op) override { inner_->ForwardOpEnds(m, op); }
  void BackwardStarts(RankMemory& m) override { inner_->BackwardStarts(m); }
  void BackwardReaches(RankMemory& m, int op) override { inner_->BackwardReaches(m, op); }
  void BackwardRecomputes(RankMemory& m, int first_op, int last_op) override {
    inner_->BackwardRecomputes(m, first_op, last_op);
  }
  void GradReady(RankMemory& m, int t) override { inner_->GradReady(m, t); }
  void BackwardEnds(RankMemory& m) override {
    inner_->BackwardEnds(m);
    if (replicated_grad_bytes_ > 0 && m.LastMicroBatch()) {
      m.Deallocate(m.Allocate(replicated_grad_bytes_, Category::kCommunication));
    }
  }
  void OptimizerStepStarts(RankMemory& m) override { inner_->OptimizerStepStarts(m); }

 private:
  void MakeBuffer(RankMemory& m) {
    if (made_ || view_.global_buffer_bytes == 0) return;
    m.Allocate(view_.global_buffer_bytes, Category::kCommunication);
    made_ = true;
  }

  const TensorParallelView& view_;
  bool steady_;
  std::unique_ptr<RankHooks> inner_;
  int64_t replicated_grad_bytes_ = 0;
  bool made_ = false;
};

}  // namespace

std::unique_ptr<RankHooks> MakeTensorParallelHooks(const TensorParallelView& view,
                                                   const Graph& graph, const RunConfig& config,
                                                   std::unique_ptr<RankHooks> inner) {
  return std::make_unique<TensorParallelHooks>(view, graph, config.step == StepKind::kSteadyState,
                                               std::move(inner));
}

}  // namespace memest
