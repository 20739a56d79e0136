#include "engine/step/schedule.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string_view>
#include <unordered_map>

#include "engine/ir/text.h"
#include "engine/passes/checkpoint_rules.h"
#include "engine/rules/op_rules.h"
#include "engine/step/optimizers.h"
#include "engine/step/python_refs.h"

namespace memest {
namespace {

// Non-overlapping and dense (at::Tensor::is_non_overlapping_and_dense): some permutation of the
// dims has row-major strides. An expanded (stride 0) view is not.
bool IsDense(const Shape& shape, const Strides& strides) {
  std::vector<size_t> dims;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != 1) dims.push_back(i);
  }
  std::sort(dims.begin(), dims.end(), [&](size_t a, size_t b) { return strides[a] < strides[b]; });
  int64_t expected = 1;
  for (size_t d : dims) {
    if (strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

bool UsesCublas(const std::string& kind) {
  return kind == "linear" || kind == "matmul" || kind == "bmm" || kind == "addmm" ||
         kind == "einsum" || kind == "scaled_dot_product_attention";
}

class StepSimulator {
 public:
  StepSimulator(const Graph& g, const RunConfig& cfg, const CheckpointRegions& regions,
                const ScheduleOptions& opt)
      : g_(g), cfg_(cfg), opt_(opt), training_(cfg.mode == Mode::kTraining) {
    const size_t n = g.tensors.size();
    base_.resize(n);
    for (size_t t = 0; t < n; ++t) base_[t] = static_cast<int>(t);
    rules_.reserve(g.ops.size());
    for (const Op& op : g.ops) {
      const OpRule* rule = FindOpRule(op.kind);
      rules_.push_back(rule);
      const bool eval_identity = !training_ && rule && rule->identity_in_eval;
      for (int o : op.outputs) {
        const Tensor& t = g.tensors[o];
        if (t.alias_of >= 0) base_[o] = base_[t.alias_of];
        else if (eval_identity) base_[o] = base_[op.inputs[0]];
      }
    }
    refs_ = PlanPythonRefs(g, base_, cfg.mode);
    region_of_.assign(g.ops.size(), -1);
    for (size_t r = 0; r < regions.size(); ++r) {
      for (int i = regions[r].first; i <= regions[r].second; ++i) region_of_[i] = static_cast<int>(r);
    }
    regions_ = regions;
    // The model's own regions carry their kind; a policy's take the config's.
    non_reentrant_.assign(regions.size(), cfg.checkpoint.non_reentrant);
    rng_state_of_.assign(regions.size(), -1);
    if (!g.checkpoints.empty() && regions == CheckpointRegions(g.checkpoints.begin(), g.checkpoints.end())) {
      for (size_t r = 0; r < regions.size(); ++r) non_reentrant_[r] = g.checkpoint_non_reentrant[r];
    }
    main_.Resize(n);
    seen_.assign(n, 0);
    for (const Op& op : g.ops) uses_cublas_ |= UsesCublas(op.kind);
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
    // About a context, a few allocations and frees per op, forward and backward.
    s_.events.reserve(g.ops.size() * 12 + g.tensors.size());
    s_.contexts.reserve(g.ops.size() * 2 + 8);
    has_memo_.assign(g.ops.size(), false);
  }

  StatusOr<Schedule> Run() {
    StartOfStep();
    micro_batches_ = training_ && cfg_.grad_accum_steps > 1 ? 2 : 1;
    for (int mb = 0; mb < micro_batches_ && !failed(); ++mb) {
      mb_ = mb;
      RunMicroBatch();
    }
    if (training_ && !failed()) OptimizerStep();
    FillParameterBytes();
    if (failed()) return status_;
    s_.num_buffers = next_buffer_;
    return std::move(s_);
  }

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
        if (st.buffer[s] >= 0 && t.role == TensorRole::kActivation && !IsCast(s)) {
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
  int NewBuffer(int64_t bytes, Category c) {
    if ((bytes < 0 || bytes > kMaxBytes) && status_.ok()) {
      status_ = ByteCountTooLarge(CurrentContext(), g_, "one allocation");
    }
    const int id = next_buffer_++;
    s_.events.push_back({EventKind::kAlloc, c, id, bytes});
    return id;
  }
  void FreeBuffer(int id) { s_.events.push_back({EventKind::kFree, Category::kTemporaries, id, 0}); }
  void Retag(int id, Category c) { s_.events.push_back({EventKind::kRetag, c, id, 0}); }
  void Context(Phase phase, int op, bool recompute = false) {
    if (opt_.budget != nullptr && status_.ok()) {
      Status charged = opt_.budget->Charge(1);
      if (!charged.ok()) status_ = std::move(charged);
    }
    s_.contexts.push_back({phase, op, mb_, recompute});
    if (opt_.record_operands) s_.operands.emplace_back();
    s_.events.push_back({EventKind::kContext, Category::kTemporaries,
                         static_cast<int>(s_.contexts.size()) - 1, 0});
  }

  Category LeafCategory(const Tensor& t) const {
    switch (t.role) {
      case TensorRole::kParameter: return Category::kParameters;
      case TensorRole::kBuffer: return t.kv_cache ? Category::kKvCache : Category::kParameters;
      case TensorRole::kInput:
      case TensorRole::kTarget: return Category::kInputs;
      case TensorRole::kActivation: break;
    }
    return Category::kTemporaries;
  }

  void MaybeFree(StorageTable& st, int s) {
    if (st.buffer[s] >= 0 && st.uses[s] <= 0 && st.saved[s] <= 0 && st.pins[s] <= 0) {
      FreeBuffer(st.buffer[s]);
      st.buffer[s] = -1;
    }
  }

  // ---- step structure ----
  void StartOfStep() {
    Context(Phase::kData, -1);
    for (size_t t = 0; t < g_.tensors.size(); ++t) {
      const Tensor& ten = g_.tensors[t];
      if (ten.role != TensorRole::kParameter && ten.role != TensorRole::kBuffer) continue;
      main_.buffer[t] = NewBuffer(Bytes(ten.shape, ten.dtype), LeafCategory(ten));
      main_.pins[t] = 1;
    }
    if (!training_) return;
    // DistributedDataParallel's gradient buckets: made with DDP, kept for its life.
    if (opt_.rank != nullptr) {
      for (const DdpBucket& b : opt_.rank->buckets) NewBuffer(b.bytes, Category::kCommunication);
      if (const auto& z = opt_.rank->zero2) {  // DeepSpeed ZeRO-2's flat partitions
        if (z->master_bytes > 0) NewBuffer(z->master_bytes, Category::kMasterAndCasts);
        if (cfg_.step == StepKind::kSteadyState) NewBuffer(z->state_bytes, Category::kOptimizerState);
      }
    }
    const bool steady = cfg_.step == StepKind::kSteadyState;
    const OptimizerCosts oc = CostsOf(cfg_.optimizer, cfg_.runtime);
    for (size_t t = 0; t < g_.tensors.size(); ++t) {
      const Tensor& p = g_.tensors[t];
      if (p.role != TensorRole::kParameter || !p.requires_grad) continue;
      if ((steady || oc.state_at_init) && OptimizerOwns(t)) AllocOptimizerState(p);
      if (steady && !cfg_.zero_grad_set_to_none) {  // zero_grad() keeps zeroed grads
        param_grad_[t] = GradsInBuckets() ? kGradInBucket
                                          : NewBuffer(Bytes(p.shape, p.dtype), Category::kGradients);
      }
    }
    if (steady && uses_cublas_) {  // the forward and the backward thread's handles, both cached
      AllocWorkspace();
      AllocWorkspace();
      workspace_seen_ = workspace_seen_bwd_ = true;
    }
    if (steady && cfg_.hold_outputs) CarryOverOutputs();
  }

  void AllocOptimizerState(const Tensor& p) {
    const OptimizerCosts oc = CostsOf(cfg_.optimizer, cfg_.runtime);
    // One tensor per state entry: each is rounded by the allocator on its own.
    for (int i = 0; i < oc.state; ++i) NewBuffer(Bytes(p.shape, p.dtype), Category::kOptimizerState);
    for (int64_t bytes : ExtraStateBytes(cfg_.optimizer, p)) {
      NewBuffer(bytes, Category::kOptimizerState);
    }
    if (oc.device_step) NewBuffer(4, Category::kOptimizerState);
  }

  void AllocWorkspace() {
    if (opt_.cublas_workspace_bytes > 0 && workspaces_ < (training_ ? 2 : 1)) {
      NewBuffer(opt_.cublas_workspace_bytes, Category::kWorkspace);
      ++workspaces_;
    }
  }

  void RunMicroBatch() {
    Context(Phase::kData, -1);
    for (size_t t = 0; t < g_.tensors.size(); ++t) {
      const Tensor& ten = g_.tensors[t];
      if (ten.role != TensorRole::kInput && ten.role != TensorRole::kTarget) continue;
      main_.buffer[t] = NewBuffer(Bytes(ten.shape, ten.dtype), Category::kInputs);
      main_.pins[t] = 1;
    }
    for (auto& s : op_saved_) s = SavedByOp{};
    Forward();
    if (failed()) return;
    if (mb_ == 0) s_.saved_for_backward_bytes = saved_bytes_;
    if (training_ && g_.loss >= 0) Backward();
    if (failed()) return;
    // End of the micro-batch: the data batch (with an input's .grad) and whatever the graph
    // still holds go, but for the outputs a loop keeps.
    if (training_ && cfg_.hold_outputs) KeepOutputsInLoop();
    for (size_t t = 0; t < g_.tensors.size(); ++t) {
      const Tensor& ten = g_.tensors[t];
      if (ten.role == TensorRole::kParameter || ten.role == TensorRole::kBuffer) continue;
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

  // ---- forward ----
  void CountUses(StorageTable& st, int first, int last) {
    for (int i = first; i <= last; ++i) ForEachInputStorage(i, [&](int s) { ++st.uses[s]; });
  }

  void Forward() {
    const int n = static_cast<int>(g_.ops.size());
    CountUses(main_, 0, n - 1);
    // The loss is held by the training loop (with hold_outputs, the model's outputs too); in
    // inference the model's output is.
    if (training_ && g_.loss >= 0) ++main_.pins[base_[g_.loss]];
    if (!training_ || cfg_.hold_outputs) {
      for (int s : training_ ? refs_.held_outputs : refs_.outputs) ++main_.pins[s];
    }
    PinRefs(main_, 0, n - 1);
    std::vector<int> cast_cache;
    for (int i = 0; i < n && !failed(); ++i) {
      const bool in_loss = g_.loss_begin >= 0 && i >= g_.loss_begin;
      const int r = region_of_[i];
      if (r >= 0 && regions_[r].first == i) {
        PinRegionInputs(r, +1);
        // torch.utils.checkpoint (preserve_rng_state) keeps the RNG state until the graph is
        // freed: the CPU generator's, a 5056-byte uint8 tensor; on CUDA it lives in host memory.
        if (cfg_.runtime == Runtime::kCpuTorch113 && training_) {
          rng_state_of_[r] = NewBuffer(kCpuRngStateBytes, Category::kActivations);
        }
      }
      const bool grad = training_ && r < 0;
      RunForwardOp(i, main_, grad, in_loss ? Phase::kLoss : Phase::kForward, false, &cast_cache);
      ReleaseRefs(main_, i, 0);
    }
    // Leaving torch.autocast drops its cache of cast weights.
    for (int s : cast_cache) {
      --main_.pins[s];
      MaybeFree(main_, s);
    }
    // `outputs = model(...)` has returned: the loop lets go of the previous ones.
    for (int b : loop_outputs_) FreeBuffer(b);
    loop_outputs_.clear();
  }

  // ---- what the Python program holds (engine/step/python_refs.h) ----
  // Pins the storages made in ops [first, last] whose Python references die after one of them
  // (a recomputed region pins its own; the forward, all).
  void PinRefs(StorageTable& st, int first, int last) {
    for (int i = first; i <= last; ++i) {
      for (int s : refs_.release_after[i]) {
        if (g_.tensors[s].producer >= first) ++st.pins[s];
      }
    }
  }

  // Op i has run: the references PinRefs(st, first, ...) pinned until then die.
  void ReleaseRefs(StorageTable& st, int i, int first) {
    for (int s : refs_.release_after[i]) {
      if (g_.tensors[s].producer < first) continue;
      --st.pins[s];
      MaybeFree(st, s);
    }
  }

  // The end of a micro-batch whose loop keeps its outputs: they leave the graph's table, and
  // live on until the next forward has made new ones.
  void KeepOutputsInLoop() {
    for (int s : refs_.held_outputs) {
      if (main_.buffer[s] >= 0) loop_outputs_.push_back(main_.buffer[s]);
      main_.buffer[s] = -1;
      main_.pins[s] = 0;
    }
  }

  // A steady-state step starts with the previous step's outputs, still held by the loop.
  void CarryOverOutputs() {
    for (int s : refs_.held_outputs) {
      const Tensor& t = g_.tensors[s];
      loop_outputs_.push_back(NewBuffer(Bytes(t.shape, t.dtype), Category::kTemporaries));
    }
  }

  // torch.utils.checkpoint keeps the region's inputs until its backward. Reentrant: they are
  // saved for backward (ctx.save_for_backward) like any tensor autograd keeps. Non-reentrant:
  // the recomputation's closure keeps them alive; autograd saves nothing of the region.
  void PinRegionInputs(int r, int delta) {
    for (int s : RegionInputs(r)) {
      if (!non_reentrant_[r]) {
        if (delta > 0) Hold(main_, s);
        else Unhold(main_, s);
        continue;
      }
      main_.pins[s] += delta;
      if (delta > 0 && g_.tensors[s].role == TensorRole::kActivation && main_.buffer[s] >= 0) {
        Retag(main_.buffer[s], Category::kActivations);
      }
      if (delta < 0) MaybeFree(main_, s);
    }
  }

  std::vector<int> RegionInputs(int r) {
    std::vector<int> out;
    const auto [first, last] = regions_[r];
    ++stamp_;
    for (int i = first; i <= last; ++i) {
      for (int in : g_.ops[i].inputs) {
        const Tensor& t = g_.tensors[in];
        const int s = base_[in];
        const int producer = g_.tensors[s].producer;
        if (t.role == TensorRole::kParameter || t.role == TensorRole::kBuffer) continue;
        if (producer >= first && producer <= last) continue;
        if (seen_[s] == stamp_) continue;
        seen_[s] = stamp_;
        out.push_back(s);
      }
    }
    return out;
  }

  OpCall MakeCall(int i, bool grad) const {
    const Op& op = g_.ops[i];
    OpCall c{op, {}, {}, "", grad, cfg_.runtime, cfg_.cpu_isa};
    for (int t : op.inputs) c.inputs.push_back(&g_.tensors[t]);
    for (int t : op.outputs) c.outputs.push_back(&g_.tensors[t]);
    return c;
  }

  void RunForwardOp(int i, StorageTable& st, bool grad, Phase phase, bool recompute,
                    std::vector<int>* cast_cache) {
    const Op& op = g_.ops[i];
    Context(phase, i, recompute);
    if (!workspace_seen_ && UsesCublas(op.kind)) {
      workspace_seen_ = true;
      AllocWorkspace();
    }
    const OpRule* rule = rules_[i];
    // In eval mode dropout returns its input: no output, no mask.
    OpMemory local;
    if (training_ || !rule || !rule->identity_in_eval) local = OpMemoryOf(MakeCall(i, grad));
    if (grad) {  // backward asks the same rule the same question: keep the answer
      memo_[i] = std::move(local);
      has_memo_[i] = true;
    }
    const OpMemory& mem = grad ? memo_[i] : local;
    const bool weight_cast = op.kind == "to" && HasAttr(op.attrs, "autocast_weight");
    LayerRow* row = mb_ == 0 && !recompute ? &LayerFor(i) : nullptr;
    for (size_t k = 0; k < op.outputs.size(); ++k) {
      const int o = op.outputs[k];
      const int s = base_[o];
      if (s != o || st.buffer[s] >= 0) continue;
      int64_t bytes = Bytes(g_.tensors[o].shape, g_.tensors[o].dtype);
      if (k < mem.output_storage_bytes.size()) bytes = std::max(bytes, mem.output_storage_bytes[k]);
      st.buffer[s] = NewBuffer(bytes, weight_cast ? Category::kMasterAndCasts : Category::kTemporaries);
      if (row) Sum(&row->output_bytes, bytes);
      if (weight_cast && cast_cache) {
        ++st.pins[s];
        cast_cache->push_back(s);
      }
    }
    SavedByOp& saved = op_saved_[i];
    for (const Alloc& a : mem.saved_extras) {
      saved.extras.push_back(NewBuffer(a.bytes, Category::kActivations));
      Sum(&saved.extra_bytes, a.bytes);
      Sum(&saved_bytes_, a.bytes);
      if (row) Sum(&row->saved_bytes, a.bytes);
    }
    std::vector<int> temps;
    int64_t temp_bytes = 0;
    for (const Alloc& a : mem.forward_temps) {
      temps.push_back(NewBuffer(a.bytes, Category::kTemporaries));
      Sum(&temp_bytes, a.bytes);
    }
    if (row) row->temporary_bytes = std::max(row->temporary_bytes, temp_bytes);
    if (opt_.record_operands) {
      OpOperands& rec = s_.operands.back();
      for (int t : op.inputs) rec.inputs.push_back(st.buffer[base_[t]]);
      for (int t : op.outputs) rec.outputs.push_back(st.buffer[base_[t]]);
    }
    for (int b : temps) FreeBuffer(b);
    auto hold = [&](int t) {
      const int s = base_[t];
      if (st.buffer[s] < 0) return;
      if (Hold(st, s) && row && g_.tensors[s].role == TensorRole::kActivation && !IsCast(s)) {
        Sum(&row->saved_bytes, Bytes(g_.tensors[s].shape, g_.tensors[s].dtype));
      }
      saved.holds.emplace_back(&st, s);
    };
    for (int k : mem.saved_inputs) hold(op.inputs[k]);
    for (int k : mem.saved_outputs) hold(op.outputs[k]);
    ForEachInputStorage(i, [&](int s) {
      --st.uses[s];
      MaybeFree(st, s);
    });
    for (int o : op.outputs) MaybeFree(st, base_[o]);
  }

  bool IsCast(int s) const {
    const int p = g_.tensors[s].producer;
    return p >= 0 && g_.ops[p].kind == "to" && HasAttr(g_.ops[p].attrs, "autocast_weight");
  }

  // ---- backward ----
  void Backward() {
    Context(Phase::kBackward, -1);
    if (Zero2()) Zero2BackwardStarts();  // DeepSpeed's optimizer.backward, before loss.backward
    const int loss = g_.loss;
    grads_.push_back({NewBuffer(Bytes(g_.tensors[loss].shape, g_.tensors[loss].dtype),
                            Category::kTemporaries), 1});
    pending_[loss] = {static_cast<int>(grads_.size()) - 1, ContiguousStrides(g_.tensors[loss].shape)};
    for (int i = static_cast<int>(g_.ops.size()) - 1; i >= 0 && !failed(); --i) {
      const int r = region_of_[i];
      if (r >= 0) {
        if (regions_[r].second == i) {
          RecomputeAndBackward(r);
          i = regions_[r].first;
        }
        continue;
      }
      RunBackwardOp(i, false);
    }
    // Leaves whose first reader backward did not reach.
    for (size_t t = 0; t < pending_.size(); ++t) {
      if (IsGradLeaf(g_.tensors[t])) FlushParamGrad(static_cast<int>(t));
    }
    // Nodes that backward never reached are freed with the graph.
    for (auto& saved : op_saved_) ReleaseSaved(saved);
    for (size_t t = 0; t < pending_.size(); ++t) {
      if (pending_[t].grad >= 0) Deref(pending_[t].grad);
      pending_[t] = Pending{};
    }
    if (base_[loss] >= 0) {
      --main_.pins[base_[loss]];
      MaybeFree(main_, base_[loss]);
    }
    // The graph, and the reentrant checkpoints in it, are gone.
    for (int& b : rng_state_of_) {
      if (b >= 0) FreeBuffer(b);
      b = -1;
    }
    if (Zero2()) Zero2BackwardEnds();
  }

  void RecomputeAndBackward(int r) {
    const auto [first, last] = regions_[r];
    bool reached = false;
    for (int i = first; i <= last; ++i) {
      for (int o : g_.ops[i].outputs) reached |= pending_[o].grad >= 0;
    }
    if (!reached) {
      PinRegionInputs(r, -1);
      return;
    }
    StorageTable rt;
    rt.Resize(g_.tensors.size());
    for (int s : RegionInputs(r)) {
      rt.buffer[s] = main_.buffer[s];
      rt.pins[s] = 1;  // owned outside the recomputation
    }
    for (int i = first; i <= last; ++i) {
      for (int in : g_.ops[i].inputs) {
        const int s = base_[in];
        if (rt.buffer[s] < 0 && main_.buffer[s] >= 0 && g_.tensors[s].producer < first) {
          rt.buffer[s] = main_.buffer[s];
          rt.pins[s] = 1;
        }
      }
    }
    const bool reentrant = !non_reentrant_[r];
    // Non-reentrant on PyTorch 2.x stops recomputing once the last tensor backward needs exists.
    int stop = last;
    if (!reentrant && cfg_.runtime == Runtime::kCuda) {
      while (stop > first && !SavesAnything(stop)) --stop;
    }
    CountUses(rt, first, stop);
    PinRefs(rt, first, stop);  // the region's code runs again, with its locals
    std::vector<int> outputs;  // recomputed outputs are held until the region's backward ends
    std::vector<int> held_grads;
    if (reentrant) {
      for (int i = first; i <= last; ++i) {
        for (int o : g_.ops[i].outputs) {
          if (pending_[o].grad >= 0) {
            ++rt.pins[base_[o]];
            outputs.push_back(base_[o]);
          }
        }
      }
      // CheckpointFunction.backward receives the gradients of the region's outputs and holds
      // them until the recomputed region's backward returns.
      for (int i = first; i <= last; ++i) {
        for (int o : g_.ops[i].outputs) {
          if (pending_[o].grad >= 0) {
            ++grads_[pending_[o].grad].refs;
            held_grads.push_back(pending_[o].grad);
          }
        }
      }
    }
    std::vector<int> cast_cache;
    for (int i = first; i <= stop && !failed(); ++i) {
      RunForwardOp(i, rt, true, Phase::kBackward, true, &cast_cache);
      ReleaseRefs(rt, i, first);
      s_.recomputed_ops++;
    }
    for (int s : cast_cache) {
      --rt.pins[s];
      MaybeFree(rt, s);
    }
    for (int i = last; i >= first && !failed(); --i) RunBackwardOp(i, true);
    // PyTorch drops the recomputed graph when the checkpoint's backward returns: ops of the
    // region that backward did not reach (dead branches) let go of what they saved now, while
    // the recomputation's table is still alive.
    for (int i = first; i <= last; ++i) ReleaseSaved(op_saved_[i]);
    for (int s : outputs) {
      --rt.pins[s];
      MaybeFree(rt, s);
    }
    for (int gb : held_grads) Deref(gb);
    PinRegionInputs(r, -1);
    if (!reentrant && rng_state_of_[r] >= 0) {  // the recomputation's closure is gone
      FreeBuffer(rng_state_of_[r]);
      rng_state_of_[r] = -1;
    }
  }

  // Whether op i, run with grad, has autograd keep anything.
  bool SavesAnything(int i) {
    if (!has_memo_[i]) {
      memo_[i] = OpMemoryOf(MakeCall(i, true));
      has_memo_[i] = true;
    }
    const OpMemory& m = memo_[i];
    return !m.saved_inputs.empty() || !m.saved_outputs.empty() || !m.saved_extras.empty();
  }

  void ReleaseSaved(SavedByOp& saved) {
    for (auto [st, s] : saved.holds) Unhold(*st, s);
    for (int b : saved.extras) FreeBuffer(b);
    Sum(&saved_bytes_, -saved.extra_bytes);
    saved = SavedByOp{};
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

  // Strides of the gradient op i hands to input k, or false when aten must copy it (the rule's
  // grad_view; by default the same strides when the ranks match, contiguous otherwise).
  bool PassThroughStrides(int i, int k, const Strides& out_grad, Strides* in_grad) const {
    const Op& op = g_.ops[i];
    const Tensor& in = g_.tensors[op.inputs[k]];
    const Tensor& out = g_.tensors[op.outputs[0]];
    const OpRule* rule = rules_[i];
    if (rule != nullptr && rule->grad_view != nullptr) {
      return rule->grad_view(op, in, out, out_grad, in_grad);
    }
    *in_grad = in.shape.size() == out_grad.size() ? out_grad : ContiguousStrides(in.shape);
    return true;
  }

  void RunBackwardOp(int i, bool recompute) {
    const Op& op = g_.ops[i];
    int incoming = -1;
    for (int o : op.outputs) {
      if (pending_[o].grad >= 0) {
        incoming = o;
        break;
      }
    }
    if (incoming < 0) return;  // not reached by backward
    Context(Phase::kBackward, i, recompute);
    if (!workspace_seen_bwd_ && UsesCublas(op.kind)) {
      workspace_seen_bwd_ = true;
      AllocWorkspace();
    }
    if (!has_memo_[i]) {
      memo_[i] = OpMemoryOf(MakeCall(i, true));
      has_memo_[i] = true;
    }
    const OpMemory& mem = memo_[i];
    const int out0 = op.outputs[0];
    struct Flow {
      int tensor, grad;
      Strides strides;
      bool shared_handle = false;
      int input = 0;  // the op's input index
      bool view = false;
    };
    std::vector<Flow> flows;
    // View-like backwards hand each input a new view; the others the incoming tensor itself.
    const bool new_handles = rules_[i] != nullptr && rules_[i]->backward_makes_views;
    int passed = 0;
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      passed += mem.grad_flow[k] == GradFlow::kPassThrough;
    }
    const int incoming_buffer = grads_[pending_[incoming].grad].buffer;
    std::vector<int> temps;
    auto make_temps = [&] {
      for (const Alloc& a : mem.backward_temps) {
        temps.push_back(NewBuffer(a.bytes, Category::kTemporaries));
      }
      // An expanded incoming gradient (sum's backward) is made dense before the kernel reads it.
      if (mem.backward_needs_dense_grad && pending_[incoming].grad >= 0 &&
          !IsDense(g_.tensors[incoming].shape, pending_[incoming].strides)) {
        const Tensor& o = g_.tensors[incoming];
        temps.push_back(NewBuffer(Bytes(o.shape, o.dtype), Category::kTemporaries));
      }
    };
    // The scratch is made from the incoming gradient, which is gone before the inputs'
    // gradients are made (OpMemory::backward_scratch_consumes_grad).
    const bool consume_first = mem.backward_scratch_consumes_grad && passed == 0;
    if (consume_first) {
      make_temps();
      ReleaseIncomingGrads(op);
    }
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      if (mem.grad_flow[k] == GradFlow::kNone) continue;
      const Tensor& in = g_.tensors[op.inputs[k]];
      if (mem.grad_flow[k] == GradFlow::kPassThrough && pending_[out0].grad >= 0) {
        Strides st;
        if (PassThroughStrides(i, static_cast<int>(k), pending_[out0].strides, &st)) {
          ++grads_[pending_[out0].grad].refs;
          const bool shared = !new_handles && (passed >= 2 || pending_[out0].shared_handle);
          flows.push_back({op.inputs[k], pending_[out0].grad, st, shared, static_cast<int>(k),
                           new_handles || pending_[out0].view});
          continue;
        }
      }
      // A gradient bound for an empty .grad counts as a gradient from the start.
      const bool to_grad = in.role == TensorRole::kParameter && param_grad_[op.inputs[k]] == -1 &&
                           pending_[op.inputs[k]].grad < 0;
      // F.linear runs addmm / matmul on weight.t(): the weight's gradient leaves TBackward as a
      // view (on CUDA, PyTorch 2.x; 1.13's CPU runtime sums out of place anyway).
      const bool weight_view = cfg_.runtime == Runtime::kCuda && k == 1 && op.kind == "linear";
      flows.push_back({op.inputs[k],
                       NewGrad(Bytes(in.shape, in.dtype),
                               to_grad ? Category::kGradients : Category::kTemporaries),
                       ContiguousStrides(in.shape), false, static_cast<int>(k), weight_view});
    }
    if (!consume_first) make_temps();
    if (opt_.record_operands) RecordBackwardOperands(i, incoming_buffer, flows);
    for (int b : temps) FreeBuffer(b);
    ReleaseSaved(op_saved_[i]);
    ReleaseIncomingGrads(op);
    if (!mem.grad_order.empty()) {
      auto rank = [&](const Flow& f) {
        for (size_t r = 0; r < mem.grad_order.size(); ++r) {
          if (mem.grad_order[r] == f.input) return static_cast<int>(r);
        }
        return static_cast<int>(mem.grad_order.size()) + f.input;
      };
      std::stable_sort(flows.begin(), flows.end(),
                       [&](const Flow& a, const Flow& b) { return rank(a) < rank(b); });
    }
    for (Flow& f : flows) Deliver(f.tensor, f.grad, std::move(f.strides), f.shared_handle, f.view);
    for (int t : op.inputs) {
      if (first_reader_[t] == i) FlushParamGrad(t);
    }
  }

  // Drops op's incoming gradients (its outputs' pending gradients).
  void ReleaseIncomingGrads(const Op& op) {
    for (int o : op.outputs) {
      if (pending_[o].grad >= 0) {
        Deref(pending_[o].grad);
        pending_[o] = Pending{};
      }
    }
  }

  // What op i's backward reads (the incoming gradient's buffer, what the op saved) and writes
  // (the gradients of its inputs), as buffers.
  template <typename Flows>
  void RecordBackwardOperands(int i, int incoming_buffer, const Flows& flows) {
    const Op& op = g_.ops[i];
    OpOperands& rec = s_.operands.back();
    rec.output_grad = incoming_buffer;
    auto held = [&](int t) {
      for (auto [st, s] : op_saved_[i].holds) {
        if (s == base_[t]) return st->buffer[s];
      }
      return -1;
    };
    for (int t : op.inputs) rec.inputs.push_back(held(t));
    for (int t : op.outputs) rec.outputs.push_back(held(t));
    rec.input_grads.assign(op.inputs.size(), -1);
    for (const auto& f : flows) {
      for (size_t k = 0; k < op.inputs.size(); ++k) {
        if (op.inputs[k] == f.tensor && rec.input_grads[k] < 0) {
          rec.input_grads[k] = grads_[f.grad].buffer;
          break;
        }
      }
    }
  }

  // A gradient reaching tensor t. It waits in t's InputBuffer, summed with those that reached
  // t before, until every op that reads t has run backward: for an activation that is when t's
  // producer runs backward; a parameter's AccumulateGrad runs once, after its first reader's
  // backward (FlushParamGrad), with the sum of every use (an RNN's weights, tied embeddings).
  void Deliver(int t, int grad, Strides strides, bool shared_handle = false, bool view = false) {
    const Tensor& ten = g_.tensors[t];
    if (!ten.requires_grad) {
      Deref(grad);
      return;
    }
    Pending& p = pending_[t];
    if (p.grad < 0) {
      p = {grad, std::move(strides), shared_handle, view};
    } else if (grads_[p.grad].refs == 1 && !p.view && IsDense(ten.shape, p.strides) &&
               cfg_.runtime != Runtime::kCpuTorch113) {  // 1.13: always old_var + var
      Deref(grad);  // InputBuffer: old_var.add_(var) into the uniquely owned, dense one
    } else {
      const bool param = IsGradLeaf(ten) && param_grad_[t] == -1;
      const int sum = NewGrad(Bytes(ten.shape, ten.dtype),  // old_var + var
                              param ? Category::kGradients : Category::kTemporaries);
      Deref(p.grad);
      Deref(grad);
      p = {sum, ContiguousStrides(ten.shape)};
    }
  }

  // A leaf that requires grad: a parameter, or an input (x.requires_grad_()), whose .grad
  // lives while the input does.
  static bool IsGradLeaf(const Tensor& t) {
    return (t.role == TensorRole::kParameter || t.role == TensorRole::kInput) && t.requires_grad;
  }

  // Runs parameter t's AccumulateGrad on what its InputBuffer holds.
  void FlushParamGrad(int t) {
    Pending& p = pending_[t];
    if (p.grad < 0) return;
    AccumulateGrad(t, p.grad, p.strides, p.shared_handle);
    p = Pending{};
  }

  // AccumulateGrad: a first gradient whose tensor nobody else holds and whose layout matches
  // the parameter's becomes .grad without a copy (and .grad keeps its storage, shared or not,
  // alive: the reference is never given back); otherwise .grad is a copy.
  void AccumulateGrad(int t, int grad, const Strides& strides, bool shared_handle) {
    const Tensor& p = g_.tensors[t];
    if (param_grad_[t] != -1) {  // .grad exists (or is its bucket's view): added in place
      Deref(grad);
      return;
    }
    GradBuf& gb = grads_[grad];
    if (!shared_handle && IsContiguous(p.shape, strides)) {  // stolen into .grad
      param_grad_[t] = gb.buffer;
      Retag(gb.buffer, Category::kGradients);  // a no-op when it was allocated as one
    } else {
      param_grad_[t] = NewBuffer(Bytes(p.shape, p.dtype), Category::kGradients);  // a clone
      Deref(grad);
    }
    // DDP's hook (Reducer::mark_variable_ready_dense) copies the gradient into its bucket on
    // the micro-batch that synchronizes (the last; the others run under no_sync()); with
    // gradient_as_bucket_view .grad then becomes the bucket's view and autograd's tensor goes.
    if (GradsInBuckets() && p.role == TensorRole::kParameter && SyncingMicroBatch()) {
      FreeBuffer(param_grad_[t]);
      param_grad_[t] = kGradInBucket;
    }
    if (Zero2() && p.role == TensorRole::kParameter) Zero2Take(t);
  }

  // DeepSpeed ZeRO-2 (engine/passes/data_parallel.h): reduce_independent_p_g_buckets_and_remove_grads.
  // A bucket that would overflow is reduced first; the gradient is copied into the ipg buffer
  // and autograd's tensor goes.
  void Zero2Take(int t) {
    const DeepSpeedZero2& z = *opt_.rank->zero2;
    const int64_t n = Numel(g_.tensors[t].shape);
    if (ipg_elements_ + n > z.ipg_elements) Zero2Reduce();
    ipg_elements_ += n;
    FreeBuffer(param_grad_[t]);
    param_grad_[t] = -1;
  }

  // reduce_ipg_grads: allreduce_bucket flattens the bucket into a new tensor; the first
  // reduction of a backward makes grads_in_partition.
  void Zero2Reduce() {
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
  void Zero2BackwardStarts() {
    const DeepSpeedZero2& z = *opt_.rank->zero2;
    for (int k = 0; k < z.ipg_buffers; ++k) {
      ipg_buffers_.push_back(NewBuffer(z.ipg_bytes, Category::kCommunication));
    }
  }

  // The epilogue: the last bucket, averaged_gradients (made on the first micro-batch, added
  // into on the later ones through a partition-sized copy), then the ipg buffers and
  // grads_in_partition go.
  void Zero2BackwardEnds() {
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
  void Zero2Step() {
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

  // ---- data parallelism (engine/passes/data_parallel.h) ----
  // param_grad_ of a parameter whose .grad is a view into its DDP bucket.
  static constexpr int kGradInBucket = -2;
  bool Zero2() const { return opt_.rank != nullptr && opt_.rank->zero2.has_value(); }
  bool GradsInBuckets() const { return opt_.rank != nullptr && opt_.rank->grads_in_buckets; }
  bool OptimizerOwns(int t) const { return opt_.rank == nullptr || opt_.rank->OptimizerOwns(t); }
  bool SyncingMicroBatch() const { return mb_ == micro_batches_ - 1; }

  // ---- optimizer ----
  void OptimizerStep() {
    Context(Phase::kOptimizerStep, -1);
    if (Zero2()) Zero2Step();  // its optimizer steps the flat partition, no parameter of its own
    const OptimizerCosts oc = CostsOf(cfg_.optimizer, cfg_.runtime);
    std::vector<const Tensor*> params;
    for (size_t t = 0; t < g_.tensors.size(); ++t) {
      const Tensor& p = g_.tensors[t];
      if (p.role == TensorRole::kParameter && p.requires_grad && param_grad_[t] != -1 &&
          OptimizerOwns(static_cast<int>(t))) {
        params.push_back(&p);
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
    if (impl == OptimizerImpl::kForeach) {
      std::vector<int> scratch;
      for (const Tensor* p : params) {
        const int64_t bytes = ScratchBytes(oc, *p);
        for (int k = 0; k < oc.all_scratch; ++k) {
          scratch.push_back(NewBuffer(bytes, Category::kTemporaries));
        }
      }
      for (int b : scratch) FreeBuffer(b);
    } else if (impl == OptimizerImpl::kForLoop) {
      std::vector<int> carried;  // the previous parameter's scratch that a local still holds
      for (const Tensor* p : params) {
        const int64_t bytes = ScratchBytes(oc, *p);
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
    }
  }

  // The row of op i's scope; ops of one scope are usually adjacent, so the previous op's row is
  // tried before the map.
  LayerRow& LayerFor(int i) {
    const std::string& scope = g_.ops[i].scope;
    if (last_row_ >= 0 && s_.layers[last_row_].scope == scope) return s_.layers[last_row_];
    auto it = layer_index_.find(scope);
    if (it == layer_index_.end()) {
      it = layer_index_.emplace(scope, s_.layers.size()).first;
      s_.layers.push_back(LayerRow{scope});
    }
    last_row_ = static_cast<int>(it->second);
    return s_.layers[last_row_];
  }

  void FillParameterBytes() {
    for (const Tensor& t : g_.tensors) {
      if (t.role != TensorRole::kParameter) continue;
      const size_t dot = t.name.rfind('.');
      const std::string scope = dot == std::string::npos ? "" : t.name.substr(0, dot);
      auto it = layer_index_.find(scope);
      if (it != layer_index_.end()) Sum(&s_.layers[it->second].parameter_bytes, Bytes(t.shape, t.dtype));
    }
  }

  const Graph& g_;
  const RunConfig& cfg_;
  const ScheduleOptions& opt_;
  const bool training_;
  std::vector<int> base_;
  std::vector<const OpRule*> rules_;  // each op's rule, looked up once
  std::vector<int> region_of_;
  CheckpointRegions regions_;
  std::vector<bool> non_reentrant_;  // per region: use_reentrant=False
  StorageTable main_;
  PythonRefs refs_;
  std::vector<int> loop_outputs_;  // buffers of the outputs the training loop holds
  std::vector<int> param_grad_;
  std::vector<int> first_reader_;  // per grad leaf, the first op that reads it (else -1)
  std::vector<GradBuf> grads_;
  std::vector<Pending> pending_;
  std::vector<SavedByOp> op_saved_;
  std::vector<OpMemory> memo_;  // each op's memory behaviour with grad enabled
  std::vector<bool> has_memo_;
  std::map<std::string, size_t> layer_index_;
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
  // DeepSpeed ZeRO-2's buffers while they live (-1: not now).
  int64_t ipg_elements_ = 0;
  std::vector<int> ipg_buffers_;
  int grads_in_partition_ = -1;
  int averaged_ = -1;
  int workspaces_ = 0;
  bool uses_cublas_ = false;
  bool workspace_seen_ = false;
  bool workspace_seen_bwd_ = false;
};

// Scopes by name, each with the indices it has in its list.
using ScopeIndex = std::unordered_map<std::string_view, std::vector<int64_t>>;

ScopeIndex IndexScopes(const std::vector<std::string>& scopes) {
  ScopeIndex index;
  for (size_t j = 0; j < scopes.size(); ++j) index[scopes[j]].push_back(static_cast<int64_t>(j));
  return index;
}

// Calls fn(j) for every indexed scope j that `scope` lies within (ScopeWithin): the scope itself
// and each of its prefixes at a '.' boundary, "" included; linear in the scope's length.
template <typename Fn>
void ForEachEnclosing(const ScopeIndex& index, std::string_view scope, Fn fn) {
  for (size_t cut = 0; cut <= scope.size(); ++cut) {
    if (cut > 0 && cut < scope.size() && scope[cut] != '.') continue;
    const auto it = index.find(scope.substr(0, cut));
    if (it == index.end()) continue;
    for (int64_t j : it->second) fn(j);
  }
}

}  // namespace

StatusOr<CheckpointRegions> PlanCheckpoints(const Graph& g, const CheckpointConfig& cfg) {
  if (!g.checkpoints.empty()) {  // the model's code checkpoints (a traced torch.utils.checkpoint)
    if (cfg.policy != CheckpointPolicy::kNone) {
      return FailedPrecondition("config.checkpoint.policy: the model checkpoints in its own code (" +
                                std::to_string(g.checkpoints.size()) +
                                " regions in model.checkpoints); a policy would checkpoint twice: "
                                "leave it unset");
    }
    return CheckpointRegions(g.checkpoints.begin(), g.checkpoints.end());
  }
  MEMEST_RETURN_IF_ERROR(CheckBlockPolicy(g, cfg));
  CheckpointRegions regions;
  const int end = g.loss_begin >= 0 ? g.loss_begin : static_cast<int>(g.ops.size());
  auto add_run = [&](auto in_region) {
    int start = -1;
    for (int i = 0; i <= end; ++i) {
      const bool in = i < end && in_region(g.ops[i].scope);
      if (in && start < 0) start = i;
      if (!in && start >= 0) {
        regions.emplace_back(start, i - 1);
        start = -1;
      }
    }
  };
  switch (cfg.policy) {
    case CheckpointPolicy::kNone:
      return regions;
    case CheckpointPolicy::kEveryBlock:
    case CheckpointPolicy::kEveryKBlocks:
    case CheckpointPolicy::kSqrtBlocks: {
      const int64_t L = static_cast<int64_t>(g.blocks.size());
      int64_t k = cfg.policy == CheckpointPolicy::kEveryBlock ? 1 : cfg.every_k;
      if (cfg.policy == CheckpointPolicy::kSqrtBlocks) {
        k = std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(L))));
      }
      // Each group of k consecutive blocks is one region, from the first to the last op that
      // runs inside any of its blocks. An op is inside the blocks its scope or one of its
      // prefixes names (ScopeWithin), found by looking each prefix up: linear in the ops.
      const ScopeIndex blocks_of = IndexScopes(g.blocks);
      const int64_t groups = (L - 1) / k + 1;
      std::vector<std::pair<int, int>> span(groups, {-1, -1});
      for (int i = 0; i < end; ++i) {
        ForEachEnclosing(blocks_of, g.ops[i].scope, [&](int64_t j) {
          auto& [first, last] = span[j / k];
          if (first < 0) first = i;
          last = i;
        });
      }
      for (const auto& [first, last] : span) {
        if (first >= 0) regions.emplace_back(first, last);
      }
      break;
    }
    case CheckpointPolicy::kAttentionCore:
      add_run([](const std::string& scope) {
        return scope == "core" || scope.find(".core") != std::string::npos;
      });
      if (regions.empty()) {
        return FailedPrecondition("config.checkpoint.policy: the model has no attention core "
                                  "(scopes named '<...>.core') to checkpoint");
      }
      break;
    case CheckpointPolicy::kScopes: {
      // Each scope's runs of consecutive ops inside it, found in one pass over the ops.
      const ScopeIndex scopes_of = IndexScopes(cfg.scopes);
      const size_t n = cfg.scopes.size();
      std::vector<int> start(n, -1), last(n, -1);
      for (int i = 0; i < end; ++i) {
        ForEachEnclosing(scopes_of, g.ops[i].scope, [&](int64_t k) {
          if (last[k] == i) return;  // the same scope listed twice
          if (start[k] >= 0 && last[k] < i - 1) regions.emplace_back(start[k], last[k]);
          if (start[k] < 0 || last[k] < i - 1) start[k] = i;
          last[k] = i;
        });
      }
      for (size_t k = 0; k < n; ++k) {
        if (start[k] < 0) {
          return InvalidArgument("config.checkpoint.scopes[" + std::to_string(k) +
                                 "]: no op runs in scope " + Quote(cfg.scopes[k]));
        }
        regions.emplace_back(start[k], last[k]);
      }
      std::sort(regions.begin(), regions.end());
      break;
    }
  }
  // Merge overlapping regions (nested scopes).
  CheckpointRegions merged;
  for (const auto& r : regions) {
    if (!merged.empty() && r.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

StatusOr<Schedule> BuildSchedule(const Graph& graph, const RunConfig& config,
                                 const CheckpointRegions& regions, const ScheduleOptions& options) {
  return StepSimulator(graph, config, regions, options).Run();
}

Status ByteCountTooLarge(const StepContext* c, const Graph& g, const std::string& what) {
  std::string where = PhaseName(c != nullptr ? c->phase : Phase::kData);
  if (c != nullptr && c->op >= 0) {
    where += ", op " + g.ops[c->op].kind;
    if (!g.ops[c->op].scope.empty()) where += " in " + g.ops[c->op].scope;
  }
  return InvalidArgument("model, config.batch_size: " + what + " would pass 2^62 bytes (4 EiB) (" +
                         where + "); memest does not represent larger byte counts");
}

}  // namespace memest
