#include "engine/passes/fp8_te.h"

#include <set>
#include <vector>

#include "engine/ir/text.h"
#include "engine/passes/linear_modules.h"
#include "engine/passes/passes.h"
#include "engine/report/report.h"

namespace memest {

int64_t TeWorkspaceBytes(int compute_capability) {
  return compute_capability >= 90 ? (int64_t{32} << 20) + 1024 : int64_t{4} << 20;
}

bool TeMakesTransposes(int compute_capability) {
  return compute_capability < 100 || (compute_capability >= 120 && compute_capability < 130);
}

StatusOr<Graph> ApplyTeFp8(const Graph& graph, const Fp8Config& fp8, int compute_capability,
                           Budget* budget) {
  for (const Op& op : graph.ops) {
    if (op.kind == "layer_norm") {
      return InvalidArgument("config.fp8: the model has a LayerNorm (" + Quote(op.scope) +
                             "), which accelerate makes a te.LayerNorm: it runs in bfloat16 and "
                             "keeps a bfloat16 copy of its input, not modelled (RMSNorm models "
                             "are)");
    }
  }
  const std::vector<std::string> linear = LinearModules(graph);
  const std::set<std::string, std::less<>> modules(linear.begin(), linear.end());
  std::vector<LinearCall> calls(graph.ops.size());  // by the call's last op
  std::set<std::string, std::less<>> converted;
  std::vector<std::string> stopped;  // parents whose conversion returned early
  for (const LinearCall& call :
       LinearCalls(graph, [&](const std::string& s) { return modules.count(s) > 0; })) {
    const Op& op = graph.ops[call.op];
    if (op.kind != "linear") continue;  // a Conv1D is not an nn.Linear
    bool skipped = false;
    for (const std::string& p : stopped) skipped = skipped || ScopeWithin(op.scope, p);
    if (skipped) continue;
    const Shape& w = graph.tensors[call.weight].shape;
    if (w.size() != 2 || w[0] % 16 != 0 || w[1] % 16 != 0) {
      stopped.emplace_back(ScopeParent(op.scope));  // convert_model's `return`
      continue;
    }
    calls[call.last] = call;
    converted.insert(op.scope);
  }
  if (converted.empty()) {
    return InvalidArgument(
        "config.fp8: the model has no nn.Linear whose dimensions are "
        "multiples of 16 for TransformerEngine to run in fp8");
  }
  // A converted weight read outside its module (a tied output layer): accelerate's new
  // te.Linear unties it, and its optimizer mapping leaves the copy out.
  std::vector<bool> weights(graph.tensors.size(), false);
  for (const LinearCall& call : calls) {
    if (call.first >= 0) weights[call.weight] = true;
  }
  if (const std::optional<TiedRead> tied = ReadOutside(graph, weights, converted)) {
    return InvalidArgument("config.fp8: the weight " + Quote(graph.tensors[tied->weight].name) +
                           " is also read in " + Quote(graph.ops[tied->op].scope) +
                           " (tied); accelerate's te.Linear unties it and leaves the copy out "
                           "of the optimizer, not modelled");
  }
  const bool delayed = fp8.recipe == Fp8Recipe::kDelayed;
  const int64_t history = fp8.amax_history_len;
  const int64_t transposes = TeMakesTransposes(compute_capability) ? 1 : 0;
  std::set<std::string> with_meta;
  bool workspace = false;
  auto emit = [&](int i, GraphBuilder& b, std::vector<int>& map) {
    const Op& op = graph.ops[i];
    if (converted.count(op.scope) == 0) return false;
    const LinearCall& call = calls[i];
    if (call.first < 0) return true;  // inside a call (autocast's casts): its last op stands for it
    if (!workspace) {
      workspace = true;
      const std::string scope = b.scope();
      b.SetScope("transformer_engine");
      b.Buffer("cublas_workspace", {TeWorkspaceBytes(compute_capability)}, DType::kUInt8);
      b.SetScope(scope);
    }
    if (delayed && with_meta.insert(op.scope).second) {
      b.Buffer("fp8_meta.amax_history_fwd", {history, 3}, DType::kFloat32);
      b.Buffer("fp8_meta.amax_history_bwd", {history, 2}, DType::kFloat32);
      b.Buffer("fp8_meta.scale_fwd", {3}, DType::kFloat32);
      b.Buffer("fp8_meta.scale_bwd", {2}, DType::kFloat32);
    }
    const DType act =
        graph.autocast != DType::kFloat32 ? graph.autocast : graph.tensors[call.weight].dtype;
    std::vector<int> inputs = {map[call.input], map[call.weight]};
    if (call.bias >= 0) inputs.push_back(map[call.bias]);
    map[op.outputs[0]] =
        b.Add1("te_linear", std::move(inputs),
               {{"activation_dtype", std::string(DTypeName(act))}, {"transposes", transposes}});
    return true;
  };
  StatusOr<Graph> out = ReplayGraph(graph, emit, std::nullopt, nullptr, budget);
  if (!out.ok()) return out.status().Prefixed("config.fp8: ");
  return out;
}

std::string TeFp8Note(const Graph& graph, const Fp8Config& fp8) {
  int64_t modules = 0, workspace = 0;
  bool transposes = true;
  std::set<int> seen;
  for (const Op& op : graph.ops) {
    if (op.kind != "te_linear" || !seen.insert(op.inputs[1]).second) continue;
    ++modules;
    StatusOr<int64_t> t = IntAttr(op.attrs, "transposes", 1, "");
    transposes = !t.ok() || *t != 0;
  }
  for (const Tensor& t : graph.tensors) {
    if (t.name == "transformer_engine.cublas_workspace") workspace = Bytes(t.shape, t.dtype);
  }
  const bool delayed = fp8.recipe == Fp8Recipe::kDelayed;
  return "fp8 training with TransformerEngine (te.Linear under fp8_autocast, " +
         std::string(delayed
                         ? "DelayedScaling, amax history " + std::to_string(fp8.amax_history_len)
                         : std::string("Float8CurrentScaling")) +
         "): " + std::to_string(modules) +
         " nn.Linear modules as te.Linear; each keeps for "
         "backward its input in fp8 (a byte a value) and its fp8 weight" +
         (transposes ? " with the transpose (two bytes a weight: fp8 GEMMs take the TN layout "
                       "only on this GPU)"
                     : "") +
         ", and TE's cuBLAS workspace takes " + FormatBytes(workspace) +
         (delayed ? "; each module's amax histories and scales are float32" : "");
}

}  // namespace memest
