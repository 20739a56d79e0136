#include "engine/rules/op_rules.h"

#include <algorithm>
#include <unordered_map>

#include "engine/ir/text.h"
#include "engine/rules/internal.h"

namespace memest {
namespace rules {

Status RequireFloating(const OpCall& c, size_t i) {
  if (!IsFloating(c.in(i).dtype)) {
    return InvalidArgument(InputField(c, i) + ": " + c.op.kind + " needs a floating tensor, got " +
                           std::string(DTypeName(c.in(i).dtype)));
  }
  return Status::Ok();
}

void NoGradient(const OpCall& c, OpMemory* m) {
  m->grad_flow.assign(c.inputs.size(), GradFlow::kNone);
}

Status RequireIntegerIndex(const OpCall& c, size_t i) {
  if (!IsFloating(c.in(i).dtype) && c.in(i).dtype != DType::kBool) return Status::Ok();
  return InvalidArgument(InputField(c, i) + ": " + c.op.kind +
                         " takes an integer index tensor, got " +
                         std::string(DTypeName(c.in(i).dtype)));
}

Status RequireRank(const OpCall& c, size_t i, int lo, int hi) {
  const int r = static_cast<int>(c.in(i).shape.size());
  if (r < lo || r > hi) {
    std::string want = lo == hi ? std::to_string(lo)
                                : std::to_string(lo) + " to " + std::to_string(hi);
    return InvalidArgument(InputField(c, i) + ": " + c.op.kind + " expects rank " + want +
                           ", got shape " + ShapeToString(c.in(i).shape));
  }
  return Status::Ok();
}

Strides DenseStridesLike(const Tensor& t) { return DenseStridesLike(t, t.shape); }

Strides DenseStridesLike(const Tensor& t, const Shape& shape) {
  if (IsContiguous(t.shape, t.strides)) return ContiguousStrides(shape);
  const size_t n = t.shape.size();
  std::vector<size_t> order(n);  // dims from outermost (largest stride) to innermost
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return t.strides[a] > t.strides[b]; });
  Strides s(n, 1);
  int64_t step = 1;
  for (size_t k = n; k-- > 0;) {
    s[order[k]] = step;
    step *= std::max<int64_t>(shape[order[k]], 1);
  }
  return s;
}

// c10/core/MemoryFormat.h, is_channels_last_strides_2d_s4: the strides ordered C, W, H, N
// from the smallest, ambiguous cases (N111, a trivial C) read as row-major.
bool SuggestsChannelsLast(const Tensor& t) {
  if (t.shape.size() != 4 || t.strides.size() != 4 || t.strides[1] == 0) return false;
  int64_t min = 0;
  for (int d : {1, 3, 2, 0}) {
    if (t.shape[d] == 0 || t.strides[d] < min) return false;
    if (d == 0 && min == t.strides[1]) return false;
    min = t.strides[d];
    if (t.shape[d] > 1) min *= t.shape[d];
  }
  return true;
}

Strides ChannelsLastStrides(const Shape& shape) {
  const int64_t c = std::max<int64_t>(shape[1], 1), w = std::max<int64_t>(shape[3], 1);
  const int64_t h = std::max<int64_t>(shape[2], 1);
  return Strides{h * w * c, 1, w * c, c};
}

}  // namespace rules

namespace {

const std::vector<OpRule>& Table() {
  static const std::vector<OpRule>* table = [] {
    auto* t = new std::vector<OpRule>();
    rules::RegisterMatmulRules(t);
    rules::RegisterConvRules(t);
    rules::RegisterNormRules(t);
    rules::RegisterPointwiseRules(t);
    rules::RegisterShapeRules(t);
    rules::RegisterLossRules(t);
    rules::RegisterIndexRules(t);
    rules::RegisterRecurrentRules(t);
    rules::RegisterCopyRules(t);
    rules::RegisterAttentionRules(t);
    rules::RegisterCompareRules(t);
    rules::RegisterSelectRules(t);
    rules::RegisterDetectionRules(t);
    rules::RegisterParallelRules(t);
    rules::RegisterDTensorRules(t);
    rules::RegisterQuantizedRules(t);
    rules::RegisterQuantizedInt8Rules(t);
    rules::RegisterQuantizedTorchaoRules(t);
    rules::RegisterFp8TeRules(t);
    rules::RegisterServedQuantizedRules(t);
    rules::RegisterServedLoraRules(t);
    rules::RegisterServedMlaRules(t);
    rules::RegisterFusedMoeRules(t);
    rules::RegisterMoeDispatchRules(t);
    std::sort(t->begin(), t->end(),
              [](const OpRule& a, const OpRule& b) { return a.kind < b.kind; });
    return t;
  }();
  return *table;
}

std::string Vocabulary() {
  std::string s;
  for (const OpRule& r : Table()) {
    if (!s.empty()) s += ", ";
    s += r.kind;
  }
  return s;
}

}  // namespace

const OpRule* FindOpRule(std::string_view kind) {
  // Every op added to a graph and every op the step simulator runs looks its rule up: a hash
  // of the kind, not a binary search of string compares.
  static const auto* by_kind = [] {
    auto* m = new std::unordered_map<std::string_view, const OpRule*>();
    for (const OpRule& r : Table()) m->emplace(r.kind, &r);
    return m;
  }();
  auto it = by_kind->find(kind);
  return it != by_kind->end() ? it->second : nullptr;
}

std::vector<const OpRule*> AllOpRules() {
  std::vector<const OpRule*> out;
  for (const OpRule& r : Table()) out.push_back(&r);
  return out;
}

StatusOr<std::vector<OutputSpec>> InferOutputs(const OpCall& call) {
  const OpRule* rule = FindOpRule(call.op.kind);
  if (rule == nullptr) {
    return InvalidArgument(call.field + ".kind: unknown op " + Quote(call.op.kind) +
                           "; memest knows: " + Vocabulary());
  }
  const int n = static_cast<int>(call.inputs.size());
  if (n < rule->min_inputs || (rule->max_inputs >= 0 && n > rule->max_inputs)) {
    std::string want = rule->max_inputs < 0 ? "at least " + std::to_string(rule->min_inputs)
                       : rule->min_inputs == rule->max_inputs
                           ? std::to_string(rule->min_inputs)
                           : std::to_string(rule->min_inputs) + " to " +
                                 std::to_string(rule->max_inputs);
    return InvalidArgument(call.field + ".inputs: " + call.op.kind + " takes " + want +
                           " inputs, got " + std::to_string(n));
  }
  return rule->infer(call);
}

OpMemory OpMemoryOf(const OpCall& call) {
  OpMemory mem;
  const OpRule* rule = call.rule != nullptr ? call.rule : FindOpRule(call.op.kind);
  if (rule != nullptr && rule->memory != nullptr) rule->memory(call, &mem);
  mem.grad_flow.resize(call.inputs.size(), GradFlow::kFresh);
  for (size_t i = 0; i < call.inputs.size(); ++i) {
    if (!call.needs_grad(i)) mem.grad_flow[i] = GradFlow::kNone;
  }
  return mem;
}

namespace {

bool TensorsAlike(const Graph& g, const std::vector<int>& a, const std::vector<int>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    const Tensor& x = g.tensors[a[k]];
    const Tensor& y = g.tensors[b[k]];
    if (x.dtype != y.dtype || x.requires_grad != y.requires_grad ||
        (x.alias_of >= 0) != (y.alias_of >= 0) || x.shape != y.shape || x.strides != y.strides) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool OpsAlikeToRules(const Graph& g, int a, int b) {
  const Op& x = g.ops[a];
  const Op& y = g.ops[b];
  return x.kind == y.kind && TensorsAlike(g, x.inputs, y.inputs) &&
         TensorsAlike(g, x.outputs, y.outputs) && x.attrs == y.attrs;
}

}  // namespace memest
