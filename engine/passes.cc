#include "engine/passes.h"

#include <limits>
#include <string_view>

namespace memest {
namespace {

enum class CastPolicy { kNone, kLowerPrecision, kFloat32, kSoftmax };

CastPolicy PolicyOf(std::string_view kind) {
  static constexpr std::string_view kLower[] = {"linear", "addmm", "matmul", "bmm", "einsum",
                                                "conv1d", "conv2d", "scaled_dot_product_attention"};
  // cross_entropy is not on CUDA's list itself: it decomposes into log_softmax (float32 output,
  // as softmax) and nll_loss (float32).
  static constexpr std::string_view kFp32[] = {"layer_norm", "group_norm", "mse_loss", "exp",
                                               "log1p", "rsqrt", "pow"};
  for (std::string_view k : kLower) {
    if (k == kind) return CastPolicy::kLowerPrecision;
  }
  for (std::string_view k : kFp32) {
    if (k == kind) return CastPolicy::kFloat32;
  }
  if (kind == "softmax" || kind == "log_softmax" || kind == "cross_entropy") {
    return CastPolicy::kSoftmax;
  }
  return CastPolicy::kNone;
}

}  // namespace

StatusOr<Graph> ReplayGraph(const Graph& g, const OpEmitter& emit) {
  GraphBuilder b;
  std::vector<int> map(g.tensors.size(), -1);
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    if (g.tensors[t].producer < 0) map[t] = b.CopyLeaf(g.tensors[t]);
  }
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    if (static_cast<int>(i) == g.loss_begin) b.BeginLoss();
    b.SetScope(op.scope);
    if (!emit(static_cast<int>(i), b, map)) {
      std::vector<int> inputs;
      for (int t : op.inputs) {
        if (map[t] < 0) return Internal("replay: op " + std::to_string(i) + " reads a dropped tensor");
        inputs.push_back(map[t]);
      }
      std::vector<std::string> names;
      for (int o : op.outputs) names.push_back(g.tensors[o].name);
      std::vector<int> outs = b.Add(op.kind, std::move(inputs), op.attrs, std::move(names));
      for (size_t k = 0; k < outs.size(); ++k) map[op.outputs[k]] = outs[k];
    }
    if (!b.ok()) return b.status();
  }
  if (g.loss >= 0) b.SetLoss(map[g.loss]);
  MEMEST_ASSIGN_OR_RETURN(Graph out, b.Finish(std::numeric_limits<int64_t>::max()));
  out.blocks = g.blocks;
  return out;
}

StatusOr<Graph> ApplyAutocast(const Graph& g, DType half) {
  std::vector<int> weight_cast(g.tensors.size(), -1);  // autocast's cache, by new tensor id
  auto emit = [&](int i, GraphBuilder& b, std::vector<int>& map) {
    const Op& op = g.ops[i];
    auto cast = [&](int t, DType to) {
      const Tensor& src = b.tensor(t);
      const bool weight = src.role == TensorRole::kParameter && src.requires_grad &&
                          src.dtype == DType::kFloat32 && to == half;
      if (weight && t < static_cast<int>(weight_cast.size()) && weight_cast[t] >= 0) {
        return weight_cast[t];
      }
      Attrs attrs{{"dtype", std::string(DTypeName(to))}};
      if (weight) attrs["autocast_weight"] = int64_t{1};
      const int out = b.Add1("to", {t}, std::move(attrs));
      if (weight && t < static_cast<int>(weight_cast.size())) weight_cast[t] = out;
      return out;
    };
    std::vector<int> inputs;
    for (int t : op.inputs) inputs.push_back(map[t]);
    Attrs attrs = op.attrs;
    const CastPolicy policy = PolicyOf(op.kind);
    for (int& t : inputs) {
      const DType d = b.tensor(t).dtype;
      if (!IsFloating(d) || d == DType::kFloat64) continue;
      if (policy == CastPolicy::kLowerPrecision && d != half) t = cast(t, half);
      if (policy == CastPolicy::kFloat32 && d != DType::kFloat32) t = cast(t, DType::kFloat32);
      if (policy == CastPolicy::kSoftmax && d != DType::kFloat32) {
        // softmax(x, dtype=float): half inputs go straight in (half_to_float), others are
        // converted first.
        if (d == DType::kFloat16) attrs["half_to_float"] = int64_t{1};
        else t = cast(t, DType::kFloat32);
      }
    }
    std::vector<std::string> names;
    for (int o : op.outputs) names.push_back(g.tensors[o].name);
    std::vector<int> outs = b.Add(op.kind, std::move(inputs), std::move(attrs), std::move(names));
    for (size_t k = 0; k < outs.size(); ++k) map[op.outputs[k]] = outs[k];
    return true;
  };
  StatusOr<Graph> out = ReplayGraph(g, emit);
  if (!out.ok()) return out.status().Prefixed("autocast: ");
  return out;
}

}  // namespace memest
