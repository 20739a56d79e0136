#include "engine/passes/passes.h"

#include <limits>
#include <string_view>

namespace memest {
namespace {

enum class CastPolicy {
  kNone, kLowerPrecision, kFloat32, kSoftmax, kCrossEntropy, kSum, kCastsInside
};

CastPolicy PolicyOf(std::string_view kind) {
  static constexpr std::string_view kLower[] = {"linear", "addmm", "matmul", "bmm", "einsum",
                                                "conv1d", "conv2d", "scaled_dot_product_attention"};
  // cross_entropy is not on CUDA's list itself: it decomposes into log_softmax with an explicit
  // dtype (the logits', which autocast keeps) and nll_loss (float32 list).
  static constexpr std::string_view kFp32[] = {"layer_norm", "group_norm", "mse_loss", "exp",
                                               "log1p", "rsqrt", "pow"};
  for (std::string_view k : kLower) {
    if (k == kind) return CastPolicy::kLowerPrecision;
  }
  for (std::string_view k : kFp32) {
    if (k == kind) return CastPolicy::kFloat32;
  }
  if (kind == "softmax" || kind == "log_softmax") return CastPolicy::kSoftmax;
  if (kind == "cross_entropy") return CastPolicy::kCrossEntropy;
  if (kind == "sum") return CastPolicy::kSum;  // fp32_set_opt_dtype: accumulates into float32
  // bitsandbytes' MatMul4Bit (no custom_fwd) calls F.linear inside its forward, where autocast
  // casts; the rule makes those casts itself (engine/rules/quantized.cc).
  if (kind == "linear_4bit") return CastPolicy::kCastsInside;
  // MatMul8bitLt's addmm of the outlier columns (engine/rules/quantized_int8.cc); its other ops
  // are bitsandbytes' own, which autocast does not touch.
  if (kind == "int8_add_outliers") return CastPolicy::kCastsInside;
  return CastPolicy::kNone;
}

// The names of op's outputs, empty when none is named (the common case: no allocation).
std::vector<std::string> OutputNames(const Graph& g, const Op& op) {
  std::vector<std::string> names;
  for (size_t k = 0; k < op.outputs.size(); ++k) {
    const std::string& n = g.tensors[op.outputs[k]].name;
    if (n.empty()) continue;
    names.resize(op.outputs.size());
    names[k] = n;
  }
  return names;
}

}  // namespace

std::vector<int> MappedInputs(const Op& op, const std::vector<int>& map) {
  std::vector<int> inputs;
  inputs.reserve(op.inputs.size());
  for (int t : op.inputs) inputs.push_back(map[t]);
  return inputs;
}

std::vector<int> ReplayOp(const Graph& g, const Op& op, std::vector<int> inputs, Attrs attrs,
                          GraphBuilder& b, std::vector<int>& map) {
  std::vector<int> outs = b.Add(op.kind, std::move(inputs), std::move(attrs), OutputNames(g, op));
  for (size_t k = 0; k < outs.size(); ++k) map[op.outputs[k]] = outs[k];
  return outs;
}

StatusOr<Graph> ReplayGraph(const Graph& g, const OpEmitter& emit, std::optional<DType> autocast,
                            ReplayMap* replay, Budget* budget,
                            const std::vector<char>* drop_leaves) {
  GraphBuilder b;
  b.SetBudget(budget);
  b.SetRuntime(g.runtime);
  const DType half = autocast.value_or(g.autocast);
  if (half != DType::kFloat32) b.EnableAutocast(half);
  std::vector<int> map(g.tensors.size(), -1);
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    if (g.tensors[t].producer >= 0) continue;
    if (drop_leaves != nullptr && t < drop_leaves->size() && (*drop_leaves)[t]) continue;
    map[t] = b.CopyLeaf(g.tensors[t]);
  }
  std::vector<int> first_op(g.ops.size()), last_op(g.ops.size());  // op i's ops in the replay
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    first_op[i] = b.num_ops();
    if (static_cast<int>(i) == g.loss_begin) b.BeginLoss();
    b.SetScope(op.scope);
    if (!emit(static_cast<int>(i), b, map)) {
      std::vector<int> inputs;
      for (int t : op.inputs) {
        if (map[t] < 0) return Internal("replay: op " + std::to_string(i) + " reads a dropped tensor");
        inputs.push_back(map[t]);
      }
      ReplayOp(g, op, std::move(inputs), op.attrs, b, map);
    }
    if (!b.ok()) return b.status();
    last_op[i] = b.num_ops() - 1;
  }
  // A pipeline stage's "loss" is the activation it sends on (engine/passes/pipeline.h).
  const bool scalar = g.loss >= 0 && Numel(g.tensors[g.loss].shape) == 1;
  if (scalar) b.SetLoss(map[g.loss]);
  MEMEST_ASSIGN_OR_RETURN(Graph out, b.Finish(std::numeric_limits<int64_t>::max()));
  if (g.loss >= 0 && !scalar) out.loss = map[g.loss];
  out.blocks = g.blocks;
  for (size_t k = 0; k < g.checkpoints.size(); ++k) {
    const auto [first, last] = g.checkpoints[k];
    if (first_op[first] > last_op[last]) continue;  // its ops were all dropped
    out.checkpoints.emplace_back(first_op[first], last_op[last]);
    out.checkpoint_non_reentrant.push_back(g.checkpoint_non_reentrant[k]);
  }
  // What the model's code holds carries over to the tensors that replace the held ones.
  for (const HeldTensor& h : g.held) {
    if (map[h.tensor] >= 0) out.held.push_back({map[h.tensor], last_op[h.until_op]});
  }
  for (int t : g.outputs) {
    if (map[t] >= 0) out.outputs.push_back(map[t]);
  }
  for (int t : g.cache) {
    if (map[t] >= 0) out.cache.push_back(map[t]);
  }
  // The ops that replaced a copy and those that replaced its original, pairwise where there are
  // as many: candidates the step simulator checks before it shares their rules' answers.
  if (!g.copy_of.empty()) {
    out.copy_of.assign(out.ops.size(), -1);
    for (size_t i = 0; i < g.copy_of.size(); ++i) {
      const int j = g.copy_of[i];
      const int n = last_op[i] - first_op[i];
      if (j < 0 || n < 0 || n != last_op[j] - first_op[j]) continue;
      for (int k = 0; k <= n; ++k) out.copy_of[first_op[i] + k] = first_op[j] + k;
    }
  }
  if (replay != nullptr) *replay = ReplayMap{std::move(map), std::move(first_op), std::move(last_op)};
  return out;
}

void AutocastInputs(GraphBuilder& b, std::string_view kind, std::vector<int>& inputs, Attrs& attrs) {
  const DType half = b.graph_.autocast;
  StatusOr<int64_t> inplace = IntAttr(attrs, "inplace", 0, "");
  const bool in_place_softmax = (kind == "softmax" || kind == "log_softmax") && inplace.ok() &&
                                *inplace == 1;
  if (kind == "bmm_into" || in_place_softmax) {
    // memest.trace records 1.13's TransformerEncoderLayer / MultiheadAttention inference fast
    // path (bmm_into, an in-place softmax); PyTorch takes their Python path under autocast.
    b.Fail(InvalidArgument(
        b.ContextOr(kind) + ": " + std::string(kind) + (in_place_softmax ? " in place" : "") +
        " is the inference fast path of "
        "nn.TransformerEncoderLayer or nn.MultiheadAttention, which PyTorch does not take "
        "under autocast (config.precision); estimate this graph without autocast (float32 or "
        "a -pure precision)"));
    return;
  }
  const CastPolicy policy = PolicyOf(kind);
  if (policy == CastPolicy::kNone) return;
  if (policy == CastPolicy::kCastsInside) {
    attrs["autocast"] = std::string(DTypeName(half));
    return;
  }
  auto cast = [&](int t, DType to) {
    const Tensor& src = b.tensor(t);
    const bool weight = src.role == TensorRole::kParameter && src.requires_grad &&
                        src.dtype == DType::kFloat32 && to == half;
    if (weight) {
      if (b.autocast_weights_.size() <= static_cast<size_t>(t)) b.autocast_weights_.resize(t + 1, -1);
      if (b.autocast_weights_[t] >= 0) return b.autocast_weights_[t];
    }
    Attrs cast_attrs{{"dtype", std::string(DTypeName(to))}};
    if (weight) cast_attrs["autocast_weight"] = int64_t{1};
    const int out = b.Add1("to", {t}, std::move(cast_attrs));
    if (weight) b.autocast_weights_[t] = out;
    return out;
  };
  for (int& t : inputs) {
    const DType d = b.tensor(t).dtype;
    if (!IsFloating(d) || d == DType::kFloat64) continue;
    if (policy == CastPolicy::kLowerPrecision && d != half) t = cast(t, half);
    if (policy == CastPolicy::kFloat32 && d != DType::kFloat32) t = cast(t, DType::kFloat32);
    // cross_entropy_loss calls log_softmax(x, dim, x.scalar_type()): the log-probabilities stay
    // in the logits' dtype; nll_loss, on the float32 list, then works on a float32 copy of them.
    if (policy == CastPolicy::kCrossEntropy && d != DType::kFloat32 && &t == &inputs[0]) {
      attrs["nll_float32"] = int64_t{1};
    }
    if (policy == CastPolicy::kSum && d != DType::kFloat32) attrs["dtype_float32"] = int64_t{1};
    if (policy == CastPolicy::kSoftmax && d != DType::kFloat32) {
      // softmax(x, dtype=float): half inputs go straight in (half_to_float), others are
      // converted first.
      if (d == DType::kFloat16) attrs["half_to_float"] = int64_t{1};
      else t = cast(t, DType::kFloat32);
    }
  }
}

StatusOr<Graph> ApplyAutocast(const Graph& g, DType half) {
  StatusOr<Graph> out = ReplayGraph(g, [](int, GraphBuilder&, std::vector<int>&) { return false; },
                                    half);
  if (!out.ok()) return out.status().Prefixed("autocast: ");
  return out;
}

}  // namespace memest
