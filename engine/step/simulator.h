// The step simulator: one training (or inference) step of a graph walked as PyTorch runs it,
// writing the Schedule's events. Internal to engine/step (BuildSchedule in schedule.cc is its
// only user; nothing outside engine/step includes this header).
//
// One class over one step state (the storage tables, pending gradients, what each op saved, the
// schedule being written), with its phases in their own files:
//   simulator.cc       construction, Run, events, the step's structure, the micro-batch
//   forward.cc         forward op by op, what the Python program holds, checkpoint region inputs
//   backward.cc        backward, recompute, gradient delivery (InputBuffer, AccumulateGrad)
//   optimizer_step.cc  the optimizer step and the layer table's parameter bytes
// The small helpers every phase calls (holds, checked sums, events) stay inline here.
#ifndef MEMEST_ENGINE_STEP_SIMULATOR_H_
#define MEMEST_ENGINE_STEP_SIMULATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/shape.h"
#include "engine/ir/status.h"
#include "engine/passes/data_parallel.h"
#include "engine/report/report.h"
#include "engine/rules/op_rules.h"
#include "engine/step/python_refs.h"
#include "engine/step/rank_hooks.h"
#include "engine/step/schedule.h"

namespace memest {

// Whether an op of this kind calls cuBLAS (and so needs the cuBLAS workspace).
inline bool UsesCublas(std::string_view kind) {
  return kind == "linear" || kind == "matmul" || kind == "bmm" || kind == "addmm" ||
         kind == "einsum" || kind == "scaled_dot_product_attention" || kind == "linear_4bit";
}

class StepSimulator : private RankMemory {
 public:
  // folded: simulate a pipeline stage's PipelineFold rather than its whole schedule.
  StepSimulator(const Graph& g, const RunConfig& cfg, const CheckpointRegions& regions,
                const ScheduleOptions& opt, bool folded = false);
  StatusOr<Schedule> Run();

 private:
  struct StorageTable {
    std::vector<int> buffer, uses, saved, pins;
    void Resize(size_t n) {
      buffer.assign(n, -1);
      uses.assign(n, 0);
      saved.assign(n, 0);
      pins.assign(n, 0);
    }
  };
  struct GradBuf {
    int buffer = -1;
    int refs = 0;
  };
  struct Pending {
    int grad = -1;  // index into grads_
    Strides strides;
    // The same tensor object reached more than one input (add hands its incoming gradient to
    // both operands): AccumulateGrad then copies it. A view of a shared storage (a slice of
    // cat's gradient) is a handle of its own, and is stolen.
    bool shared_handle = false;
    // A view of another tensor, which it keeps alive (a view-making backward's output; linear's
    // weight gradient, which TBackward hands on as grad.t()): its storage has two owners, so
    // PyTorch 2.x's InputBuffer never adds a second gradient into it in place
    // (can_accumulate_inplace wants the storage's use count to be 1).
    bool view = false;
  };
  struct SavedByOp {
    std::vector<std::pair<StorageTable*, int>> holds;
    std::vector<int> extras;
    int64_t extra_bytes = 0;
  };
  // A pipeline's micro-batch between its forward and its backward: what it holds, swapped out
  // of main_ and op_saved_ (its holds name &main_, so they are only used while it is back in).
  struct InFlight {
    StorageTable table;
    std::vector<SavedByOp> saved;
    std::vector<SavedByOp> graph_held;
    std::vector<int> rng_state_of;
    int stub = -1;  // the sent output's one-element stub (deallocate_output_tensor)
  };

  // ---- holds, checked sums and events: every phase calls them ----
  // Autograd starts holding storage s (a tensor saved for backward, or a checkpoint's input);
  // true when it was not held before. Activations then count as such, and every storage but
  // parameters and buffers counts toward the bytes saved for backward.
  bool Hold(StorageTable& st, int s) {
    if (st.saved[s]++ > 0) return false;
    const Tensor& t = g_.tensors[s];
    if (t.role == TensorRole::kParameter || t.role == TensorRole::kBuffer) return true;
    Sum(&saved_bytes_, Bytes(t.shape, t.dtype));
    if (t.role == TensorRole::kActivation && !(st.pins[s] > 0 && IsCast(s))) {
      Retag(st.buffer[s], Category::kActivations);
    }
    return true;
  }

  // Autograd lets go of storage s; it is freed when nothing else needs it.
  void Unhold(StorageTable& st, int s) {
    if (--st.saved[s] == 0) {
      const Tensor& t = g_.tensors[s];
      if (t.role != TensorRole::kParameter && t.role != TensorRole::kBuffer) {
        Sum(&saved_bytes_, -Bytes(t.shape, t.dtype));
        // A recomputation's table shares the storages made before its region with main_,
        // whose holds and pins say what they are.
        const bool shared = &st != &main_ && main_.buffer[s] == st.buffer[s] &&
                            (main_.saved[s] > 0 || main_.pins[s] > 0);
        if (st.buffer[s] >= 0 && t.role == TensorRole::kActivation && !IsCast(s) && !shared) {
          Retag(st.buffer[s], Category::kTemporaries);
        }
      }
    }
    MaybeFree(st, s);
  }

  // ---- checked sums and the budget ----
  // Adds `bytes` to a running total; past kMaxBytes the step is refused (the total is left as it
  // was, so the simulation can run on harmlessly to the next check of status_).
  void Sum(int64_t* total, int64_t bytes) {
    if (!AddBytes(total, bytes) && status_.ok()) {
      status_ = ByteCountTooLarge(CurrentContext(), g_, "a sum of bytes the step keeps");
    }
  }
  const StepContext* CurrentContext() const {
    return s_.contexts.empty() ? nullptr : &s_.contexts.back();
  }
  bool failed() const { return !status_.ok(); }

  // ---- events ----
  int NewBuffer(int64_t bytes, Category c, int stream = kDefaultStream) {
    if ((bytes < 0 || bytes > kMaxBytes) && status_.ok()) {
      status_ = ByteCountTooLarge(CurrentContext(), g_, "one allocation");
    }
    const int id = next_buffer_++;
    s_.events.push_back({EventKind::kAlloc, c, id, bytes, static_cast<uint8_t>(stream)});
    return id;
  }
  void FreeBuffer(int id) {
    s_.events.push_back({EventKind::kFree, Category::kTemporaries, id, 0});
  }
  void Retag(int id, Category c) { s_.events.push_back({EventKind::kRetag, c, id, 0}); }

  void MaybeFree(StorageTable& st, int s) {
    if (st.buffer[s] >= 0 && st.uses[s] <= 0 && st.saved[s] <= 0 && st.pins[s] <= 0) {
      FreeBuffer(st.buffer[s]);
      st.buffer[s] = -1;
    }
  }

  // Calls fn(s) once for each distinct storage s among op i's inputs, in input order: by a
  // pairwise look for the usual few inputs, by a stamp per storage for many (a cat of thousands
  // of tensors), so that the cost stays linear in the inputs.
  template <typename Fn>
  void ForEachInputStorage(int i, Fn fn) {
    const std::vector<int>& in = g_.ops[i].inputs;
    if (in.size() <= 8) {
      for (size_t k = 0; k < in.size(); ++k) {
        const int s = base_[in[k]];
        bool dup = false;
        for (size_t j = 0; j < k; ++j) dup |= base_[in[j]] == s;
        if (!dup) fn(s);
      }
      return;
    }
    ++stamp_;
    for (int t : in) {
      const int s = base_[t];
      if (seen_[s] == stamp_) continue;
      seen_[s] = stamp_;
      fn(s);
    }
  }

  // Whether storage s is autocast's cast of a weight (WeightCast of its producer).
  bool IsCast(int s) const {
    const int p = g_.tensors[s].producer;
    return p >= 0 && weight_cast_[p];
  }
  // Whether op i is autocast's cast of a weight ("to" with autocast_weight), which its cache
  // keeps until autocast exits.
  static bool WeightCast(const Op& op) {
    return std::string_view(op.kind) == "to" && HasAttr(op.attrs, "autocast_weight");
  }

  int NewGrad(int64_t bytes, Category category = Category::kTemporaries) {
    grads_.push_back({NewBuffer(bytes, category), 1});
    return static_cast<int>(grads_.size()) - 1;
  }
  void Deref(int g) {
    if (--grads_[g].refs == 0 && grads_[g].buffer >= 0) {
      FreeBuffer(grads_[g].buffer);
      grads_[g].buffer = -1;
    }
  }

  // A leaf that requires grad: a parameter, or an input (x.requires_grad_()), whose .grad
  // lives while the input does.
  static bool IsGradLeaf(const Tensor& t) {
    return (t.role == TensorRole::kParameter || t.role == TensorRole::kInput) && t.requires_grad;
  }

  // ---- the rank's strategy (engine/step/rank_hooks.h): what its hooks may do ----
  using RankMemory::Allocate;
  int Allocate(int64_t bytes, Category category, int stream) override {
    return NewBuffer(bytes, category, stream);
  }
  void Deallocate(int buffer) override { FreeBuffer(buffer); }
  bool HasOwnGrad(int t) const override { return param_grad_[t] >= 0; }
  void ReleaseGrad(int t, bool into_rank_buffer) override {
    if (param_grad_[t] >= 0) FreeBuffer(param_grad_[t]);
    param_grad_[t] = into_rank_buffer ? kGradInRankBuffer : kNoGrad;
  }
  bool LastMicroBatch() const override { return mb_ == micro_batches_ - 1; }
  RankMemory& memory() { return *this; }

  // ---- construction, events, the step's structure, the micro-batch (simulator.cc) ----
  void Context(Phase phase, int op, bool recompute = false);
  Category LeafCategory(const Tensor& t) const;
  void StartOfStep();
  void AllocWorkspace();
  void AllocMicroBatchInputs();
  void RunMicroBatch();
  void EndMicroBatch();
  void RunPipeline();
  OpCall MakeCall(int i, bool grad) const;

  // ---- forward, what the Python program holds, region inputs (forward.cc) ----
  void CountUses(StorageTable& st, int first, int last);
  // Whether an op in [first_op_, last_op_] reads tensor t (always, for the whole graph).
  bool ReadInRange(int t) const;
  void Forward();
  void PinRefs(StorageTable& st, int first, int last);
  void ReleaseRefs(StorageTable& st, int i, int first);
  void KeepOutputsInLoop();
  void CarryOverOutputs();
  void PinRegionInputs(int r, int delta);
  std::vector<int> RegionInputs(int r);
  void RunForwardOp(int i, StorageTable& st, bool grad, Phase phase, bool recompute,
                    std::vector<int>* cast_cache);
  LayerRow& LayerFor(int i);

  // ---- backward, recompute, gradient delivery (backward.cc) ----
  void Backward();
  void RecomputeAndBackward(int r);
  void ClearRecomputeTable(int first, int last);
  bool SavesAnything(int i);
  // Op i's memory behaviour with grad enabled (memo_, computed once).
  const OpMemory& GradMemory(int i);
  void ReleaseSaved(SavedByOp& saved);
  bool PassThroughStrides(int i, int k, const Strides& out_grad, Strides* in_grad) const;
  void RunBackwardOp(int i, bool recompute);
  void ReleaseIncomingGrads(const Op& op);
  template <typename Flows>  // defined in backward.cc, its only caller
  void RecordBackwardOperands(int i, int incoming_buffer, const Flows& flows);
  void Deliver(int t, int grad, Strides strides, bool shared_handle = false, bool view = false);
  void FlushParamGrad(int t);
  void AccumulateGrad(int t, int grad, const Strides& strides, bool shared_handle);

  // ---- the optimizer step and parameter bytes (optimizer_step.cc) ----
  void AllocOptimizerState(const Tensor& p);  // p: the tensor the state takes the shape of
  void OptimizerStep();
  void FillParameterBytes();

  const Graph& g_;
  const RunConfig& cfg_;
  const ScheduleOptions& opt_;
  const bool training_;
  const bool hold_outputs_;  // the loop holds the model's outputs (not in a pipeline's schedule)
  const bool folded_;        // the pipeline stage's fold is simulated
  std::vector<int> base_;
  std::vector<const OpRule*> rules_;  // each op's rule, looked up once
  std::vector<char> weight_cast_;     // per op: WeightCast
  std::vector<int> region_of_;
  CheckpointRegions regions_;
  std::vector<bool> non_reentrant_;  // per region: use_reentrant=False
  StorageTable main_;
  StorageTable recompute_;  // a checkpointed region's recomputation (RecomputeAndBackward)
  PythonRefs refs_;
  // Per storage: the prompt's KV cache the forward returns in inference (Graph::cache), counted
  // as kv_cache.
  std::vector<char> kv_cache_;
  std::vector<int> loop_outputs_;  // buffers of the outputs the training loop holds
  std::vector<int> param_grad_;
  std::vector<int> first_reader_;  // per grad leaf, the first op that reads it (else -1)
  std::vector<GradBuf> grads_;
  std::vector<Pending> pending_;
  std::vector<SavedByOp> op_saved_;
  // What the first forward of non-reentrant checkpointed regions kept as nodes' attributes,
  // released when the graph is (OpMemory::saved_until_graph_freed).
  std::vector<SavedByOp> graph_held_;
  // Each op's memory behaviour with grad enabled, computed once: in memo_[memo_slot_[i]], the
  // slot of the op it is a copy of when the two are alike to the rules (Graph::copy_of), its
  // own otherwise. has_memo_[i]: op i has asked (it ran with grad, or GradMemory); slot_ready_:
  // the slot holds the answer.
  std::vector<OpMemory> memo_;
  std::vector<int> memo_slot_;
  std::vector<bool> has_memo_;
  std::vector<bool> slot_ready_;
  std::unordered_map<std::string, size_t> layer_index_;  // scope -> its row in s_.layers
  Schedule s_;
  static constexpr int64_t kCpuRngStateBytes = 5056;  // torch.get_rng_state() on the CPU
  // Per region: the RNG state its checkpoint keeps (-1: none). A reentrant checkpoint's node
  // keeps it until the graph is freed; a non-reentrant one's recomputation closure, until the
  // region's backward has run.
  std::vector<int> rng_state_of_;
  int last_row_ = -1;
  std::vector<unsigned> seen_;  // per storage: the stamp_ of the last pass that met it
  unsigned stamp_ = 0;
  int64_t saved_bytes_ = 0;  // held for backward now: storages (not parameters) and extras
  Status status_;            // the first refusal: a sum past kMaxBytes, or the budget's
  int next_buffer_ = 0;
  int mb_ = 0;
  int micro_batches_ = 1;  // simulated: the first and, with accumulation, a later one
  // The ops a forward and a backward run, and the tensor backward starts from: the whole graph
  // and its loss, or one model chunk of an interleaved pipeline stage and what it sends on.
  int first_op_ = 0;
  int last_op_ = -1;
  int loss_ = -1;
  std::unique_ptr<RankHooks> hooks_;  // the rank's strategy
  int received_grad_ = -1;  // a pipeline stage's received output gradient, before its backward
  int workspaces_ = 0;
  bool uses_cublas_ = false;
  bool workspace_seen_ = false;
  bool workspace_seen_bwd_ = false;
};

}  // namespace memest

#endif  // MEMEST_ENGINE_STEP_SIMULATOR_H_
