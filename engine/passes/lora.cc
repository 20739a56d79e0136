#include "engine/passes/lora.h"

#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include "engine/ir/text.h"
#include "engine/passes/passes.h"

namespace memest {
namespace {

// The data input of a module's one weighted op: linear(x, W) reads x first; HF Conv1D's
// addmm(bias, x, W) second. -1: not such an op.
int DataInputOf(const Graph& g, const Op& op) {
  if (op.kind == "linear" && op.inputs.size() >= 2) return 0;
  if (op.kind == "addmm" && op.inputs.size() == 3 &&
      g.tensors[op.inputs[2]].role == TensorRole::kParameter) {
    return 1;
  }
  return -1;
}

// Ops a Linear or Conv1D module runs besides its weighted op: autocast's casts and Conv1D's
// views.
bool Plumbing(std::string_view kind) {
  return kind == "to" || kind == "view" || kind == "reshape" || kind == "contiguous";
}

bool EndsWithModule(std::string_view name, std::string_view entry) {
  if (name == entry) return true;
  return name.size() > entry.size() && name.substr(name.size() - entry.size()) == entry &&
         name[name.size() - entry.size() - 1] == '.';
}

// Every module name of `g` in forward order: each op's scope and the scopes around it.
std::vector<std::string> ModuleNames(const Graph& g) {
  std::vector<std::string> names;
  std::set<std::string, std::less<>> seen;
  for (const Op& op : g.ops) {
    if (op.scope.empty() || seen.count(op.scope) > 0) continue;
    for (size_t dot = op.scope.find('.'); dot != std::string::npos;
         dot = op.scope.find('.', dot + 1)) {
      std::string outer = op.scope.substr(0, dot);
      if (seen.insert(outer).second) names.push_back(std::move(outer));
    }
    seen.insert(op.scope);
    names.push_back(op.scope);
  }
  return names;
}

// The module names config.lora.target_modules selects (all-linear expanded as PEFT's
// _maybe_include_all_linear_layers does), or the error naming the entry at fault.
StatusOr<std::set<std::string, std::less<>>> Targets(const Graph& g, const LoraConfig& lora,
                                                     const std::vector<std::string>& linear) {
  std::vector<std::string> entries = lora.target_modules;
  if (entries.size() == 1 && entries[0] == kLoraAllLinear) {
    // Base names of every Linear and Conv1D, less the output layer's name: the module of the
    // last weighted op before the loss.
    std::string output;
    const size_t end = g.loss_begin >= 0 ? static_cast<size_t>(g.loss_begin) : g.ops.size();
    for (size_t i = 0; i < end; ++i) {
      if (DataInputOf(g, g.ops[i]) >= 0) output = g.ops[i].scope;
    }
    std::set<std::string, std::less<>> base;
    for (const std::string& m : linear) base.insert(m.substr(m.rfind('.') + 1));
    base.erase(output);
    entries.assign(base.begin(), base.end());
  }
  const std::set<std::string, std::less<>> is_linear(linear.begin(), linear.end());
  std::set<std::string, std::less<>> targets;
  std::vector<bool> used(entries.size(), false);
  for (const std::string& m : ModuleNames(g)) {
    for (size_t k = 0; k < entries.size(); ++k) {
      if (!EndsWithModule(m, entries[k])) continue;
      if (is_linear.count(m) == 0) {
        return InvalidArgument(
            "config.lora.target_modules" +
            (lora.target_modules.size() == entries.size() ? "[" + std::to_string(k) + "]"
                                                           : std::string()) +
            ": " + Quote(entries[k]) + " matches the module " + Quote(m) +
            ", which is not a Linear or Conv1D (the layers memest adapts with LoRA)");
      }
      used[k] = true;
      targets.insert(m);
    }
  }
  if (targets.empty()) {
    return InvalidArgument("config.lora.target_modules: no module of the model matches " +
                           (entries.empty() ? std::string("all-linear (it has no Linear)")
                                            : Quote(entries[0]) +
                                                  (entries.size() > 1 ? " or the others" : "")) +
                           "; its Linear modules are named like " +
                           (linear.empty() ? std::string("(none)") : Quote(linear[0])));
  }
  for (size_t k = 0; k < entries.size() && lora.target_modules.size() == entries.size(); ++k) {
    if (!used[k]) {
      return InvalidArgument("config.lora.target_modules[" + std::to_string(k) + "]: " +
                             Quote(entries[k]) + " matches no module of the model");
    }
  }
  return targets;
}

// For each op, the outermost module of modules_to_save it runs in ("" for none), or the error
// naming an entry that matches no module.
StatusOr<std::vector<std::string>> SavedModuleOfOps(const Graph& g, const LoraConfig& lora) {
  std::vector<std::string> saved;
  const std::vector<std::string> names = ModuleNames(g);
  for (size_t k = 0; k < lora.modules_to_save.size(); ++k) {
    bool found = false;
    for (const std::string& m : names) {
      if (m.size() < lora.modules_to_save[k].size() ||
          m.compare(m.size() - lora.modules_to_save[k].size(), std::string::npos,
                    lora.modules_to_save[k]) != 0) {
        continue;  // PEFT's _set_trainable: key.endswith(entry)
      }
      found = true;
      saved.push_back(m);
    }
    if (!found) {
      return InvalidArgument("config.lora.modules_to_save[" + std::to_string(k) + "]: " +
                             Quote(lora.modules_to_save[k]) + " matches no module of the model");
    }
  }
  std::vector<std::string> of(g.ops.size());
  for (size_t i = 0; i < g.ops.size(); ++i) {
    for (const std::string& m : saved) {
      if (ScopeWithin(g.ops[i].scope, m) && (of[i].empty() || m.size() < of[i].size())) of[i] = m;
    }
  }
  return of;
}

}  // namespace

std::vector<std::string> LinearModules(const Graph& g) {
  std::map<std::string, int, std::less<>> weighted;  // scope -> weighted ops; -1: other ops too
  std::vector<std::string> order;
  for (const Op& op : g.ops) {
    auto [it, fresh] = weighted.try_emplace(op.scope, 0);
    if (fresh) order.push_back(op.scope);
    if (it->second < 0) continue;
    if (DataInputOf(g, op) >= 0) ++it->second;
    else if (!Plumbing(op.kind)) it->second = -1;
  }
  std::vector<std::string> linear;
  for (const std::string& s : order) {
    if (!s.empty() && weighted[s] == 1) linear.push_back(s);
  }
  return linear;
}

StatusOr<Graph> ApplyLora(const Graph& graph, const LoraConfig& lora, int64_t max_ops) {
  const std::vector<std::string> linear = LinearModules(graph);
  MEMEST_ASSIGN_OR_RETURN(auto targets, Targets(graph, lora, linear));
  MEMEST_ASSIGN_OR_RETURN(std::vector<std::string> saved_module, SavedModuleOfOps(graph, lora));

  // The adapted runs: the last op of each run of a target module's ops, and the module's input.
  const size_t n = graph.ops.size();
  std::vector<int> adapter_input(n, -1), base_weight(n, -1);
  for (size_t first = 0; first < n;) {
    size_t last = first;
    while (last + 1 < n && graph.ops[last + 1].scope == graph.ops[first].scope) ++last;
    if (targets.count(graph.ops[first].scope) > 0) {
      for (size_t i = first; i <= last; ++i) {
        const int in = DataInputOf(graph, graph.ops[i]);
        if (in < 0) continue;
        // The module's input and weight, back through its own casts and views.
        auto outside = [&](int t) {
          for (int p = graph.tensors[t].producer;
               p >= static_cast<int>(first) && Plumbing(graph.ops[p].kind);
               p = graph.tensors[t].producer) {
            t = graph.ops[p].inputs[0];
          }
          return t;
        };
        adapter_input[last] = outside(graph.ops[i].inputs[in]);
        base_weight[last] = outside(graph.ops[i].inputs[in == 0 ? 1 : 2]);
      }
    }
    first = last + 1;
  }

  Graph frozen = graph;  // PEFT's _mark_only_adapters_as_trainable
  for (Tensor& t : frozen.tensors) {
    if (t.role == TensorRole::kParameter) t.requires_grad = false;
  }
  const double scaling = lora.alpha / static_cast<double>(lora.rank);
  std::map<std::pair<std::string, int>, int> copies;    // (module, parameter) -> its copy
  std::map<std::string, std::pair<int, int>> adapters;  // module -> lora_A, lora_B weights

  auto emit = [&](int i, GraphBuilder& b, std::vector<int>& map) {
    const Op& op = frozen.ops[i];
    const std::string& module = saved_module[i];
    const bool cast = op.kind == "to" && HasAttr(op.attrs, "autocast_weight");
    if (module.empty() && !cast && adapter_input[i] < 0) return false;
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
        copy.name = module + ".modules_to_save.default." + std::string(rest);
        copy.requires_grad = true;
        it->second = b.CopyLeaf(copy);
      }
      inputs.push_back(it->second);
    }
    Attrs attrs = op.attrs;
    // autocast caches the casts of leaves that require grad only: a frozen weight is cast anew
    // for each op and freed after it.
    if (cast && !b.tensor(inputs[0]).requires_grad) attrs.erase("autocast_weight");
    std::vector<int> outs = b.Add(op.kind, std::move(inputs), std::move(attrs),
                                  OutputNames(frozen, op));
    for (size_t k = 0; k < outs.size(); ++k) map[op.outputs[k]] = outs[k];
    if (adapter_input[i] < 0 || outs.empty() || !b.ok()) return true;

    // PEFT's lora.Linear.forward after its base layer.
    const int result = outs[0];
    int x = map[adapter_input[i]];
    const int64_t in = b.shape(x).empty() ? 0 : b.shape(x).back();
    const int64_t out = b.shape(result).empty() ? 0 : b.shape(result).back();
    const DType base = b.tensor(result).dtype;
    DType dtype = frozen.tensors[base_weight[i]].dtype;  // _move_adapter_to_device_of_base_layer
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
    if (b.tensor(x).dtype != dtype) x = b.Add1("to", {x}, {{"dtype", std::string(DTypeName(dtype))}});
    if (lora.dropout > 0) {
      b.SetScope(op.scope + ".lora_dropout.default");
      x = b.Add1("dropout", {x}, {{"p", lora.dropout}});
    }
    b.SetScope(op.scope + ".lora_A.default");
    const int low = b.Add1("linear", {x, it->second.first});
    b.SetScope(op.scope + ".lora_B.default");
    const int up = b.Add1("linear", {low, it->second.second});
    b.SetScope(op.scope);
    const int scaled = b.Add1("mul", {up}, {{"scalar", scaling}});
    int sum = b.Add1("add", {result, scaled});
    if (b.ok() && b.tensor(sum).dtype != base) {
      sum = b.Add1("to", {sum}, {{"dtype", std::string(DTypeName(base))}});
    }
    map[op.outputs[0]] = sum;
    return true;
  };
  StatusOr<Graph> out = ReplayGraph(frozen, emit);
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
  return "LoRA as PEFT's get_peft_model adds it: rank " + std::to_string(lora.rank) + " on " +
         std::to_string(modules) + " modules (" + targets + "), adapters in " + dtype +
         (lora.dropout > 0 ? ", dropout " + p.str() + " on their input" : "") +
         "; every other parameter is frozen (no gradient, no optimizer state)" +
         (copies > 0 ? "; modules_to_save train a copy of their " + std::to_string(copies) +
                           " parameters beside the frozen originals"
                     : std::string());
}

}  // namespace memest
