#include "engine/passes/linear_modules.h"

#include <map>

namespace memest {

namespace {

// A parameter, or autocast's cast of one.
bool WeightLike(const Graph& g, int t) {
  const Tensor& w = g.tensors[t];
  if (w.role == TensorRole::kParameter) return true;
  if (w.producer < 0 || g.ops[w.producer].kind != "to") return false;
  return g.tensors[g.ops[w.producer].inputs[0]].role == TensorRole::kParameter;
}

}  // namespace

int LinearDataInput(const Graph& g, const Op& op) {
  if ((op.kind == "linear" || op.kind == "linear_4bit") && op.inputs.size() >= 2) return 0;
  if (op.kind == "linear_8bit" && op.inputs.size() >= 5) return 0;
  if (op.kind == "addmm" && op.inputs.size() == 3 && WeightLike(g, op.inputs[2])) return 1;
  return -1;
}

int BeforePlumbing(const Graph& g, int t, int first) {
  for (int p = g.tensors[t].producer; p >= first && LinearPlumbing(g.ops[p].kind);
       p = g.tensors[t].producer) {
    t = g.ops[p].inputs[0];
  }
  return t;
}

bool LinearPlumbing(std::string_view kind) {
  return kind == "to" || kind == "view" || kind == "reshape" || kind == "contiguous";
}

int LinearBiasInput(const Op& op, int data_input) {
  if (data_input != 0) return 0;  // addmm(bias, x, W)
  const size_t at = op.kind == "linear_8bit" ? 5 : 2;
  return op.inputs.size() > at ? static_cast<int>(at) : -1;
}

bool Int8LinearPart(std::string_view kind) {
  return kind == "int8_quantize_rows" || kind == "int8_outlier_inputs" ||
         kind == "int8_outlier_weight" || kind == "int8_add_outliers";
}

std::optional<TiedRead> ReadOutside(const Graph& g, const std::vector<bool>& weights,
                                    const std::set<std::string, std::less<>>& modules) {
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    if (modules.count(op.scope) > 0) continue;
    for (int t : op.inputs) {
      const int w = BeforePlumbing(g, t);
      if (weights[t] || weights[w]) return TiedRead{static_cast<int>(i), weights[t] ? t : w};
    }
  }
  return std::nullopt;
}

std::vector<std::string> LinearModules(const Graph& g) {
  // A module called several times runs its ops once per call: each run of its scope must hold
  // one weighted op and plumbing only.
  std::map<std::string, bool, std::less<>> linear_runs;  // scope -> every run so far is one call
  std::vector<std::string> order;
  const size_t n = g.ops.size();
  for (size_t first = 0; first < n;) {
    size_t last = first;
    while (last + 1 < n && g.ops[last + 1].scope == g.ops[first].scope) ++last;
    int weighted = 0;
    bool plumbing = true;
    for (size_t i = first; i <= last; ++i) {
      if (LinearDataInput(g, g.ops[i]) >= 0) ++weighted;
      else plumbing &= LinearPlumbing(g.ops[i].kind) || Int8LinearPart(g.ops[i].kind);
    }
    auto [it, fresh] = linear_runs.try_emplace(g.ops[first].scope, true);
    if (fresh) order.push_back(g.ops[first].scope);
    it->second = it->second && weighted == 1 && plumbing;
    first = last + 1;
  }
  std::vector<std::string> linear;
  for (const std::string& s : order) {
    if (!s.empty() && linear_runs[s]) linear.push_back(s);
  }
  return linear;
}

std::string OutputLayer(const Graph& g) {
  std::string output;
  const size_t end = g.loss_begin >= 0 ? static_cast<size_t>(g.loss_begin) : g.ops.size();
  for (size_t i = 0; i < end; ++i) {
    if (LinearDataInput(g, g.ops[i]) >= 0) output = g.ops[i].scope;
  }
  return output;
}

}  // namespace memest
