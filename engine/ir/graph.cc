#include "engine/ir/graph.h"

#include <algorithm>
#include <cmath>

#include "engine/ir/text.h"
#include "engine/passes/passes.h"
#include "engine/rules/op_rules.h"

namespace memest {

int64_t Graph::ParameterCount() const {
  int64_t n = 0;
  for (const Tensor& t : tensors) {
    if (t.role == TensorRole::kParameter) n += t.values_per_element * Numel(t.shape);
  }
  return n;
}

int64_t Graph::TrainableParameterCount() const {
  int64_t n = 0;
  for (const Tensor& t : tensors) {
    if (t.role == TensorRole::kParameter && t.requires_grad) n += Numel(t.shape);
  }
  return n;
}

bool ScopeWithin(std::string_view scope, std::string_view prefix) {
  if (prefix.empty()) return true;
  if (scope.size() < prefix.size() || scope.compare(0, prefix.size(), prefix) != 0) return false;
  return scope.size() == prefix.size() || scope[prefix.size()] == '.';
}

std::string_view ScopeParent(std::string_view scope) {
  const size_t dot = scope.rfind('.');
  return dot == std::string_view::npos ? std::string_view() : scope.substr(0, dot);
}

const char* TensorRoleName(TensorRole role) {
  switch (role) {
    case TensorRole::kActivation:
      return "activation";
    case TensorRole::kInput:
      return "input";
    case TensorRole::kTarget:
      return "target";
    case TensorRole::kParameter:
      return "parameter";
    case TensorRole::kBuffer:
      return "buffer";
  }
  return "tensor";
}

bool HasAttr(const Attrs& attrs, std::string_view name) { return attrs.find(name) != attrs.end(); }

namespace {

std::string AttrField(const std::string& context, std::string_view name) {
  return context + ".attrs." + std::string(name);
}

}  // namespace

StatusOr<int64_t> IntAttr(const Attrs& attrs, std::string_view name, int64_t fallback,
                          const std::string& context) {
  auto it = attrs.find(name);
  if (it == attrs.end()) return fallback;
  if (const auto* v = std::get_if<int64_t>(&it->second)) return *v;
  if (const auto* d = std::get_if<double>(&it->second)) {
    if (std::isfinite(*d) && *d == std::floor(*d) && std::fabs(*d) < 9.0e18) {
      return static_cast<int64_t>(*d);
    }
  }
  return InvalidArgument(AttrField(context, name) + ": must be an integer");
}

StatusOr<double> FloatAttr(const Attrs& attrs, std::string_view name, double fallback,
                           const std::string& context) {
  auto it = attrs.find(name);
  if (it == attrs.end()) return fallback;
  double v;
  if (const auto* d = std::get_if<double>(&it->second)) {
    v = *d;
  } else if (const auto* i = std::get_if<int64_t>(&it->second)) {
    v = static_cast<double>(*i);
  } else {
    return InvalidArgument(AttrField(context, name) + ": must be a number");
  }
  if (!std::isfinite(v)) {
    return InvalidArgument(AttrField(context, name) + ": must be finite, got " +
                           std::to_string(v));
  }
  return v;
}

StatusOr<std::vector<int64_t>> IntsAttr(const Attrs& attrs, std::string_view name,
                                        std::vector<int64_t> fallback,
                                        const std::string& context) {
  auto it = attrs.find(name);
  if (it == attrs.end()) return fallback;
  if (const auto* v = std::get_if<std::vector<int64_t>>(&it->second)) return *v;
  if (const auto* i = std::get_if<int64_t>(&it->second)) return std::vector<int64_t>{*i};
  return InvalidArgument(AttrField(context, name) + ": must be a list of integers");
}

StatusOr<std::string> StringAttr(const Attrs& attrs, std::string_view name, std::string fallback,
                                 const std::string& context) {
  auto it = attrs.find(name);
  if (it == attrs.end()) return fallback;
  if (const auto* v = std::get_if<std::string>(&it->second)) return *v;
  return InvalidArgument(AttrField(context, name) + ": must be a string");
}

GraphBuilder::GraphBuilder() = default;

void GraphBuilder::Fail(Status status) {
  if (status_.ok() && !status.ok()) status_ = std::move(status);
}

void GraphBuilder::NameSize(int64_t size, std::string field) {
  named_sizes_.emplace_back(size, std::move(field));
}

namespace {

// A shape refused for what it is (a negative size, too many dims), not for how much it holds.
bool NotASize(const Shape& shape) {
  return shape.size() > kMaxRank ||
         std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; });
}


constexpr std::string_view kBeyondBytes = ", more than the 2^56 bytes (64 PiB) one tensor may hold";
constexpr std::string_view kTooLarge = " is too large: ";

}  // namespace

bool IsUnattributedSizeError(const Status& status) {
  const std::string& m = status.message();
  return status.code() == StatusCode::kInvalidArgument && m.size() >= kBeyondBytes.size() &&
         m.compare(m.size() - kBeyondBytes.size(), kBeyondBytes.size(), kBeyondBytes) == 0 &&
         m.find(kTooLarge) == std::string::npos;
}

Status GraphBuilder::TooLarge(const Shape& shape, DType dtype, const std::string& what) const {
  const std::string size = what + " would be " + ShapeToString(shape) + " of " +
                           std::string(DTypeName(dtype)) + std::string(kBeyondBytes);
  // The dims that alone make the shape too large (it fits with that dim 1), largest first.
  std::vector<size_t> causes;
  for (size_t i = 0; i < shape.size(); ++i) {
    Shape without = shape;
    without[i] = 1;
    if (CheckedBytes(without, dtype, "").ok()) causes.push_back(i);
  }
  std::stable_sort(causes.begin(), causes.end(),
                   [&shape](size_t a, size_t b) { return shape[a] > shape[b]; });
  for (size_t i : causes) {
    for (auto it = named_sizes_.rbegin(); it != named_sizes_.rend(); ++it) {
      if (it->first == shape[i]) {
        return InvalidArgument(it->second + ": " + std::to_string(shape[i]) +
                               std::string(kTooLarge) + size);
      }
    }
  }
  return InvalidArgument(ContextOr("model") + ": " + size);
}

int GraphBuilder::AddLeaf(std::string name, Shape shape, DType dtype, TensorRole role,
                          bool requires_grad, int batch_dim) {
  if (!ok()) return -1;
  // Where errors point: built only for an error (a model has a leaf per weight).
  auto field = [&] { return ContextOr(Escape(name)); };
  StatusOr<int64_t> bytes = CheckedBytes(shape, dtype, "");
  if (!bytes.ok()) {
    const std::string what = std::string("the ") + TensorRoleName(role) + " " + Quote(name);
    Fail(NotASize(shape) ? CheckedBytes(shape, dtype, field() + ".shape").status()
                         : TooLarge(shape, dtype, what));
    return -1;
  }
  if (!AddBytes(&leaf_bytes_, *bytes)) {
    Fail(InvalidArgument(field() + ": the model's parameters, buffers and inputs together would "
                                 "hold more than 2^62 bytes (4 EiB); memest does not represent "
                                 "larger byte counts"));
    return -1;
  }
  if (batch_dim >= static_cast<int>(shape.size())) batch_dim = -1;
  Tensor t;
  t.name = std::move(name);
  t.strides = ContiguousStrides(shape);
  t.shape = std::move(shape);
  t.dtype = dtype;
  t.role = role;
  t.requires_grad = requires_grad && IsFloating(dtype);
  t.batch_dim = batch_dim;
  graph_.tensors.push_back(std::move(t));
  return static_cast<int>(graph_.tensors.size()) - 1;
}

int GraphBuilder::CopyLeaf(const Tensor& leaf) {
  if (!ok()) return -1;
  if (!AddBytes(&leaf_bytes_, Bytes(leaf.shape, leaf.dtype))) {
    Fail(InvalidArgument(leaf.name + ": the model's parameters, buffers and inputs together "
                                     "would hold more than 2^62 bytes (4 EiB)"));
    return -1;
  }
  graph_.tensors.push_back(leaf);
  return static_cast<int>(graph_.tensors.size()) - 1;
}

int GraphBuilder::Input(std::string name, Shape shape, DType dtype, int batch_dim,
                        bool requires_grad) {
  return AddLeaf(std::move(name), std::move(shape), dtype, TensorRole::kInput, requires_grad,
                 batch_dim);
}
int GraphBuilder::Target(std::string name, Shape shape, DType dtype, int batch_dim) {
  return AddLeaf(std::move(name), std::move(shape), dtype, TensorRole::kTarget, false, batch_dim);
}
int GraphBuilder::Parameter(std::string name, Shape shape, DType dtype, bool trainable) {
  if (!scope_.empty()) name = scope_ + "." + name;
  return AddLeaf(std::move(name), std::move(shape), dtype, TensorRole::kParameter, trainable, -1);
}
int GraphBuilder::Buffer(std::string name, Shape shape, DType dtype) {
  if (!scope_.empty()) name = scope_ + "." + name;
  return AddLeaf(std::move(name), std::move(shape), dtype, TensorRole::kBuffer, false, -1);
}
int GraphBuilder::KvCache(std::string name, Shape shape, DType dtype) {
  int id = Buffer(std::move(name), std::move(shape), dtype);
  if (id >= 0) graph_.tensors[id].kv_cache = true;
  return id;
}

void GraphBuilder::EnableAutocast(DType half) { graph_.autocast = half; }

std::vector<int> GraphBuilder::Add(std::string_view kind, std::vector<int> inputs, Attrs attrs,
                                   std::vector<std::string> output_names) {
  if (!ok()) return {};
  if (static_cast<int64_t>(graph_.ops.size()) >= max_ops_) {
    const std::string where = ContextOr(scope_);
    Fail(ResourceExhausted("model: expands to more than the limit of " + std::to_string(max_ops_) +
                           " ops" + (where.empty() ? std::string() : " (at " + where + ")")));
    return {};
  }
  if (budget_ != nullptr && graph_.ops.size() % Budget::kCheckEvery == 0) {
    Status stopped = budget_->Check();
    if (!stopped.ok()) {
      Fail(std::move(stopped));
      return {};
    }
  }
  if (graph_.autocast != DType::kFloat32 && !in_autocast_) {
    for (int id : inputs) {
      if (id < 0 || id >= static_cast<int>(graph_.tensors.size())) {
        Fail(InvalidArgument(ContextOr(kind) + ".inputs: no such tensor"));
        return {};
      }
    }
    in_autocast_ = true;
    AutocastInputs(*this, kind, inputs, attrs);
    in_autocast_ = false;
    if (!ok()) return {};
  }
  // Errors point at the context a front end set ("model.ops[3]"); builder code without one
  // (presets) gets the op kind, and the scope is added only if an error happens. The field is
  // made only for an error: the rule is asked again with it (rules are pure, and read the field
  // for their messages only).
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] < 0 || inputs[i] >= static_cast<int>(graph_.tensors.size())) {
      Fail(InvalidArgument(ContextOr(kind) + ".inputs[" + std::to_string(i) + "]: no such tensor"));
      return {};
    }
  }
  Op op;
  op.kind = std::string(kind);
  op.inputs = std::move(inputs);
  op.attrs = std::move(attrs);
  op.scope = scope_;
  OpCall call{op, {}, {}, ""};
  call.runtime = graph_.runtime;
  call.inputs.reserve(op.inputs.size());
  for (int id : op.inputs) call.inputs.push_back(&graph_.tensors[id]);
  StatusOr<std::vector<OutputSpec>> specs = InferOutputs(call);
  if (!specs.ok()) {
    call.field = ContextOr(kind);
    specs = InferOutputs(call);
    Fail(Context().empty() && !scope_.empty() ? specs.status().Prefixed(Escape(scope_) + ": ")
                                              : specs.status());
    return {};
  }
  // Every output must count its bytes in 64 bits; a size too large is blamed on the field it
  // came from (NameSize).
  for (size_t i = 0; i < specs->size(); ++i) {
    const OutputSpec& s = (*specs)[i];
    if (CheckedBytes(s.shape, s.dtype, "").ok()) continue;  // the field is named on error only
    const std::string output = ContextOr(kind) + ".outputs[" + std::to_string(i) + "]";
    const std::string in_scope = scope_.empty() ? "" : " in " + Quote(scope_);
    Fail(NotASize(s.shape) ? CheckedBytes(s.shape, s.dtype, output).status()
                                 : TooLarge(s.shape, s.dtype, "the output of " + op.kind + in_scope));
    return {};
  }
  const int op_index = static_cast<int>(graph_.ops.size());
  bool any_input_grad = false;
  for (int id : op.inputs) any_input_grad |= graph_.tensors[id].requires_grad;
  std::vector<int> outs;
  outs.reserve(specs->size());
  for (size_t i = 0; i < specs->size(); ++i) {
    OutputSpec& s = (*specs)[i];
    Tensor t;
    if (i < output_names.size()) t.name = std::move(output_names[i]);
    t.strides = s.strides.empty() ? ContiguousStrides(s.shape) : std::move(s.strides);
    t.shape = std::move(s.shape);
    t.dtype = s.dtype;
    t.role = TensorRole::kActivation;
    t.producer = op_index;
    t.requires_grad = any_input_grad && s.differentiable && IsFloating(t.dtype);
    if (s.alias_input >= 0) {
      const int base = op.inputs[s.alias_input];
      t.alias_of = graph_.tensors[base].alias_of >= 0 ? graph_.tensors[base].alias_of : base;
    }
    graph_.tensors.push_back(std::move(t));
    outs.push_back(static_cast<int>(graph_.tensors.size()) - 1);
  }
  op.outputs = outs;
  graph_.ops.push_back(std::move(op));
  return outs;
}

int GraphBuilder::Add1(std::string_view kind, std::vector<int> inputs, Attrs attrs) {
  std::vector<int> outs = Add(kind, std::move(inputs), std::move(attrs));
  return outs.empty() ? -1 : outs[0];
}

void GraphBuilder::PushScope(std::string_view name) {
  scope_marks_.push_back(scope_.size());
  if (name.empty()) return;
  if (!scope_.empty()) scope_ += ".";
  scope_ += name;
}

void GraphBuilder::PopScope() {
  if (scope_marks_.empty()) return;
  scope_.resize(scope_marks_.back());
  scope_marks_.pop_back();
}

void GraphBuilder::MarkBlock() {
  if (graph_.blocks.empty() || graph_.blocks.back() != scope_) graph_.blocks.push_back(scope_);
}

void GraphBuilder::HoldUntilLastOp(int tensor) {
  if (!ok() || tensor < 0 || graph_.ops.empty()) return;
  graph_.held.push_back({tensor, static_cast<int>(graph_.ops.size()) - 1});
}

void GraphBuilder::MarkOutput(int tensor) {
  if (ok() && tensor >= 0) graph_.outputs.push_back(tensor);
}

void GraphBuilder::MarkCache(int tensor) {
  if (ok() && tensor >= 0) graph_.cache.push_back(tensor);
}

void GraphBuilder::BeginLoss() { graph_.loss_begin = static_cast<int>(graph_.ops.size()); }

void GraphBuilder::SetLoss(int tensor) {
  if (!ok()) return;
  if (tensor < 0 || tensor >= static_cast<int>(graph_.tensors.size())) {
    Fail(InvalidArgument(ContextOr("model") + ".loss: no such tensor"));
    return;
  }
  if (Numel(graph_.tensors[tensor].shape) != 1) {
    Fail(InvalidArgument(ContextOr("model") + ".loss: must be a scalar, got shape " +
                         ShapeToString(graph_.tensors[tensor].shape)));
    return;
  }
  graph_.loss = tensor;
}

StatusOr<Graph> GraphBuilder::Finish(int64_t max_ops) {
  if (!ok()) return status_;
  if (static_cast<int64_t>(graph_.ops.size()) > max_ops) {
    return ResourceExhausted("model: expands to " + std::to_string(graph_.ops.size()) +
                             " ops, more than the limit of " + std::to_string(max_ops));
  }
  if (!graph_.copy_of.empty()) graph_.copy_of.resize(graph_.ops.size(), -1);
  return std::move(graph_);
}

}  // namespace memest
