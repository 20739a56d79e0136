#include "engine/passes/tensor_parallel.h"

#include <algorithm>
#include <string>

#include "engine/ir/text.h"
#include "engine/passes/passes.h"
#include "engine/passes/tensor_parallel_internal.h"

namespace memest {

namespace {

using tensor_parallel::Sharder;
using tensor_parallel::Split;

// '*' matches any run of characters, anything else itself.
bool GlobMatches(std::string_view p, std::string_view s) {
  size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (pi < p.size() && p[pi] == s[si]) {
      ++pi;
      ++si;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

// The module a parameter belongs to: its name up to the last '.' ("h.3.attn.c_attn.weight" ->
// "h.3.attn.c_attn"), or the name itself.
std::string_view ModuleOf(std::string_view name) {
  const size_t dot = name.rfind('.');
  return dot == std::string_view::npos ? name : name.substr(0, dot);
}

// The first op that reads each tensor, and at which input; -1: none.
struct Readers {
  std::vector<int> op;
  std::vector<int> input;
  explicit Readers(const Graph& g) : op(g.tensors.size(), -1), input(g.tensors.size(), 0) {
    for (size_t i = 0; i < g.ops.size(); ++i) {
      const std::vector<int>& in = g.ops[i].inputs;
      for (size_t k = 0; k < in.size(); ++k) {
        if (op[in[k]] >= 0) continue;
        op[in[k]] = static_cast<int>(i);
        input[in[k]] = static_cast<int>(k);
      }
    }
  }
  // The first op that reads parameter p, looking through autocast's casts of it.
  int ConsumerOf(const Graph& g, int p, size_t* k) const {
    int t = p;
    while (op[t] >= 0 && g.ops[op[t]].kind == "to" && !g.ops[op[t]].outputs.empty()) {
      t = g.ops[op[t]].outputs[0];
    }
    *k = static_cast<size_t>(input[t]);
    return op[t];
  }
};

// The dim of parameter p the plan's `style` splits, from the op that reads it; -1: none (a
// row-parallel linear's bias). Refuses a parameter no linear or embedding reads.
StatusOr<int> PlanDim(const Graph& g, const Readers& readers, int p, TensorShardStyle style,
                      const std::string& entry) {
  size_t k = 0;
  const int i = readers.ConsumerOf(g, p, &k);
  const std::string kind = i < 0 ? std::string() : g.ops[i].kind;
  const bool col = style != TensorShardStyle::kRowwise;
  if (kind == "linear") return k == 1 ? (col ? 0 : 1) : (col ? 0 : -1);
  if (kind == "addmm") return k == 2 ? (col ? 1 : 0) : k == 0 ? (col ? 0 : -1) : -1;
  if (kind == "embedding" && k == 0 && !col) return 0;
  return InvalidArgument(entry + ": matches parameter " + Quote(g.tensors[p].name) + ", which " +
                         (i < 0 ? std::string("no op reads")
                                : "op " + std::to_string(i) + " (" + Escape(kind) + ") reads") +
                         "; a plan splits linears (colwise, rowwise) and embeddings (rowwise, by "
                         "vocabulary)");
}

// Per op: the heads a linear's output is viewed into ([.., h * hd] -> [.., h, hd] by the first
// op that reads it), 0 for other ops; and per tensor, the most heads of the linears it feeds.
struct Heads {
  std::vector<int64_t> of_op;
  std::vector<int64_t> most_from;
  Heads(const Graph& g, const Readers& readers)
      : of_op(g.ops.size(), 0), most_from(g.tensors.size(), 0) {
    for (size_t i = 0; i < g.ops.size(); ++i) {
      const Op& op = g.ops[i];
      if (op.kind != "linear" || op.inputs.empty() || op.outputs.empty()) continue;
      const int y = op.outputs[0];
      const int v = readers.op[y];
      if (v < 0 || (g.ops[v].kind != "view" && g.ops[v].kind != "reshape")) continue;
      const Shape& in = g.tensors[y].shape;
      const Shape& out = g.tensors[g.ops[v].outputs[0]].shape;
      if (in.empty() || out.size() != in.size() + 1 || out[out.size() - 2] <= 0 ||
          out[out.size() - 2] * out.back() != in.back()) {
        continue;
      }
      of_op[i] = out[out.size() - 2];
      int64_t& most = most_from[op.inputs[0]];
      most = std::max(most, of_op[i]);
    }
  }
};

// The shares a column-parallel weight's rows are cut into: t, or where its linear's output
// holds fewer heads than ranks while a linear beside it (the queries) holds enough, its heads:
// grouped-query attention's key-value heads, each rank holding one (vLLM's QKVParallelLinear
// and Megatron replicate them over t / heads ranks).
int64_t ColumnParts(const Graph& g, const Readers& readers, const Heads& heads, int p, int64_t t) {
  size_t k = 0;
  const int i = readers.ConsumerOf(g, p, &k);
  if (i < 0 || g.ops[i].kind != "linear" || g.ops[i].inputs.empty()) return t;
  const int64_t h = heads.of_op[i];
  if (h <= 0 || h >= t || t % h != 0 || heads.most_from[g.ops[i].inputs[0]] < t) return t;
  return h;
}

// The sequence dim of the model's inputs: the one of the first two the micro-batch is not.
int InputSequenceDim(const Tensor& t) { return t.batch_dim == 1 ? 0 : 1; }

// Which dim of `target` holds the inputs' sequence, followed from the inputs through the ops
// that make it (lookups, pointwise ops, transposes, views); `fallback` when it cannot be told.
int SequenceDimOf(const Graph& g, int target, int fallback) {
  std::vector<int> seq(g.tensors.size(), -1);
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    const Tensor& x = g.tensors[t];
    if (x.role == TensorRole::kInput && x.shape.size() >= 2) seq[t] = InputSequenceDim(x);
  }
  const int last = g.tensors[target].producer;
  for (int i = 0; i <= last; ++i) {
    const Op& op = g.ops[i];
    const int r = static_cast<int>(g.tensors[op.outputs[0]].shape.size());
    int d = -1;
    if (op.kind == "embedding") {
      d = seq[op.inputs[1]];
    } else if (tensor_parallel::IsElementwise(op.kind)) {
      for (int in : op.inputs) {
        if (seq[in] >= 0 && d < 0) d = seq[in] + r - static_cast<int>(g.tensors[in].shape.size());
      }
    } else if (seq[op.inputs.empty() ? 0 : op.inputs[0]] >= 0 && !op.inputs.empty()) {
      const int s = seq[op.inputs[0]];
      const int in_rank = static_cast<int>(g.tensors[op.inputs[0]].shape.size());
      if (op.kind == "transpose") {
        StatusOr<int64_t> a = IntAttr(op.attrs, "dim0", 0, ""), b = IntAttr(op.attrs, "dim1", 1, "");
        const int da = a.ok() ? static_cast<int>((*a + in_rank) % in_rank) : -1;
        const int db = b.ok() ? static_cast<int>((*b + in_rank) % in_rank) : -1;
        d = s == da ? db : s == db ? da : s;
      } else if (op.kind == "view" || op.kind == "reshape") {
        d = tensor_parallel::ReshapedDim(g.tensors[op.inputs[0]].shape,
                                         g.tensors[op.outputs[0]].shape, s, 1, -1);
      } else if (op.kind == "layer_norm" || op.kind == "rms_norm") {
        d = s;
      }
    }
    for (int o : op.outputs) seq[o] = d;
  }
  return seq[target] >= 0 ? seq[target] : fallback;
}

// Where sequence parallelism begins: the hidden state entering the first block (an activation
// to scatter, or a stage's received input), or without blocks the model's floating inputs.
void SequenceStart(const Graph& g, std::vector<Split>* split, int* scatter, int* dim) {
  if (!g.blocks.empty()) {
    for (const Op& op : g.ops) {
      if (!ScopeWithin(op.scope, g.blocks[0])) continue;
      for (int in : op.inputs) {
        const Tensor& x = g.tensors[in];
        if (!IsFloating(x.dtype) || x.shape.size() < 2 ||
            (x.role != TensorRole::kActivation && x.role != TensorRole::kInput)) {
          continue;
        }
        *dim = x.shape.size() >= 3 ? SequenceDimOf(g, in, 1) : 0;
        if (x.role == TensorRole::kInput) {
          (*split)[in] = Split{*dim, true};
        } else {
          *scatter = in;
        }
        break;
      }
      break;
    }
    // An interleaved stage's later model chunks receive their hidden state too (an input that
    // needs a gradient and that a block reads first): the sequence is split there as well.
    auto in_block = [&g](const Op& op) {
      for (const std::string& b : g.blocks) {
        if (ScopeWithin(op.scope, b)) return true;
      }
      return false;
    };
    for (const Op& op : g.ops) {
      for (int t : op.inputs) {
        const Tensor& x = g.tensors[t];
        if (x.role != TensorRole::kInput || !x.requires_grad || !IsFloating(x.dtype) ||
            x.shape.size() < 2 || !(*split)[t].none() || !in_block(op)) {
          continue;
        }
        (*split)[t] = Split{x.shape.size() >= 3 ? SequenceDimOf(g, t, 1) : 0, true};
      }
    }
    return;
  }
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    const Tensor& x = g.tensors[i];
    if (x.role == TensorRole::kInput && IsFloating(x.dtype) && x.shape.size() >= 2) {
      *dim = x.shape.size() >= 3 ? InputSequenceDim(x) : 0;
      (*split)[i] = Split{*dim, true};
    }
  }
}

// What each rank sends and receives through the group's collectives in one forward and
// backward of `g` (the rank's graph). Column-parallel linears reading the same input (q, k and v;
// gate and up) communicate it once, as Megatron's fused linear_qkv and linear_fc1 do.
int64_t CommunicatedBytes(const Graph& g, int64_t t) {
  int64_t total = 0;
  std::vector<bool> seen(g.tensors.size(), false);
  auto add = [&](int64_t bytes, int64_t times_t_minus_1_over_t) {
    (void)AddBytes(&total, bytes / t * (t - 1) * times_t_minus_1_over_t);
  };
  for (const Op& op : g.ops) {
    const Tensor& y = g.tensors[op.outputs[0]];
    if (op.kind == "tp_all_reduce") add(Bytes(y.shape, y.dtype), 2);
    if (op.kind == "tp_all_gather") add(Bytes(y.shape, y.dtype), 2);  // and the gradient back
    if (op.kind == "tp_from_local") add(Bytes(y.shape, y.dtype), 2);  // backward's all-reduce
    if (op.kind == "dtensor_embedding") {
      const Tensor& w = g.tensors[op.inputs[0]];
      // The whole lookup, reduced forward (a scattered output's gradient gathered back).
      add(Numel(g.tensors[op.inputs[1]].shape) * w.shape[1] * DTypeSize(w.dtype), 2);
    }
    if (op.kind == "tp_reduce_scatter" || op.kind == "tp_scatter") {
      add(Bytes(g.tensors[op.inputs[0]].shape, y.dtype), 2);  // forward, and the gather back
    }
    if (op.kind != "megatron_linear" || seen[op.inputs[0]]) continue;
    seen[op.inputs[0]] = true;
    const Tensor& x = g.tensors[op.inputs[0]];
    StatusOr<std::string> grad = StringAttr(op.attrs, "input_grad", "none", "");
    StatusOr<int64_t> gather = IntAttr(op.attrs, "gather_dim", -1, "");
    const int64_t whole = Bytes(x.shape, x.dtype) * (gather.ok() && *gather >= 0 ? t : 1);
    if (grad.ok() && *grad == "all_reduce") add(whole, 2);
    if (grad.ok() && *grad == "reduce_scatter") add(whole, 3);  // gathered twice, scattered once
  }
  return total;
}

// DTensor's optimizer ops redistribute a gradient whose placement is not its parameter's at
// every op that reads it, two at once in the for-loop Adam (lerp_ one, addcmul_ two): the whole
// table's gradient to the rank's rows (a chunk copy), a SequenceParallel norm's Partial gradient
// all-reduced into a new tensor. Norms keep Partial gradients: no finalize_model_grads copy.
void DTensorOptimizerScratch(TensorParallelView* view) {
  const Graph& g = view->graph;
  auto two = [&](int p) {
    const Tensor& w = g.tensors[p];
    int64_t bytes = 0;  // a parameter is at most kMaxTensorBytes: two of one fit
    (void)AddBytes(&bytes, Bytes(w.shape, w.dtype));
    (void)AddBytes(&bytes, Bytes(w.shape, w.dtype));
    view->optimizer_scratch.push_back({p, bytes});
  };
  for (const TensorParallelView::ParamBytes& p : view->whole_grads) two(p.param);
  for (int p : view->sequence_parallel_params) two(p);
  view->sequence_parallel_params.clear();
}

}  // namespace

bool PlanMatches(std::string_view pattern, std::string_view module) {
  if (GlobMatches(pattern, module)) return true;
  for (size_t dot = module.find('.'); dot != std::string_view::npos; dot = module.find('.', dot + 1)) {
    if (GlobMatches(pattern, module.substr(dot + 1))) return true;
  }
  return false;
}

namespace {

std::vector<TensorPlanEntry> MakeDefaultPlan(TensorShardStyle head) {
  std::vector<TensorPlanEntry> plan;
  for (const char* m : {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "c_attn", "c_fc",
                        "lm_head", "query", "key", "value", "intermediate.dense", "w1", "w3",
                        "linear_fc1", "q_b_proj", "kv_b_proj", "w13"}) {
    plan.push_back({m, std::string_view(m) == "lm_head" ? head : TensorShardStyle::kColwise});
  }
  for (const char* m : {"o_proj", "down_proj", "c_proj", "output.dense", "wte", "embed_tokens",
                        "w2", "linear_fc2"}) {
    plan.push_back({m, TensorShardStyle::kRowwise});
  }
  return plan;
}

}  // namespace

const std::vector<TensorPlanEntry>& DefaultTensorPlan(bool gather_lm_head) {
  static const auto* plain = new std::vector<TensorPlanEntry>(
      MakeDefaultPlan(TensorShardStyle::kColwise));
  static const auto* gathered = new std::vector<TensorPlanEntry>(
      MakeDefaultPlan(TensorShardStyle::kColwiseGathered));
  return gather_lm_head ? *gathered : *plain;
}

StatusOr<TensorParallelView> ShardTensorParallel(const Graph& graph, const ParallelismConfig& config,
                                                 ExpertLoad load) {
  const int64_t t = config.tensor;
  const bool given = !config.tensor_plan.empty();
  const std::vector<TensorPlanEntry>& plan =
      given ? config.tensor_plan : DefaultTensorPlan(config.gather_lm_head);
  TensorParallelView view;
  view.size = t;
  view.sequence_parallel = config.sequence_parallel;
  std::vector<Split> split(graph.tensors.size());
  std::vector<bool> used(plan.size(), false);
  Graph leaves = graph;  // the whole graph with each leaf's shape as the rank holds it
  const Readers readers(graph);
  const Heads heads(graph, readers);
  for (size_t p = 0; p < graph.tensors.size(); ++p) {
    Tensor& leaf = leaves.tensors[p];
    if (leaf.role != TensorRole::kParameter) continue;
    const std::string_view module = ModuleOf(leaf.name);
    for (size_t e = 0; e < plan.size(); ++e) {
      if (!PlanMatches(plan[e].module, module)) continue;
      used[e] = true;
      size_t k = 0;
      const std::string entry = "config.parallelism.tensor_plan[" + std::to_string(e) + "]";
      MEMEST_ASSIGN_OR_RETURN(int d, PlanDim(graph, readers, static_cast<int>(p), plan[e].style,
                                             given ? entry : "config.parallelism.tensor (the default plan's " + Quote(plan[e].module) + ")"));
      if (d < 0) break;
      // Replicated key-value heads in inference only: Megatron's training asserts
      // num_query_groups % tensor_model_parallel_size == 0.
      const bool inference = graph.loss < 0;
      const int64_t parts = inference && d == 0 && plan[e].style == TensorShardStyle::kColwise
                                ? ColumnParts(graph, readers, heads, static_cast<int>(p), t)
                                : t;
      if (leaf.shape[d] % parts != 0) {
        return InvalidArgument(
            "config.parallelism.tensor: " + std::to_string(t) + " ranks do not split dim " +
            std::to_string(d) + " of " + Quote(leaf.name) + " " + ShapeToString(leaf.shape) +
            " evenly" +
            (graph.ops[readers.ConsumerOf(graph, static_cast<int>(p), &k)].kind == "embedding"
                 ? "; Megatron pads the vocabulary to a multiple of 128 x the tensor-parallel "
                   "ranks (make_vocab_size_divisible_by): give the padded size (a preset's "
                   "vocab parameter)"
                 : std::string()));
      }
      leaf.shape[d] /= parts;
      leaf.strides = ContiguousStrides(leaf.shape);
      // A tied lm_head reads the embedding's vocabulary-split weight: with gather_lm_head its
      // logits are gathered too.
      const bool tied_head = config.gather_lm_head && !given &&
                             plan[e].style == TensorShardStyle::kRowwise && d == 0;
      split[p] = Split{d, false,
                       plan[e].style == TensorShardStyle::kColwiseGathered || tied_head};
      if (parts != t) split[p].parts = parts;
      ++view.sharded_params;
      break;
    }
  }
  for (size_t e = 0; e < plan.size() && given; ++e) {
    if (!used[e]) {
      return InvalidArgument("config.parallelism.tensor_plan[" + std::to_string(e) +
                             "].module: " + Quote(plan[e].module) +
                             " matches no module with parameters");
    }
  }
  if (view.sharded_params == 0) {
    return InvalidArgument("config.parallelism.tensor: the default plan splits no parameter of "
                           "this model (it knows the Hugging Face names q_proj, o_proj, c_attn, "
                           "...); name the modules in config.parallelism.tensor_plan");
  }
  // An inference KV cache [N, kv_heads, len, hd] holds the rank's key-value heads: 1/t of them,
  // or one when there are fewer heads than ranks (Megatron and vLLM replicate them then).
  for (Tensor& leaf : leaves.tensors) {
    if (!leaf.kv_cache || leaf.shape.size() != 4) continue;
    leaf.shape[1] = (leaf.shape[1] + t - 1) / t;
    leaf.strides = ContiguousStrides(leaf.shape);
  }
  int scatter = -1, seq = 1;
  if (config.sequence_parallel) SequenceStart(graph, &split, &scatter, &seq);
  for (size_t i = 0; i < graph.tensors.size(); ++i) {
    Tensor& leaf = leaves.tensors[i];
    if (leaf.role != TensorRole::kInput || split[i].none()) continue;
    if (leaf.shape[split[i].dim] % t != 0) {
      return InvalidArgument("config.parallelism.sequence_parallel: " + std::to_string(t) +
                             " ranks do not split the sequence (dim " +
                             std::to_string(split[i].dim) + " of " + Quote(leaf.name) + " " +
                             ShapeToString(leaf.shape) + ") evenly");
    }
    leaf.shape[split[i].dim] /= t;
    leaf.strides = ContiguousStrides(leaf.shape);
  }
  Sharder sharder(graph, t, config.sequence_parallel, seq, std::move(split), scatter, &view);
  view.dtensor = config.tensor_layers == TensorParallelLayers::kDTensor;
  if (view.dtensor) sharder.set_dtensor();
  MEMEST_RETURN_IF_ERROR(sharder.FindMoeLayers(load, config.sharding));
  StatusOr<Graph> out = ReplayGraph(
      leaves, [&](int i, GraphBuilder& b, std::vector<int>& map) { return sharder.Emit(i, b, map); },
      std::nullopt, &view.replay);
  if (!out.ok()) return out.status().Prefixed("config.parallelism.tensor: ");
  view.graph = std::move(*out);
  view.communicated_bytes = CommunicatedBytes(view.graph, t);
  if (view.dtensor) DTensorOptimizerScratch(&view);
  return view;
}

}  // namespace memest
