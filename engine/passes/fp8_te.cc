#include "engine/passes/fp8_te.h"

#include <map>
#include <set>
#include <vector>

#include "engine/passes/linear_modules.h"
#include "engine/passes/passes.h"
#include "engine/report/report.h"

namespace memest {

StatusOr<Graph> ApplyTeFp8(const Graph& graph, const Fp8Config& fp8, Budget* budget) {
  const std::vector<std::string> linear = LinearModules(graph);
  const std::set<std::string, std::less<>> modules(linear.begin(), linear.end());
  std::vector<LinearCall> calls(graph.ops.size());  // by the call's last op
  std::set<std::string, std::less<>> converted;
  for (const LinearCall& call :
       LinearCalls(graph, [&](const std::string& s) { return modules.count(s) > 0; })) {
    const Op& op = graph.ops[call.op];
    const Shape& w = graph.tensors[call.weight].shape;
    // nn.Linear only (a Conv1D is not one); accelerate leaves a weight whose dims are not
    // multiples of 16.
    if (op.kind != "linear" || w.size() != 2 || w[0] % 16 != 0 || w[1] % 16 != 0) continue;
    calls[call.last] = call;
    converted.insert(op.scope);
  }
  if (converted.empty()) {
    return InvalidArgument(
        "config.fp8: the model has no nn.Linear whose dimensions are "
        "multiples of 16 for TransformerEngine to run in fp8");
  }
  const bool delayed = fp8.recipe == Fp8Recipe::kDelayed;
  const int64_t history = fp8.amax_history_len;
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
      b.Buffer("cublas_workspace", {kTeWorkspaceBytes}, DType::kUInt8);
      b.SetScope(scope);
    }
    if (delayed && with_meta.insert(op.scope).second) {
      b.Buffer("fp8_meta.amax_history_fwd", {history, 3}, DType::kFloat32);
      b.Buffer("fp8_meta.amax_history_bwd", {history, 2}, DType::kFloat32);
      b.Buffer("fp8_meta.scale_fwd", {3}, DType::kFloat32);
      b.Buffer("fp8_meta.scale_bwd", {2}, DType::kFloat32);
    }
    const int x = map[call.input];
    const int weight = map[call.weight];
    const DType act =
        graph.autocast != DType::kFloat32 ? graph.autocast : graph.tensors[call.weight].dtype;
    std::vector<int> inputs = {x, weight};
    if (call.bias >= 0) inputs.push_back(map[call.bias]);
    map[op.outputs[0]] =
        b.Add1("te_linear", std::move(inputs), {{"activation_dtype", std::string(DTypeName(act))}});
    return true;
  };
  StatusOr<Graph> out = ReplayGraph(graph, emit, std::nullopt, nullptr, budget);
  if (!out.ok()) return out.status().Prefixed("config.fp8: ");
  return out;
}

std::string TeFp8Note(const Graph& graph, const Fp8Config& fp8) {
  int64_t modules = 0;
  std::set<int> seen;
  for (const Op& op : graph.ops) {
    if (op.kind == "te_linear" && seen.insert(op.inputs[1]).second) ++modules;
  }
  const bool delayed = fp8.recipe == Fp8Recipe::kDelayed;
  return "fp8 training with TransformerEngine (accelerate's convert_model and fp8_autocast, " +
         std::string(delayed
                         ? "DelayedScaling, amax history " + std::to_string(fp8.amax_history_len)
                         : std::string("Float8CurrentScaling")) +
         "): " + std::to_string(modules) +
         " nn.Linear modules as te.Linear; each keeps for backward the fp8 transpose of its "
         "input (a byte a value) and its fp8 weight with the transpose (two bytes a weight), "
         "and TE's cuBLAS workspace takes " +
         FormatBytes(kTeWorkspaceBytes) +
         (delayed ? "; each module's amax histories and scales are float32" : "");
}

}  // namespace memest
