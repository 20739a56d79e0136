// GraphBuilder's repeated blocks: BeginBlock, EndBlock and StampBlock (engine/ir/graph.h).
#include <algorithm>
#include <string>

#include "engine/ir/graph.h"

namespace memest {

namespace {

// Whether the ops of a block see `a` and `b` alike: shape rules read a tensor's shape, strides
// and dtype, the builder its requires_grad (its outputs') and whether it is a view (a view or
// in-place result of it aliases its storage's base).
bool SameToOps(const Tensor& a, const Tensor& b) {
  return a.shape == b.shape && a.strides == b.strides && a.dtype == b.dtype && a.role == b.role &&
         a.requires_grad == b.requires_grad && (a.alias_of < 0) == (b.alias_of < 0) &&
         a.batch_dim == b.batch_dim && a.kv_cache == b.kv_cache &&
         a.values_per_element == b.values_per_element;
}

// `name` with the scope `from` it starts with replaced by `to` ("h.1.attn" -> "h.7.attn");
// false when it does not start with it.
bool Rescope(const std::string& name, const std::string& from, const std::string& to,
             std::string* out) {
  if (name.compare(0, from.size(), from) != 0) return false;
  if (name.size() > from.size() && name[from.size()] != '.') return false;
  out->reserve(to.size() + name.size() - from.size());
  out->assign(to);
  out->append(name, from.size(), std::string::npos);
  return true;
}

}  // namespace

GraphBuilder::BlockMark GraphBuilder::BeginBlock(int input) const {
  BlockMark m;
  m.input = input;
  m.first_op = static_cast<int>(graph_.ops.size());
  m.first_tensor = static_cast<int>(graph_.tensors.size());
  m.first_held = graph_.held.size();
  m.first_output = graph_.outputs.size();
  m.first_cache = graph_.cache.size();
  m.first_size = named_sizes_.size();
  m.leaf_bytes = leaf_bytes_;
  m.scope = scope_;
  m.stampable = ok() && !in_autocast_;
  m.loss = graph_.loss;
  m.loss_begin = graph_.loss_begin;
  m.checkpoints = graph_.checkpoints.size();
  m.blocks = graph_.blocks.size();
  return m;
}

void GraphBuilder::EndBlock(int output, BlockMark* m) const {
  m->stampable = m->stampable && ok() && output >= m->first_tensor && scope_ == m->scope &&
                 m->input >= 0 && m->loss == graph_.loss && m->loss_begin == graph_.loss_begin &&
                 m->checkpoints == graph_.checkpoints.size() && m->blocks == graph_.blocks.size();
  m->output = output;
  m->end_op = static_cast<int>(graph_.ops.size());
  m->end_tensor = static_cast<int>(graph_.tensors.size());
  m->end_held = graph_.held.size();
  m->end_output = graph_.outputs.size();
  m->end_cache = graph_.cache.size();
  m->end_size = named_sizes_.size();
  m->leaf_bytes = leaf_bytes_ - m->leaf_bytes;
}

void GraphBuilder::ReserveCopies(const BlockMark& from, int64_t copies) {
  const int64_t ops = from.end_op - from.first_op;
  if (!stamping_ || !from.stampable || ops <= 0 || copies <= 0) return;
  const int64_t room = max_ops_ - static_cast<int64_t>(graph_.ops.size());
  if (room <= 0) return;
  const int64_t more = std::min(copies, room / ops);
  const int64_t tensors = from.end_tensor - from.first_tensor;
  graph_.ops.reserve(graph_.ops.size() + static_cast<size_t>(more * ops));
  graph_.copy_of.reserve(graph_.ops.capacity());
  graph_.tensors.reserve(graph_.tensors.size() + static_cast<size_t>(more * tensors));
}

int GraphBuilder::StampBlock(const BlockMark& from, int input, int loop_start) {
  if (!ok() || !stamping_ || !from.stampable || input < 0 || input >= num_tensors() ||
      !SameToOps(graph_.tensors[from.input], graph_.tensors[input])) {
    return -1;
  }
  const int ops = from.end_op - from.first_op;
  const int first_op = static_cast<int>(graph_.ops.size());
  const int first_tensor = num_tensors();
  const int shift = first_tensor - from.first_tensor;
  const int op_shift = first_op - from.first_op;
  // The tensor of the copy that stands where the block had `t`: its own tensors are shifted, its
  // input replaced; -1 for a tensor of the loop other than the input (a block that reaches back
  // past its input is built, not copied).
  auto map = [&](int t) {
    if (t >= from.first_tensor && t < from.end_tensor) return t + shift;
    if (t == from.input) return input;
    return t < loop_start ? t : -1;
  };
  // Views of the input alias its storage's base (the previous block's tensor), which only they
  // reach.
  const int from_base = graph_.tensors[from.input].alias_of;
  const int base = graph_.tensors[input].alias_of;
  auto map_base = [&](int t) { return t >= 0 && t == from_base ? base : map(t); };
  for (int k = from.first_op; k < from.end_op; ++k) {
    for (int t : graph_.ops[k].inputs) {
      if (map(t) < 0) return -1;
    }
  }
  for (int t = from.first_tensor; t < from.end_tensor; ++t) {
    const int of = graph_.tensors[t].alias_of;
    if (of >= 0 && map_base(of) < 0) return -1;
  }
  for (size_t k = from.first_held; k < from.end_held; ++k) {
    if (map(graph_.held[k].tensor) < 0 || graph_.held[k].until_op < from.first_op) return -1;
  }
  for (size_t k = from.first_output; k < from.end_output; ++k) {
    if (map(graph_.outputs[k]) < 0) return -1;
  }
  for (size_t k = from.first_cache; k < from.end_cache; ++k) {
    if (map(graph_.cache[k]) < 0) return -1;
  }
  const int cached_end = std::min<int>(from.end_tensor, static_cast<int>(autocast_weights_.size()));
  for (int t = from.first_tensor; t < cached_end; ++t) {
    if (autocast_weights_[t] >= 0 && map(autocast_weights_[t]) < 0) return -1;
  }
  // Limits: past one, building the block makes the error where it happens.
  if (static_cast<int64_t>(first_op) + ops > max_ops_) return -1;
  int64_t leaf_bytes = leaf_bytes_;
  if (!AddBytes(&leaf_bytes, from.leaf_bytes)) return -1;
  if (budget_ != nullptr && ops > 0 &&
      (first_op == 0 ||
       (first_op - 1) / Budget::kCheckEvery != (first_op + ops - 1) / Budget::kCheckEvery)) {
    Status stopped = budget_->Check();  // as Add looks at it every kCheckEvery ops
    if (!stopped.ok()) {
      Fail(std::move(stopped));
      return -1;
    }
  }
  leaf_bytes_ = leaf_bytes;

  for (int t = from.first_tensor; t < from.end_tensor; ++t) {
    Tensor copy = graph_.tensors[t];
    std::string name;
    if (Rescope(copy.name, from.scope, scope_, &name)) copy.name = std::move(name);
    if (copy.producer >= 0) copy.producer += op_shift;
    if (copy.alias_of >= 0) copy.alias_of = map_base(copy.alias_of);
    graph_.tensors.push_back(std::move(copy));
  }
  std::vector<int>& copy_of = graph_.copy_of;
  copy_of.resize(first_op, -1);
  std::string scope_now;  // the copy's scope of the op before
  for (int k = from.first_op; k < from.end_op; ++k) {
    copy_of.push_back(copy_of[k] >= 0 ? copy_of[k] : k);
    // Every field copied but the scope, which is renamed: a block's ops come a few to a scope,
    // so each scope once.
    Op& op = graph_.ops[k];
    std::string scope = std::move(op.scope);
    Op copy = op;
    op.scope = std::move(scope);
    for (int& t : copy.inputs) t = map(t);
    for (int& t : copy.outputs) t += shift;
    if (k == from.first_op || op.scope != graph_.ops[k - 1].scope) {
      if (!Rescope(op.scope, from.scope, scope_, &scope_now)) scope_now = op.scope;
    }
    copy.scope = scope_now;
    graph_.ops.push_back(std::move(copy));  // `op` may move: not used past here
  }
  for (size_t k = from.first_held; k < from.end_held; ++k) {
    graph_.held.push_back({map(graph_.held[k].tensor), graph_.held[k].until_op + op_shift});
  }
  for (size_t k = from.first_output; k < from.end_output; ++k) {
    graph_.outputs.push_back(map(graph_.outputs[k]));
  }
  for (size_t k = from.first_cache; k < from.end_cache; ++k) {
    graph_.cache.push_back(map(graph_.cache[k]));
  }
  for (size_t k = from.first_size; k < from.end_size; ++k) {
    named_sizes_.push_back(named_sizes_[k]);
  }
  // autocast's cache: the copy's parameters are cast where the block's were.
  for (int t = from.first_tensor; t < cached_end; ++t) {
    if (autocast_weights_[t] < 0) continue;
    const int param = t + shift;
    if (autocast_weights_.size() <= static_cast<size_t>(param)) {
      autocast_weights_.resize(param + 1, -1);
    }
    autocast_weights_[param] = map(autocast_weights_[t]);
  }
  return map(from.output);
}

}  // namespace memest
