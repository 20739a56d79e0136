// The step simulator's backward: ops in reverse, checkpointed regions recomputed, gradients
// delivered into InputBuffers and AccumulateGrad (engine/step/simulator.h).
#include <algorithm>
#include <cassert>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/step/simulator.h"

namespace memest {

using namespace std::string_view_literals;  // kind == "linear"sv: lengths first

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

// Whether `strides` lay out `shape` as `want` does: equal on every dim larger than one.
bool SameLayout(const Shape& shape, const Strides& strides, const Strides& want) {
  if (strides.size() != shape.size() || want.size() != shape.size()) return false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] > 1 && strides[d] != want[d]) return false;
  }
  return true;
}

}  // namespace

void StepSimulator::Backward() {
  Context(Phase::kBackward, -1);
  hooks_->BackwardStarts(memory());
  const int loss = loss_;
  // The seed, torch.ones_like(loss): torch.autograd.backward keeps it (grad_tensors_, a local
  // of the Python call) until the engine returns, so it lives through the whole backward. A
  // pipeline stage's is the gradient it received, perhaps before this backward began.
  const int seed_buffer = received_grad_ >= 0
                              ? received_grad_
                              : NewBuffer(Bytes(g_.tensors[loss].shape, g_.tensors[loss].dtype),
                                          Category::kTemporaries);
  received_grad_ = -1;
  grads_.push_back({seed_buffer, 2});
  const int seed = static_cast<int>(grads_.size()) - 1;
  pending_[loss] = {seed, ContiguousStrides(g_.tensors[loss].shape)};
  for (int i = last_op_; i >= first_op_ && !failed(); --i) {
    hooks_->BackwardReaches(memory(), i);
    const int r = region_of_[i];
    if (r >= 0) {
      if (regions_[r].second == i) {
        hooks_->BackwardRecomputes(memory(), regions_[r].first, regions_[r].second);
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
  // Nodes that backward never reached are freed with the graph, and what nodes kept as their
  // attributes (OpMemory::saved_until_graph_freed), unless the loop keeps the graph with its
  // outputs: then those stay until it lets the outputs go (KeepOutputsInLoop).
  const bool graph_kept = training_ && hold_outputs_;
  for (size_t i = 0; i < op_saved_.size(); ++i) {
    if (graph_kept && has_memo_[i] && memo_[memo_slot_[i]].saved_until_graph_freed) {
      graph_held_.push_back(std::move(op_saved_[i]));
      op_saved_[i] = SavedByOp{};
    } else {
      ReleaseSaved(op_saved_[i]);
    }
  }
  if (!graph_kept) {
    for (auto& saved : graph_held_) ReleaseSaved(saved);
    graph_held_.clear();
  }
  for (size_t t = 0; t < pending_.size(); ++t) {
    if (pending_[t].grad >= 0) Deref(pending_[t].grad);
    pending_[t] = Pending{};
  }
  Deref(seed);  // loss.backward() returns
  if (base_[loss] >= 0) {
    --main_.pins[base_[loss]];
    MaybeFree(main_, base_[loss]);
  }
  // The graph, and the reentrant checkpoints in it, are gone.
  for (int& b : rng_state_of_) {
    if (b >= 0) FreeBuffer(b);
    b = -1;
  }
  hooks_->BackwardEnds(memory());
}

void StepSimulator::RecomputeAndBackward(int r) {
  const auto [first, last] = regions_[r];
  bool reached = false;
  for (int i = first; i <= last; ++i) {
    for (int o : g_.ops[i].outputs) reached |= pending_[o].grad >= 0;
  }
  if (!reached) {
    PinRegionInputs(r, -1);
    return;
  }
  // One table serves every recomputation, cleared after each where the region touched it (a
  // table per region, made whole, cost the step time quadratic in its depth).
  StorageTable& rt = recompute_;
  if (rt.buffer.size() != g_.tensors.size()) rt.Resize(g_.tensors.size());
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
  // A non-reentrant recomputation's graph is dropped once it has run: what its nodes kept as
  // attributes goes with it (backward uses the first forward's, graph_held_).
  for (int i = first; i <= stop && !reentrant; ++i) {
    if (GradMemory(i).saved_until_graph_freed) ReleaseSaved(op_saved_[i]);
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
  ClearRecomputeTable(first, last);
  PinRegionInputs(r, -1);
  if (!reentrant && rng_state_of_[r] >= 0) {  // the recomputation's closure is gone
    FreeBuffer(rng_state_of_[r]);
    rng_state_of_[r] = -1;
  }
}

// Resets the recomputation table's entries for the storages ops [first, last] read and write,
// the only ones a region's recomputation and backward touch.
void StepSimulator::ClearRecomputeTable(int first, int last) {
  StorageTable& rt = recompute_;
  auto clear = [&](int t) {
    const int s = base_[t];
    rt.buffer[s] = -1;
    rt.uses[s] = rt.saved[s] = rt.pins[s] = 0;
  };
  for (int i = first; i <= last; ++i) {
    for (int t : g_.ops[i].inputs) clear(t);
    for (int t : g_.ops[i].outputs) clear(t);
  }
#ifndef NDEBUG
  for (size_t s = 0; s < rt.buffer.size(); ++s) {
    assert(rt.buffer[s] == -1 && rt.uses[s] == 0 && rt.saved[s] == 0 && rt.pins[s] == 0);
  }
#endif
}

const OpMemory& StepSimulator::GradMemory(int i) {
  const int slot = memo_slot_[i];
  if (!slot_ready_[slot]) {
    memo_[slot] = OpMemoryOf(MakeCall(i, true));
    slot_ready_[slot] = true;
  }
  has_memo_[i] = true;
  return memo_[slot];
}

// Whether op i, run with grad, has autograd keep anything through save_for_backward (what a
// node keeps as its attributes the recomputation does not make for backward).
bool StepSimulator::SavesAnything(int i) {
  const OpMemory& m = GradMemory(i);
  return !m.saved_until_graph_freed &&
         (!m.saved_inputs.empty() || !m.saved_outputs.empty() || !m.saved_extras.empty());
}

void StepSimulator::ReleaseSaved(SavedByOp& saved) {
  for (auto [st, s] : saved.holds) Unhold(*st, s);
  for (int b : saved.extras) {
    if (b >= 0) FreeBuffer(b);  // -1: released already (OpMemory::first_node_releases)
  }
  Sum(&saved_bytes_, -saved.extra_bytes);
  saved = SavedByOp{};
}

// Strides of the gradient op i hands to input k, or false when aten must copy it (the rule's
// grad_view; by default the same strides when the ranks match, contiguous otherwise).
bool StepSimulator::PassThroughStrides(int i, int k, const Strides& out_grad,
                                       Strides* in_grad) const {
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

void StepSimulator::RunBackwardOp(int i, bool recompute) {
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
  const OpMemory& mem = GradMemory(i);
  const int out0 = op.outputs[0];
  struct Flow {
    int tensor, grad;
    Strides strides;
    bool shared_handle = false;
    int input = 0;  // the op's input index
    bool view = false;
  };
  absl::InlinedVector<Flow, 4> flows;
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
    // An expanded incoming gradient (sum's backward) is made dense, or a view that is not
    // row-major contiguous (a transpose's backward) contiguous, before the kernel reads it.
    const Strides& in_strides = pending_[incoming].strides;
    const Shape& in_shape = g_.tensors[incoming].shape;
    const bool in_layout = mem.backward_grad_strides.empty()
                               ? IsContiguous(in_shape, in_strides)
                               : SameLayout(in_shape, in_strides, mem.backward_grad_strides);
    if (pending_[incoming].grad >= 0 &&
        ((mem.backward_needs_dense_grad && !IsDense(in_shape, in_strides)) ||
         (mem.backward_needs_contiguous_grad && !in_layout))) {
      const Tensor& o = g_.tensors[incoming];
      temps.push_back(NewBuffer(Bytes(o.shape, o.dtype), Category::kTemporaries));
    }
  };
  // The scratch is made from the incoming gradient, which is gone before the inputs'
  // gradients are made (OpMemory::backward_scratch_consumes_grad).
  const bool consume_first = mem.backward_scratch_consumes_grad && passed == 0;
  if (consume_first) {
    std::vector<int> first;
    for (const Alloc& a : mem.backward_first_temps) {
      first.push_back(NewBuffer(a.bytes, Category::kTemporaries));
    }
    SavedByOp& saved = op_saved_[i];
    for (int e : mem.first_node_releases) {
      if (e < 0 || e >= static_cast<int>(saved.extras.size()) || saved.extras[e] < 0) continue;
      FreeBuffer(saved.extras[e]);
      saved.extras[e] = -1;
      Sum(&saved.extra_bytes, -mem.saved_extras[e].bytes);
      Sum(&saved_bytes_, -mem.saved_extras[e].bytes);
    }
    make_temps();
    for (int b : first) FreeBuffer(b);
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
    const bool to_grad = in.role == TensorRole::kParameter && param_grad_[op.inputs[k]] == kNoGrad &&
                         pending_[op.inputs[k]].grad < 0;
    // F.linear runs addmm / matmul on weight.t(): the weight's gradient leaves TBackward as a
    // view (on CUDA, PyTorch 2.x; 1.13's CPU runtime sums out of place anyway).
    const bool weight_view = cfg_.runtime == Runtime::kCuda && k == 1 && op.kind == "linear"sv;
    const bool own_layout = k < mem.fresh_grad_strides.size() && !mem.fresh_grad_strides[k].empty();
    const int64_t bytes = k < mem.fresh_grad_bytes.size() && mem.fresh_grad_bytes[k] > 0
                              ? mem.fresh_grad_bytes[k]
                              : Bytes(in.shape, in.dtype);
    flows.push_back({op.inputs[k],
                     NewGrad(bytes,
                             to_grad ? Category::kGradients : Category::kTemporaries),
                     own_layout ? mem.fresh_grad_strides[k] : ContiguousStrides(in.shape), false,
                     static_cast<int>(k), weight_view});
  }
  if (!consume_first) make_temps();
  if (opt_.record_operands) RecordBackwardOperands(i, incoming_buffer, flows);
  for (int b : temps) FreeBuffer(b);
  if (!mem.saved_until_graph_freed) ReleaseSaved(op_saved_[i]);  // else the graph's end
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
void StepSimulator::ReleaseIncomingGrads(const Op& op) {
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
void StepSimulator::RecordBackwardOperands(int i, int incoming_buffer, const Flows& flows) {
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
void StepSimulator::Deliver(int t, int grad, Strides strides, bool shared_handle, bool view) {
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
    const bool param = IsGradLeaf(ten) && param_grad_[t] == kNoGrad;
    const int sum = NewGrad(Bytes(ten.shape, ten.dtype),  // old_var + var
                            param ? Category::kGradients : Category::kTemporaries);
    Deref(p.grad);
    Deref(grad);
    p = {sum, ContiguousStrides(ten.shape)};
  }
}

// Runs parameter t's AccumulateGrad on what its InputBuffer holds.
void StepSimulator::FlushParamGrad(int t) {
  Pending& p = pending_[t];
  if (p.grad < 0) return;
  AccumulateGrad(t, p.grad, p.strides, p.shared_handle);
  p = Pending{};
}

// AccumulateGrad: a first gradient whose tensor nobody else holds and whose layout matches
// the parameter's becomes .grad without a copy (and .grad keeps its storage, shared or not,
// alive: the reference is never given back); otherwise .grad is a copy.
void StepSimulator::AccumulateGrad(int t, int grad, const Strides& strides, bool shared_handle) {
  const Tensor& p = g_.tensors[t];
  if (param_grad_[t] != kNoGrad) {  // .grad exists (or is a view into a rank's buffer): added in place
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
  if (p.role == TensorRole::kParameter) hooks_->GradReady(memory(), t);
}

}  // namespace memest
