// The step simulator's forward (engine/step/simulator.h): each op's outputs, saved tensors and
// scratch; what the Python program holds (engine/step/python_refs.h); a checkpointed region's
// inputs.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "engine/step/simulator.h"

namespace memest {

using namespace std::string_view_literals;  // kind == "linear"sv: lengths first

void StepSimulator::CountUses(StorageTable& st, int first, int last) {
  for (int i = first; i <= last; ++i) ForEachInputStorage(i, [&](int s) { ++st.uses[s]; });
}

// Whether an op in [first_op_, last_op_] reads tensor t.
bool StepSimulator::ReadInRange(int t) const {
  if (first_op_ == 0 && last_op_ == static_cast<int>(g_.ops.size()) - 1) return true;
  for (int i = first_op_; i <= last_op_; ++i) {
    for (int in : g_.ops[i].inputs) {
      if (in == t) return true;
    }
  }
  return false;
}

void StepSimulator::Forward() {
  CountUses(main_, first_op_, last_op_);
  // The loss is held by the training loop (with hold_outputs, the model's outputs too); in
  // inference the model's output is.
  if (training_ && loss_ >= 0) ++main_.pins[base_[loss_]];
  if (!training_ || hold_outputs_) {
    for (int s : training_ ? refs_.held_outputs : refs_.outputs) ++main_.pins[s];
  }
  PinRefs(main_, first_op_, last_op_);
  std::vector<int> cast_cache;
  for (int i = first_op_; i <= last_op_ && !failed(); ++i) {
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
    // A non-reentrant checkpoint runs its region with grad enabled, the saved tensors packed
    // away by its hooks; what a node keeps as its attributes escapes them and stays until the
    // graph is freed (OpMemory::saved_until_graph_freed).
    const bool node_held = training_ && r >= 0 && non_reentrant_[r] && rules_[i] != nullptr &&
                           rules_[i]->keeps_node_attributes &&
                           GradMemory(i).saved_until_graph_freed;
    RunForwardOp(i, main_, grad || node_held, in_loss ? Phase::kLoss : Phase::kForward, false,
                 &cast_cache);
    if (node_held) {
      graph_held_.push_back(std::move(op_saved_[i]));
      op_saved_[i] = SavedByOp{};
    }
    ReleaseRefs(main_, i, first_op_);
    hooks_->ForwardOpEnds(memory(), i);
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

// Pins the storages made in ops [first, last] whose Python references die after one of them
// (a recomputed region pins its own; the forward, all).
void StepSimulator::PinRefs(StorageTable& st, int first, int last) {
  for (int i = first; i <= last; ++i) {
    for (int s : refs_.release_after[i]) {
      if (g_.tensors[s].producer >= first) ++st.pins[s];
    }
  }
}

// Op i has run: the references PinRefs(st, first, ...) pinned until then die.
void StepSimulator::ReleaseRefs(StorageTable& st, int i, int first) {
  for (int s : refs_.release_after[i]) {
    if (g_.tensors[s].producer < first) continue;
    --st.pins[s];
    MaybeFree(st, s);
  }
}

// The end of a micro-batch whose loop keeps its outputs: they leave the graph's table, and
// live on until the next forward has made new ones; and with them the graph, whose nodes keep
// what they hold as attributes (graph_held_).
void StepSimulator::KeepOutputsInLoop() {
  for (int s : refs_.held_outputs) {
    if (main_.buffer[s] >= 0) loop_outputs_.push_back(main_.buffer[s]);
    main_.buffer[s] = -1;
    main_.pins[s] = 0;
  }
  for (SavedByOp& saved : graph_held_) {
    for (auto [st, s] : saved.holds) {
      if (st != &main_ || main_.buffer[s] < 0 || --main_.saved[s] > 0) continue;
      const Tensor& t = g_.tensors[s];
      if (t.role == TensorRole::kParameter || t.role == TensorRole::kBuffer) continue;
      Sum(&saved_bytes_, -Bytes(t.shape, t.dtype));
      loop_outputs_.push_back(main_.buffer[s]);
      main_.buffer[s] = -1;
      main_.pins[s] = 0;
    }
    for (int b : saved.extras) {
      if (b >= 0) loop_outputs_.push_back(b);  // -1: released in backward already
    }
    Sum(&saved_bytes_, -saved.extra_bytes);
  }
  graph_held_.clear();
}

// A steady-state step starts with the previous step's outputs, still held by the loop, and
// what the previous graph's nodes hold as attributes (KeepOutputsInLoop).
void StepSimulator::CarryOverOutputs() {
  std::vector<char> carried(g_.tensors.size(), 0);
  for (int s : refs_.held_outputs) {
    const Tensor& t = g_.tensors[s];
    loop_outputs_.push_back(NewBuffer(Bytes(t.shape, t.dtype), Category::kTemporaries));
    carried[s] = 1;
  }
  for (int i = first_op_; i <= last_op_; ++i) {
    const int r = region_of_[i];
    if (r >= 0 && !non_reentrant_[r]) continue;  // a reentrant region's graph is gone already
    if (rules_[i] == nullptr || !rules_[i]->keeps_node_attributes) continue;
    const OpMemory& m = GradMemory(i);
    if (!m.saved_until_graph_freed) continue;
    auto carry = [&](int t) {
      const int s = base_[t];
      const Tensor& ten = g_.tensors[s];
      if (carried[s] || ten.role == TensorRole::kParameter || ten.role == TensorRole::kBuffer) {
        return;
      }
      carried[s] = 1;
      loop_outputs_.push_back(NewBuffer(Bytes(ten.shape, ten.dtype), Category::kActivations));
    };
    for (int k : m.saved_inputs) carry(g_.ops[i].inputs[k]);
    for (int k : m.saved_outputs) carry(g_.ops[i].outputs[k]);
    for (const Alloc& a : m.saved_extras) {
      loop_outputs_.push_back(NewBuffer(a.bytes, Category::kActivations));
    }
  }
}

// torch.utils.checkpoint keeps the region's inputs until its backward. Reentrant: they are
// saved for backward (ctx.save_for_backward) like any tensor autograd keeps. Non-reentrant:
// the recomputation's closure keeps them alive; autograd saves nothing of the region.
void StepSimulator::PinRegionInputs(int r, int delta) {
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

std::vector<int> StepSimulator::RegionInputs(int r) {
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

void StepSimulator::RunForwardOp(int i, StorageTable& st, bool grad, Phase phase, bool recompute,
                                 std::vector<int>* cast_cache) {
  const Op& op = g_.ops[i];
  Context(phase, i, recompute);
  if (!recompute) hooks_->ForwardOpStarts(memory(), i);  // at the op, so its phase and scope
  if (!workspace_seen_ && UsesCublas(op.kind)) {
    workspace_seen_ = true;
    AllocWorkspace();
  }
  const OpRule* rule = rules_[i];
  // With grad, backward asks the rule the same question: GradMemory keeps the answer. In eval
  // mode dropout returns its input: no output, no mask.
  OpMemory local;
  if (!grad && (training_ || !rule || !rule->identity_in_eval)) {
    local = OpMemoryOf(MakeCall(i, false));
  }
  const OpMemory& mem = grad ? GradMemory(i) : local;
  const bool weight_cast = weight_cast_[i];
  LayerRow* row = mb_ == 0 && !recompute ? &LayerFor(i) : nullptr;
  for (size_t k = 0; k < op.outputs.size(); ++k) {
    const int o = op.outputs[k];
    const int s = base_[o];
    if (s != o || st.buffer[s] >= 0) continue;
    int64_t bytes = Bytes(g_.tensors[o].shape, g_.tensors[o].dtype);
    if (k < mem.output_storage_bytes.size()) bytes = std::max(bytes, mem.output_storage_bytes[k]);
    st.buffer[s] = NewBuffer(bytes, weight_cast    ? Category::kMasterAndCasts
                                    : kv_cache_[s] ? Category::kKvCache
                                                   : Category::kTemporaries);
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

// The row of op i's scope; ops of one scope are usually adjacent, so the previous op's row is
// tried before the map.
LayerRow& StepSimulator::LayerFor(int i) {
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

}  // namespace memest
