#include "engine/passes/lora.h"

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "engine/ir/text.h"
#include "engine/passes/linear_modules.h"
#include "engine/passes/passes.h"

namespace memest {
namespace {

using NameSet = std::set<std::string, std::less<>>;

// Every module name of `g` in forward order: each op's scope and the scopes around it.
std::vector<std::string> ModuleNames(const Graph& g) {
  std::vector<std::string> names;
  std::unordered_set<std::string_view> seen;  // views of g's scopes
  const std::string* last = nullptr;          // the scope of the op before (ops run in runs)
  for (const Op& op : g.ops) {
    if (op.scope.empty() || (last != nullptr && *last == op.scope)) continue;
    last = &op.scope;
    if (!seen.insert(op.scope).second) continue;
    for (size_t dot = op.scope.find('.'); dot != std::string::npos;
         dot = op.scope.find('.', dot + 1)) {
      const std::string_view outer(op.scope.data(), dot);
      if (seen.insert(outer).second) names.emplace_back(outer);
    }
    names.push_back(op.scope);
  }
  return names;
}

// The index of the entry `name` ends with (PEFT's plain key.endswith(entry), as
// modules_to_save matches), -1 for none: one lookup per distinct entry length.
class SuffixIndex {
 public:
  explicit SuffixIndex(const std::vector<std::string>& entries) {
    for (size_t k = 0; k < entries.size(); ++k) by_length_[entries[k].size()].emplace(entries[k], k);
  }
  int Find(std::string_view name) const {
    for (const auto& [length, entries] : by_length_) {
      if (length > name.size()) break;
      auto it = entries.find(name.substr(name.size() - length));
      if (it != entries.end()) return static_cast<int>(it->second);
    }
    return -1;
  }

 private:
  std::map<size_t, std::map<std::string, size_t, std::less<>>> by_length_;
};

// The index of the entry that selects module `name` as PEFT's check_target_module_exists does
// for a list (the whole name, or its end after a '.'), -1 for none.
int TargetEntry(std::string_view name, const std::map<std::string, size_t, std::less<>>& entries) {
  for (size_t from = 0;;) {
    auto it = entries.find(name.substr(from));
    if (it != entries.end()) return static_cast<int>(it->second);
    const size_t dot = name.find('.', from);
    if (dot == std::string_view::npos) return -1;
    from = dot + 1;
  }
}

// The outermost module of `saved` that `scope` is or lies in ("" for none).
std::string_view OutermostSaved(std::string_view scope, const NameSet& saved) {
  for (size_t dot = scope.find('.'); dot != std::string_view::npos; dot = scope.find('.', dot + 1)) {
    if (saved.count(scope.substr(0, dot)) > 0) return scope.substr(0, dot);
  }
  return saved.count(scope) > 0 ? scope : std::string_view();
}

// The modules modules_to_save wraps (each module whose name ends with an entry), or the error
// naming an entry that matches no module.
StatusOr<NameSet> SavedModules(const std::vector<std::string>& names, const LoraConfig& lora) {
  const SuffixIndex index(lora.modules_to_save);
  std::vector<bool> used(lora.modules_to_save.size(), false);
  NameSet saved;
  for (const std::string& m : names) {
    const int k = index.Find(m);
    if (k < 0) continue;
    used[k] = true;
    saved.insert(m);
  }
  for (size_t k = 0; k < used.size(); ++k) {
    if (!used[k]) {
      return InvalidArgument("config.lora.modules_to_save[" + std::to_string(k) + "]: " +
                             Quote(lora.modules_to_save[k]) + " matches no module of the model");
    }
  }
  return saved;
}

// The module names config.lora.target_modules selects (all-linear expanded as PEFT's
// _maybe_include_all_linear_layers does), less the modules modules_to_save wraps (PEFT's
// inject_adapter wraps those instead), or the error naming the entry at fault.
StatusOr<NameSet> Targets(const Graph& g, const LoraConfig& lora,
                          const std::vector<std::string>& names, const NameSet& saved) {
  const std::vector<std::string> linear = LinearModules(g);
  std::vector<std::string> entries = lora.target_modules;
  const bool expanded = entries.size() == 1 && entries[0] == kLoraAllLinear;
  if (expanded) {
    // Base names of every Linear and Conv1D, less the output layer's name.
    NameSet base;
    for (const std::string& m : linear) base.insert(m.substr(m.rfind('.') + 1));
    base.erase(OutputLayer(g));
    entries.assign(base.begin(), base.end());
  }
  auto field = [&](size_t k) {
    return "config.lora.target_modules" + (expanded ? " (all-linear: " + Quote(entries[k]) + ")"
                                                    : "[" + std::to_string(k) + "]");
  };
  std::map<std::string, size_t, std::less<>> index;
  for (size_t k = 0; k < entries.size(); ++k) index.emplace(entries[k], k);
  const NameSet is_linear(linear.begin(), linear.end());
  NameSet targets;
  std::vector<bool> used(entries.size(), false);
  for (const std::string& m : names) {
    const int k = TargetEntry(m, index);
    if (k < 0) continue;
    used[k] = true;
    if (saved.count(m) > 0) continue;
    if (const std::string_view outer = OutermostSaved(m, saved); !outer.empty()) {
      return InvalidArgument(field(k) + ": " + Quote(entries[k]) + " matches the module " +
                             Quote(m) + " inside " + Quote(outer) +
                             ", which modules_to_save trains whole (PEFT fails on it)");
    }
    if (is_linear.count(m) == 0) {
      return InvalidArgument(field(k) + ": " + Quote(entries[k]) + " matches the module " +
                             Quote(m) + ", which is not a Linear or Conv1D (the layers memest "
                             "adapts with LoRA)");
    }
    targets.insert(m);
  }
  if (targets.empty()) {
    return InvalidArgument("config.lora.target_modules: no module of the model matches " +
                           (entries.empty() ? std::string("all-linear (it has no Linear)")
                                            : Quote(entries[0]) +
                                                  (entries.size() > 1 ? " or the others" : "")) +
                           "; its Linear modules are named like " +
                           (linear.empty() ? std::string("(none)") : Quote(linear[0])));
  }
  for (size_t k = 0; k < entries.size() && !expanded; ++k) {
    if (!used[k]) {
      return InvalidArgument(field(k) + ": " + Quote(entries[k]) +
                             " matches no module of the model");
    }
  }
  return targets;
}

// DoraLinearLayer.forward (peft/tuners/lora/dora.py, 0.13.2) after lora_B(lora_A(x)) = `up`:
//   x_eye = torch.eye(in, dtype=x.dtype); lora_weight = lora_B(lora_A(x_eye)).T
//   weight = base weight .to(x.dtype)
//   weight_norm = linalg.norm(weight + scaling * lora_weight.detach(), dim=1).detach()
//   mag_norm_scale = (magnitude / weight_norm).view(1, -1)
//   return (mag_norm_scale - 1) * F.linear(x, weight) + mag_norm_scale * up * scaling
// Its locals stay referenced until it returns. The magnitude, one per output feature, is a
// trainable parameter of the adapters' dtype ("<module>.lora_magnitude_vector.default.weight").
//
// Under autocast, lora_A(x_eye) runs on autocast's cached cast of lora_A and its node saves the
// half cast of x_eye, alive until lora_weight dies: the cast is made here and held as long.
int DoraOutput(GraphBuilder& b, const std::string& scope, int x, int up,
               std::pair<int, int> adapter, int weight, double scaling, DType dtype, DType half,
               std::map<std::string, int>& magnitudes) {
  if (!b.ok()) return -1;
  const int64_t in = b.shape(x).back(), out = b.shape(up).back();
  auto [it, fresh] = magnitudes.try_emplace(scope, -1);
  if (fresh) {
    b.SetScope(scope + ".lora_magnitude_vector.default");
    it->second = b.Parameter("weight", {out}, dtype);
  }
  b.SetScope(scope + ".lora_magnitude_vector.default");
  const std::string x_dtype(DTypeName(b.tensor(x).dtype));
  const int eye = b.Add1("full", {}, {{"shape", std::vector<int64_t>{in, in}}, {"dtype", x_dtype}});
  // lora_weight is read detached only: its autograd nodes never run, and what they save lives
  // as long as they do, until lora_weight dies when forward returns. The same lifetimes: the
  // product of detached adapters, its intermediate held to the end.
  const int a = b.Add1("detach", {adapter.first});
  const int up_weight = b.Add1("detach", {adapter.second});
  int eye_in = eye;
  if (half != DType::kFloat32) {
    eye_in = b.Add1("to", {eye}, {{"dtype", std::string(DTypeName(half))}});
  }
  b.SetScope(scope + ".lora_A.default");
  const int eye_low = b.Add1("linear", {eye_in, a});
  b.SetScope(scope + ".lora_B.default");
  const int eye_up = b.Add1("linear", {eye_low, up_weight});
  b.SetScope(scope + ".lora_magnitude_vector.default");
  const int lora_weight =
      b.Add1("transpose", {eye_up}, {{"dim0", int64_t{0}}, {"dim1", int64_t{1}}});
  int w = weight;
  if (b.ok() && b.tensor(w).dtype != b.tensor(x).dtype) {
    w = b.Add1("to", {w}, {{"dtype", x_dtype}});
  }
  // get_weight_norm, on the detached product.
  const int scaled = b.Add1("mul", {lora_weight}, {{"scalar", scaling}});
  const int sum = b.Add1("add", {w, scaled});
  const int norm = b.Add1("detach", {b.Add1("norm", {sum}, {{"dim", std::vector<int64_t>{1}}})});
  const int ratio = b.Add1("div", {it->second, norm});
  const int mag_norm_scale = b.Add1("view", {ratio}, {{"shape", std::vector<int64_t>{1, -1}}});
  const int less_one = b.Add1("sub", {mag_norm_scale}, {{"scalar", 1.0}});
  const int base = b.Add1("linear", {x, w});
  const int first = b.Add1("mul", {less_one, base});
  const int scaled_up = b.Add1("mul", {mag_norm_scale, up});
  const int second = b.Add1("mul", {scaled_up}, {{"scalar", scaling}});
  const int result = b.Add1("add", {first, second});
  for (int local : {up, eye, eye_in, eye_low, lora_weight, norm, mag_norm_scale}) {
    b.HoldUntilLastOp(local);
  }
  if (w != weight) b.HoldUntilLastOp(w);
  b.SetScope(scope);
  return result;
}

}  // namespace

StatusOr<Graph> ApplyLora(const Graph& graph, const LoraConfig& lora, int64_t max_ops,
                          Budget* budget) {
  const std::vector<std::string> names = ModuleNames(graph);
  MEMEST_ASSIGN_OR_RETURN(NameSet saved, SavedModules(names, lora));
  MEMEST_ASSIGN_OR_RETURN(NameSet targets, Targets(graph, lora, names, saved));
  std::map<std::string_view, std::string_view> saved_of_scope;  // per distinct scope
  std::vector<std::string> saved_module(graph.ops.size());
  for (size_t i = 0; i < graph.ops.size() && !saved.empty(); ++i) {
    const std::string& scope = graph.ops[i].scope;
    auto [it, fresh] = saved_of_scope.try_emplace(scope);
    if (fresh) it->second = OutermostSaved(scope, saved);
    saved_module[i] = std::string(it->second);
  }

  // The adapted calls, by their last op: the adapter runs after it.
  const size_t n = graph.ops.size();
  std::vector<int> adapter_input(n, -1), base_weight(n, -1);
  std::vector<int> bnb_bits(n, 0);  // the base is bitsandbytes' Linear4bit (4), Linear8bitLt (8)
  for (const LinearCall& call :
       LinearCalls(graph, [&](const std::string& s) { return targets.count(s) > 0; })) {
    adapter_input[call.last] = call.input;
    base_weight[call.last] = call.weight;
    const std::string& kind = graph.ops[call.op].kind;
    bnb_bits[call.last] = kind == "linear_4bit" ? 4 : kind == "linear_8bit" ? 8 : 0;
    if (lora.use_dora && graph.ops[call.op].kind != "linear") {
      // A 4-bit base's weight is dequantized in every call; on a Conv1D, PEFT's transpose makes
      // the weight a new trainable leaf for the call (docs/lora.md): neither is modelled.
      return InvalidArgument("config.lora.use_dora: DoRA is modelled on nn.Linear bases; " +
                             Quote(graph.ops[call.op].scope) + " is " +
                             (bnb_bits[call.last] != 0 ? "a bitsandbytes layer (its weight "
                                                         "dequantized in every call)"
                                                       : "a Conv1D (fan_in_fan_out)"));
    }
  }

  Graph frozen = graph;  // PEFT's _mark_only_adapters_as_trainable
  for (Tensor& t : frozen.tensors) {
    if (t.role == TensorRole::kParameter) t.requires_grad = false;
  }
  const double scaling = lora.alpha / static_cast<double>(lora.rank);
  std::map<std::pair<std::string, int>, int> copies;    // (module, parameter) -> its copy
  std::map<std::string, std::pair<int, int>> adapters;  // module -> lora_A, lora_B weights
  std::map<std::string, int> magnitudes;                // module -> DoRA's magnitude

  auto emit = [&](int i, GraphBuilder& b, std::vector<int>& map) {
    const Op& op = frozen.ops[i];
    const std::string& module = saved_module[i];
    const bool cast = op.kind == "to" && HasAttr(op.attrs, "autocast_weight");
    if (module.empty() && !cast && adapter_input[i] < 0) return false;
    if (cast && module.empty()) {
      // autocast caches the casts of leaves that require grad only: each op that reads a frozen
      // weight casts it anew (AutocastInputs, as the readers are replayed), and keeps its own
      // cast where it saves it.
      map[op.outputs[0]] = map[op.inputs[0]];
      return true;
    }
    std::vector<int> inputs;
    for (int t : op.inputs) {
      const Tensor& leaf = frozen.tensors[t];
      if (module.empty() || leaf.role != TensorRole::kParameter) {
        inputs.push_back(map[t]);
        continue;
      }
      // ModulesToSaveWrapper: the module's trainable copy, `<module>.modules_to_save.default`.
      auto [it, fresh] = copies.try_emplace({module, t}, -1);
      if (fresh) {
        Tensor copy = leaf;
        const std::string_view rest = ScopeWithin(leaf.name, module)
                                          ? std::string_view(leaf.name).substr(module.size() + 1)
                                          : std::string_view(leaf.name).substr(leaf.name.rfind('.') + 1);
        copy.name = Escape(module, kMaxNameBytes) + ".modules_to_save.default." +
                    Escape(rest, kMaxNameBytes);
        copy.requires_grad = true;
        it->second = b.CopyLeaf(copy);
      }
      inputs.push_back(it->second);
    }
    const std::vector<int> outs = ReplayOp(frozen, op, std::move(inputs), op.attrs, b, map);
    if (adapter_input[i] < 0 || outs.empty() || !b.ok()) return true;

    // PEFT's lora.Linear.forward after its base layer.
    const int result = outs[0];
    int x = map[adapter_input[i]];
    // The caller's argument: referenced by the call until the module returns.
    const int module_input = x;
    const int64_t in = b.shape(x).empty() ? 0 : b.shape(x).back();
    const int64_t out = b.shape(result).empty() ? 0 : b.shape(result).back();
    const DType base = b.tensor(result).dtype;
    // _move_adapter_to_device_of_base_layer: the base weight's dtype where it is a float (a
    // packed 4-bit weight is not: the adapters stay as nn.Linear makes them, float32).
    DType dtype = frozen.tensors[base_weight[i]].dtype;
    if (!IsFloating(dtype)) dtype = DType::kFloat32;
    if (lora.autocast_adapter_dtype && (dtype == DType::kFloat16 || dtype == DType::kBFloat16)) {
      dtype = DType::kFloat32;
    }
    auto [it, fresh] = adapters.try_emplace(op.scope, -1, -1);
    if (fresh) {
      b.SetScope(op.scope + ".lora_A.default");
      it->second.first = b.Parameter("weight", {lora.rank, in}, dtype);
      b.SetScope(op.scope + ".lora_B.default");
      it->second.second = b.Parameter("weight", {out, lora.rank}, dtype);
    }
    b.SetScope(op.scope);
    // peft/tuners/lora/bnb.py, Linear4bit.forward and Linear8bitLt.forward: the casts happen
    // only outside autocast, the adapters' output cast before the sum; a 4-bit base's result is
    // cloned first ("defensively").
    const bool bnb = bnb_bits[i] != 0;
    const bool autocast = frozen.autocast != DType::kFloat32;
    int base_result = result;
    if (bnb_bits[i] == 4) base_result = b.Add1("clone", {result});
    int cast_input = -1;  // `x = x.to(...)`: a local of forward, alive until it returns
    if (b.tensor(x).dtype != dtype && !(bnb && autocast)) {
      x = cast_input = b.Add1("to", {x}, {{"dtype", std::string(DTypeName(dtype))}});
    }
    if (lora.dropout > 0) {
      b.SetScope(op.scope + ".lora_dropout.default");
      x = b.Add1("dropout", {x}, {{"p", lora.dropout}});
    }
    b.SetScope(op.scope + ".lora_A.default");
    const int low = b.Add1("linear", {x, it->second.first});
    b.SetScope(op.scope + ".lora_B.default");
    const int up = b.Add1("linear", {low, it->second.second});
    b.SetScope(op.scope);
    int added = -1, local = cast_input;  // what the sum adds; forward's local `x`
    if (lora.use_dora) {  // never over a 4-bit base (refused above)
      added = DoraOutput(b, op.scope, x, up, it->second, map[base_weight[i]], scaling, dtype,
                         frozen.autocast, magnitudes);
      local = x;  // `x = dropout(x)` rebinds it: the dropout's output (or the cast) is held
    } else {
      added = b.Add1("mul", {up}, {{"scalar", scaling}});
      if (bnb && !autocast && b.ok() && b.tensor(added).dtype != base) {
        added = b.Add1("to", {added}, {{"dtype", std::string(DTypeName(base))}});
      }
    }
    int sum = b.Add1("add", {base_result, added});
    if (!bnb && b.ok() && b.tensor(sum).dtype != base) {
      sum = b.Add1("to", {sum}, {{"dtype", std::string(DTypeName(base))}});
    }
    b.HoldUntilLastOp(local);
    b.HoldUntilLastOp(module_input);
    map[op.outputs[0]] = sum;
    return true;
  };
  StatusOr<Graph> out = ReplayGraph(frozen, emit, std::nullopt, nullptr, budget);
  if (!out.ok()) return out.status().Prefixed("config.lora: ");
  if (static_cast<int64_t>(out->ops.size()) > max_ops) {
    return ResourceExhausted("config.lora: the model with its adapters has " +
                             std::to_string(out->ops.size()) + " ops, more than the " +
                             std::to_string(max_ops) + " a request may build");
  }
  return out;
}

std::string LoraNote(const Graph& graph, const LoraConfig& lora) {
  int64_t modules = 0, copies = 0;
  std::string dtype = "float32";
  for (const Tensor& t : graph.tensors) {
    if (t.role != TensorRole::kParameter) continue;
    constexpr std::string_view kA = ".lora_A.default.weight";
    if (t.name.size() > kA.size() && t.name.compare(t.name.size() - kA.size(), kA.size(), kA) == 0) {
      ++modules;
      dtype = DTypeName(t.dtype);
    }
    if (t.name.find(".modules_to_save.default.") != std::string::npos) ++copies;
  }
  std::string targets;
  for (size_t k = 0; k < lora.target_modules.size() && k < 8; ++k) {
    targets += (k > 0 ? ", " : "") + Escape(lora.target_modules[k]);
  }
  if (lora.target_modules.size() > 8) targets += ", ...";
  std::ostringstream p;
  p << lora.dropout;
  return std::string(lora.use_dora ? "DoRA" : "LoRA") +
         " as PEFT's get_peft_model adds it: rank " + std::to_string(lora.rank) + " on " +
         std::to_string(modules) + " modules (" + targets + "), adapters in " + dtype +
         (lora.dropout > 0 ? ", dropout " + p.str() + " on their input" : "") +
         (lora.use_dora ? ", and a magnitude per output feature of each trains with them" : "") +
         "; every other parameter is frozen (no gradient, no optimizer state)" +
         (copies > 0 ? "; modules_to_save train a copy of their " + std::to_string(copies) +
                           " parameters beside the frozen originals"
                     : std::string());
}

}  // namespace memest
