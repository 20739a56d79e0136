// The three front ends: presets (engine/models/presets.cc), layer models and op graphs.
#include "engine/models/model.h"

#include <cmath>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "engine/ir/text.h"
#include "engine/models/hf_config.h"
#include "engine/models/layers.h"
#include "engine/models/op_graph_batch.h"
#include "engine/models/presets.h"

namespace memest {

using namespace std::string_view_literals;  // kind == "linear"sv: lengths first
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

// Refuses attribute names and string values longer than a name may be (kMaxNameBytes).
Status CheckAttrSizes(const Attrs& attrs, const std::string& field) {
  for (const auto& [name, value] : attrs) {
    MEMEST_RETURN_IF_ERROR(CheckNameSize(name, field + ".attrs"));
    if (const auto* s = std::get_if<std::string>(&value)) {
      MEMEST_RETURN_IF_ERROR(CheckNameSize(*s, field + ".attrs." + name));
    }
  }
  return Status::Ok();
}

}  // namespace

LayerContext LayerContextOf(const BuildContext& context) {
  LayerContext c;
  c.mode = context.mode;
  c.param_dtype = context.param_dtype;
  c.attention = context.attention == AttentionImpl::kDefault ? AttentionImpl::kEager
                                                              : context.attention;
  c.compute_capability = context.compute_capability;
  c.autocast = context.autocast;
  c.rotary_positions = context.serving ? context.rotary_positions : 0;
  c.rotary_local_positions = context.serving ? context.rotary_local_positions : 0;
  c.vllm = context.serving;
  c.mla_workspace_rows = context.mla_workspace_rows;
  c.megatron = context.megatron;
  c.use_cache = ReturnsCache(context);
  return c;
}

void ConfigureBuilder(const BuildContext& context, GraphBuilder& b) {
  b.SetMaxOps(context.max_ops);
  b.SetRuntime(context.runtime);
  b.SetBudget(context.budget);
  b.SetStamping(context.stamp_blocks);
}

bool ReturnsCache(const BuildContext& context) {
  return context.use_cache && !context.serving && !context.megatron;
}

Status ValidateBuildContext(const BuildContext& context) {
  if (context.micro_batch <= 0) {
    return InvalidArgument("config.batch_size: the micro-batch must be positive, got " +
                           Str(context.micro_batch));
  }
  if (context.generate_tokens < 0) {
    return InvalidArgument("config.generate_tokens: must be non-negative, got " +
                           Str(context.generate_tokens));
  }
  return Status::Ok();
}

namespace {

// Sizes must be positive for a model's input (a zero-size batch predicts nothing useful) and
// non-negative for declared tensors; both must fit in bytes.
Status ValidateShape(const Shape& shape, DType dtype, const std::string& field, bool positive) {
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0 || (positive && shape[i] == 0)) {
      return InvalidArgument(field + "[" + Str(i) + "]: must be " +
                             (positive ? "positive" : "non-negative") + ", got " + Str(shape[i]));
    }
  }
  return CheckedBytes(shape, dtype, field).status();
}

}  // namespace

namespace {

StatusOr<Graph> BuildFrontEnd(const ModelSpec& model, const BuildContext& context) {
  if (const auto* preset = std::get_if<PresetSpec>(&model.source)) {
    return BuildPreset(*preset, context);
  }
  if (const auto* layers = std::get_if<LayerModelSpec>(&model.source)) {
    return BuildLayerModel(*layers, context);
  }
  if (const auto* hf = std::get_if<HfConfigSpec>(&model.source)) {
    return BuildHfConfig(*hf, context);
  }
  return BuildOpGraph(std::get<OpGraphSpec>(model.source), context);
}

// The graph, or its size error attributed to the batch when one sample builds: a tensor too
// large whose size no field explains alone, such as the batch folded into a [B * T, C]
// activation, is the batch's fault.
StatusOr<Graph> BuildAttributed(const ModelSpec& model, const BuildContext& context) {
  StatusOr<Graph> graph = BuildFrontEnd(model, context);
  if (graph.ok() || context.micro_batch == 1 || !IsUnattributedSizeError(graph.status())) {
    return graph;
  }
  BuildContext one = context;
  one.micro_batch = 1;
  if (!BuildFrontEnd(model, one).ok()) return graph;
  std::string why = graph.status().message();
  if (why.rfind("model: ", 0) == 0) why.erase(0, 7);
  return InvalidArgument("config.batch_size: " + Str(context.micro_batch) + " is too large: " +
                         why);
}

}  // namespace

StatusOr<Graph> BuildGraph(const ModelSpec& model, const BuildContext& context) {
  MEMEST_RETURN_IF_ERROR(ValidateBuildContext(context));
  const auto* hf = std::get_if<HfConfigSpec>(&model.source);
  const bool routes = hf != nullptr && HfConfigRoutesExperts(hf->config);
  StatusOr<Graph> graph = BuildAttributed(model, context);
  // An op graph with Megatron's MoE dispatch (ep_all_to_all) records its own routing; the load
  // spreads the tokens its expert-parallel ranks receive (engine/passes/expert_parallel.h).
  bool dispatch = false;
  if (graph.ok() && !routes) {
    for (const Op& op : graph->ops) dispatch = dispatch || op.kind == "ep_all_to_all"sv;
  }
  if (context.expert_load != ExpertLoad::kDefault && !routes && !dispatch && graph.ok()) {
    return InvalidArgument(
        "config.expert_load: the model has no mixture-of-experts layer for it to apply to "
        "(Hugging Face configs of mixtral, qwen2_moe and qwen3_moe have them, and op graphs "
        "with Megatron's ep_all_to_all dispatch); leave it unset");
  }
  if (graph.ok() && context.mode == Mode::kInference && context.generate_tokens > 0) {
    bool kv_cache = !graph->cache.empty();  // the prompt's, returned by the forward
    for (const Tensor& t : graph->tensors) kv_cache = kv_cache || t.kv_cache;
    if (!kv_cache) {
      return InvalidArgument(
          "config.generate_tokens: the model keeps no KV cache, so generated tokens change "
          "nothing (the decoders, GPT-2 and the Llama family, keep one); leave it 0");
    }
  }
  return graph;
}

// ---------------------------------------------------------------------------------------------
// Layer models.

StatusOr<Graph> BuildLayerModel(const LayerModelSpec& spec, const BuildContext& context) {
  MEMEST_RETURN_IF_ERROR(ValidateBuildContext(context));
  if (spec.layers.empty()) return InvalidArgument("model.layers: must list at least one layer");
  if (spec.loss != "sum" && spec.loss != "mse" && spec.loss != "cross_entropy") {
    return InvalidArgument("model.loss: must be one of cross_entropy, mse, sum, got " +
                           Quote(spec.loss));
  }
  Shape input_shape = {context.micro_batch};
  input_shape.insert(input_shape.end(), spec.input_shape.begin(), spec.input_shape.end());
  for (size_t i = 0; i < spec.input_shape.size(); ++i) {
    if (spec.input_shape[i] <= 0) {
      return InvalidArgument("model.input_shape[" + Str(i) + "]: must be positive, got " +
                             Str(spec.input_shape[i]));
    }
  }
  // Floating inputs follow the parameters' dtype (a pure-precision model is fed in that dtype);
  // integer inputs (token ids) keep theirs.
  const DType input_dtype = IsFloating(spec.input_dtype) ? context.param_dtype : spec.input_dtype;
  const LayerContext c = LayerContextOf(context);

  GraphBuilder b;
  ConfigureBuilder(context, b);
  // A shape too large to count in bytes names the size the user set (GraphBuilder::NameSize).
  b.NameSize(context.micro_batch, "config.batch_size");
  for (size_t i = 0; i < spec.input_shape.size(); ++i) {
    b.NameSize(spec.input_shape[i], "model.input_shape[" + Str(i) + "]");
  }

  if (context.autocast != DType::kFloat32) b.EnableAutocast(context.autocast);
  int x = b.Input("input", input_shape, input_dtype, 0);
  std::set<std::string> scopes;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& layer = spec.layers[i];
    const std::string field = "model.layers[" + Str(i) + "]";
    MEMEST_RETURN_IF_ERROR(CheckNameSize(layer.name, field + ".name"));
    MEMEST_RETURN_IF_ERROR(CheckAttrSizes(layer.attrs, field));
    const std::string scope = layer.name.empty() ? Str(i) : layer.name;
    if (!scopes.insert(scope).second) {
      return InvalidArgument(field + ".name: " + Quote(scope) + " names an earlier layer too");
    }
    b.SetErrorContext(field);
    ScopeGuard guard(b, scope);
    b.MarkBlock();
    MEMEST_ASSIGN_OR_RETURN(x, ExpandLayer(b, x, layer, c, field));
  }
  b.SetErrorContext("model");
  if (context.mode == Mode::kTraining && b.ok()) {
    const Shape out = b.shape(x);
    if (spec.loss == "sum") {
      b.BeginLoss();
      b.SetLoss(b.Add1("sum", {x}));
    } else if (spec.loss == "mse") {
      b.BeginLoss();
      int target = b.Target("target", out, b.tensor(x).dtype, 0);
      b.SetLoss(b.Add1("mse_loss", {x, target}));
    } else {
      if (out.size() < 2) {
        return InvalidArgument("model.loss: cross_entropy needs an output [N, .., classes], got " +
                               ShapeToString(out));
      }
      b.BeginLoss();
      int target = b.Target("target", Shape(out.begin(), out.end() - 1), DType::kInt64, 0);
      int logits = x;
      if (out.size() > 2) {
        logits = b.Add1("reshape", {x}, {{"shape", AttrInts({-1, out.back()})}});
        target = b.Add1("reshape", {target}, {{"shape", AttrInts({-1})}});
      }
      b.SetLoss(b.Add1("cross_entropy", {logits, target}));
    }
  }
  return b.Finish(context.max_ops);
}

// ---------------------------------------------------------------------------------------------
// Op graphs.

namespace {

bool IsLeafRole(TensorRole role) { return role != TensorRole::kActivation; }


// Refuses non-finite float attributes (a NaN dropout probability, an infinite scalar).
Status CheckFiniteAttrs(const Attrs& attrs, const std::string& field) {
  for (const auto& [name, value] : attrs) {
    if (const auto* d = std::get_if<double>(&value); d != nullptr && !std::isfinite(*d)) {
      return InvalidArgument(field + ".attrs." + Escape(name) + ": must be finite, got " +
                             std::to_string(*d));
    }
  }
  return Status::Ok();
}

// With rescaling, a declared dim may differ from the inferred one by the batch ratio
// (micro_batch / traced_batch), e.g. a flattened [B*T, C].
bool DimMatches(int64_t declared, int64_t inferred, int64_t traced, int64_t micro) {
  if (declared == inferred) return true;
  using Wide = __int128;  // each side is a product of two int64 values
  return traced > 0 && traced != micro &&
         static_cast<Wide>(declared) * micro == static_cast<Wide>(inferred) * traced;
}

// Graph::held and Graph::outputs from the spec's names: `ids` maps names to tensors, `made_by`
// names to the spec op that makes them (leaves are absent), and spec op i ends at graph op
// last_op[i].
Status AddPythonRefs(const OpGraphSpec& spec, const std::unordered_map<std::string, int>& ids,
                     const std::unordered_map<std::string, int64_t>& made_by,
                     const std::vector<int>& last_op, Graph* graph) {
  const int64_t n = static_cast<int64_t>(spec.ops.size());
  for (size_t k = 0; k < spec.held.size(); ++k) {
    const HeldSpec& h = spec.held[k];
    const std::string field = "model.held[" + Str(k) + "]";
    MEMEST_RETURN_IF_ERROR(CheckNameSize(h.tensor, field + ".tensor"));
    const auto it = ids.find(h.tensor);
    if (it == ids.end()) {
      return InvalidArgument(field + ".tensor: " + Quote(h.tensor) + " is not a tensor of the graph");
    }
    if (h.until_op < 0 || h.until_op >= n) {
      return InvalidArgument(field + ".until_op: " + Str(h.until_op) +
                             " is not an op of the graph's " + Str(n) + " ops");
    }
    const auto made = made_by.find(h.tensor);
    if (made != made_by.end() && made->second > h.until_op) {
      return InvalidArgument(field + ".until_op: " + Str(h.until_op) + " runs before op " +
                             Str(made->second) + ", which makes " + Quote(h.tensor));
    }
    graph->held.push_back({it->second, last_op[h.until_op]});
  }
  for (size_t k = 0; k < spec.outputs.size(); ++k) {
    const std::string field = "model.outputs[" + Str(k) + "]";
    MEMEST_RETURN_IF_ERROR(CheckNameSize(spec.outputs[k], field));
    const auto it = ids.find(spec.outputs[k]);
    if (it == ids.end()) {
      return InvalidArgument(field + ": " + Quote(spec.outputs[k]) + " is not a tensor of the graph");
    }
    graph->outputs.push_back(it->second);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<Graph> BuildOpGraph(const OpGraphSpec& spec, const BuildContext& context) {
  MEMEST_RETURN_IF_ERROR(ValidateBuildContext(context));
  if (spec.traced_batch < 0) {
    return InvalidArgument("model.traced_batch: must be non-negative, got " +
                           Str(spec.traced_batch));
  }
  const bool rescale = spec.traced_batch > 0 && spec.traced_batch != context.micro_batch;
  const bool training = context.mode == Mode::kTraining;

  // Declarations: names must be unique; op outputs may be declared for checking.
  std::unordered_map<std::string, size_t> declared;
  std::set<std::string> targets;
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const TensorSpec& t = spec.tensors[i];
    const std::string field = "model.tensors[" + Str(i) + "]";
    if (t.name.empty()) return InvalidArgument(field + ".name: must not be empty");
    MEMEST_RETURN_IF_ERROR(CheckNameSize(t.name, field + ".name"));
    if (!declared.emplace(t.name, i).second) {
      return InvalidArgument(field + ".name: duplicate tensor name " + Quote(t.name));
    }
    MEMEST_RETURN_IF_ERROR(ValidateShape(t.shape, t.dtype, field + ".shape", false));
    if (t.role == TensorRole::kTarget) targets.insert(t.name);
    const bool batched = t.role == TensorRole::kInput || t.role == TensorRole::kTarget;
    if (batched && (t.batch_dim < -1 || t.batch_dim >= static_cast<int>(t.shape.size()))) {
      return InvalidArgument(field + ".batch_dim: " + Str(t.batch_dim) +
                             " is out of range for shape " + ShapeToString(t.shape) +
                             " (-1: nothing scales with the batch)");
    }
    if (t.input_requires_grad && (t.role != TensorRole::kInput || !IsFloating(t.dtype))) {
      return InvalidArgument(field + ".requires_grad: applies to floating inputs only, not to " +
                             (t.role == TensorRole::kInput ? std::string(DTypeName(t.dtype)) + " inputs"
                                                           : std::string(TensorRoleName(t.role)) + "s") +
                             (t.role == TensorRole::kParameter ? " (a parameter without a gradient is frozen)" : ""));
    }
    if (!batched && t.batch_dim != 0 && t.batch_dim != -1) {
      return InvalidArgument(field + ".batch_dim: applies to inputs and targets only, not to " +
                             TensorRoleName(t.role) + "s; got " + Str(t.batch_dim));
    }
    if (batched && rescale && t.batch_dim >= 0 && t.shape[t.batch_dim] != spec.traced_batch) {
      return InvalidArgument(field + ".shape[" + Str(t.batch_dim) + "]: the batch dim is " +
                             Str(t.shape[t.batch_dim]) + ", but traced_batch is " +
                             Str(spec.traced_batch));
    }
  }

  MEMEST_RETURN_IF_ERROR(CheckUnscaledBatch(spec, context.micro_batch));

  // The first op of the loss: the first that reads a target or produces the loss tensor.
  int loss_begin = -1;
  if (training) {
    for (size_t i = 0; i < spec.ops.size() && loss_begin < 0; ++i) {
      for (const std::string& in : spec.ops[i].inputs) {
        if (targets.count(in)) loss_begin = static_cast<int>(i);
      }
      for (const std::string& out : spec.ops[i].outputs) {
        if (out == spec.loss) loss_begin = static_cast<int>(i);
      }
    }
  }

  GraphBuilder b;
  ConfigureBuilder(context, b);
  // Rescaled inputs take their batch dim from the config (GraphBuilder::NameSize).
  if (rescale) b.NameSize(context.micro_batch, "config.batch_size");

  if (context.autocast != DType::kFloat32) b.EnableAutocast(context.autocast);
  std::unordered_map<std::string, int> ids;
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const TensorSpec& t = spec.tensors[i];
    if (!IsLeafRole(t.role)) continue;
    b.SetErrorContext("model.tensors[" + Str(i) + "]");
    Shape shape = t.shape;
    if (rescale && (t.role == TensorRole::kInput || t.role == TensorRole::kTarget) &&
        t.batch_dim >= 0) {
      shape[t.batch_dim] = context.micro_batch;
    }
    int id = -1;
    switch (t.role) {
      case TensorRole::kInput:
        id = b.Input(t.name, shape, t.dtype, t.batch_dim, t.input_requires_grad);
        break;
      case TensorRole::kTarget:
        id = b.Target(t.name, shape, t.dtype, t.batch_dim);
        break;
      case TensorRole::kParameter:
        id = b.Parameter(t.name, shape, IsFloating(t.dtype) ? context.param_dtype : t.dtype,
                         t.requires_grad);
        break;
      case TensorRole::kBuffer:
        id = b.Buffer(t.name, shape, IsFloating(t.dtype) ? context.param_dtype : t.dtype);
        break;
      case TensorRole::kActivation:
        break;
    }
    if (id < 0) return b.status();
    ids[t.name] = id;
  }

  std::set<std::string> produced;
  std::unordered_map<std::string, int64_t> made_by;  // op output name -> the spec op
  // Graph ops [first_op[i], last_op[i]] are spec op i and the casts autocast put before it.
  std::vector<int> first_op(spec.ops.size()), last_op(spec.ops.size());
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const OpSpec& op = spec.ops[i];
    first_op[i] = b.num_ops();
    const std::string field = "model.ops[" + Str(i) + "]";
    MEMEST_RETURN_IF_ERROR(CheckNameSize(op.scope, field + ".scope"));
    MEMEST_RETURN_IF_ERROR(CheckAttrSizes(op.attrs, field));
    std::vector<int> inputs;
    for (size_t j = 0; j < op.inputs.size(); ++j) {
      const std::string input = field + ".inputs[" + Str(j) + "]";
      MEMEST_RETURN_IF_ERROR(CheckNameSize(op.inputs[j], input));
      auto it = ids.find(op.inputs[j]);
      if (it == ids.end()) {
        const bool later = declared.count(op.inputs[j]) > 0;
        return InvalidArgument(input + ": " + Quote(op.inputs[j]) + " " +
                               (later ? "is not produced by any earlier op"
                                      : "is neither declared nor produced by an earlier op"));
      }
      inputs.push_back(it->second);
    }
    for (size_t j = 0; j < op.outputs.size(); ++j) {
      const std::string& name = op.outputs[j];
      if (name.empty()) continue;
      const std::string output = field + ".outputs[" + Str(j) + "]";
      MEMEST_RETURN_IF_ERROR(CheckNameSize(name, output));
      auto decl = declared.find(name);
      if (ids.count(name) ||
          (decl != declared.end() && IsLeafRole(spec.tensors[decl->second].role))) {
        return InvalidArgument(output + ": duplicate tensor name " + Quote(name));
      }
      for (size_t k = 0; k < j; ++k) {
        if (op.outputs[k] == name) {
          return InvalidArgument(output + ": duplicate tensor name " + Quote(name));
        }
      }
    }
    MEMEST_RETURN_IF_ERROR(CheckFiniteAttrs(op.attrs, field));
    if (static_cast<int>(i) == loss_begin) b.BeginLoss();
    b.SetErrorContext(field);
    MEMEST_ASSIGN_OR_RETURN(
        Attrs attrs,
        BatchScaledAttrs(op, field, spec.traced_batch, context.micro_batch, rescale));
    std::vector<int> outs;
    {
      ScopeGuard scope(b, op.scope);
      outs = b.Add(op.kind, std::move(inputs), std::move(attrs), op.outputs);
    }
    if (!b.ok()) return b.status();
    last_op[i] = b.num_ops() - 1;
    if (op.outputs.size() > outs.size()) {
      return InvalidArgument(field + ".outputs: " + op.kind + " has " + Str(outs.size()) +
                             " outputs, " + Str(op.outputs.size()) + " are named");
    }
    for (size_t j = 0; j < op.outputs.size(); ++j) {
      const std::string& name = op.outputs[j];
      if (name.empty()) continue;
      ids[name] = outs[j];
      made_by[name] = static_cast<int64_t>(i);
      auto decl = declared.find(name);
      if (decl == declared.end()) continue;
      const TensorSpec& t = spec.tensors[decl->second];
      const Tensor& got = b.tensor(outs[j]);
      const std::string tfield = "model.tensors[" + Str(decl->second) + "]";
      bool same = t.shape.size() == got.shape.size();
      for (size_t d = 0; same && d < t.shape.size(); ++d) {
        same = DimMatches(t.shape[d], got.shape[d], spec.traced_batch, context.micro_batch);
      }
      if (!same) {
        return InvalidArgument(tfield + ".shape: declared " + ShapeToString(t.shape) + ", but " +
                               field + " (" + op.kind + ") produces " + ShapeToString(got.shape));
      }
      if (IsFloating(t.dtype) != IsFloating(got.dtype)) {
        return InvalidArgument(tfield + ".dtype: declared " + std::string(DTypeName(t.dtype)) +
                               ", but " + field + " (" + op.kind + ") produces " +
                               std::string(DTypeName(got.dtype)));
      }
      produced.insert(name);
    }
  }
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const TensorSpec& t = spec.tensors[i];
    if (!IsLeafRole(t.role) && !produced.count(t.name)) {
      return InvalidArgument("model.tensors[" + Str(i) + "]: " + Quote(t.name) +
                             " is declared as an op output, but no op produces it");
    }
  }

  b.SetErrorContext("model");
  if (training) {
    if (spec.loss.empty()) {
      return InvalidArgument("model.loss: training needs the name of the scalar loss tensor");
    }
    MEMEST_RETURN_IF_ERROR(CheckNameSize(spec.loss, "model.loss"));
    auto it = ids.find(spec.loss);
    if (it == ids.end()) {
      return InvalidArgument("model.loss: " + Quote(spec.loss) + " is not a tensor of the graph");
    }
    const Tensor& loss = b.tensor(it->second);
    if (!loss.shape.empty()) {
      return InvalidArgument("model.loss: " + Quote(spec.loss) + " must be a scalar, got shape " +
                             ShapeToString(loss.shape));
    }
    if (!IsFloating(loss.dtype)) {
      return InvalidArgument("model.loss: " + Quote(spec.loss) + " must be floating, got " +
                             std::string(DTypeName(loss.dtype)));
    }
    b.SetLoss(it->second);
  }
  MEMEST_ASSIGN_OR_RETURN(Graph graph, b.Finish(context.max_ops));
  for (size_t i = 0; i < spec.blocks.size(); ++i) {
    const std::string field = "model.blocks[" + Str(i) + "]";
    MEMEST_RETURN_IF_ERROR(CheckNameSize(spec.blocks[i], field));
    bool found = false;
    for (const Op& op : graph.ops) found = found || ScopeWithin(op.scope, spec.blocks[i]);
    if (!found || spec.blocks[i].empty()) {
      return InvalidArgument(field + ": no op runs in scope " + Quote(spec.blocks[i]));
    }
  }
  graph.blocks = spec.blocks;
  const int64_t n = static_cast<int64_t>(spec.ops.size());
  const int64_t forward_end = loss_begin >= 0 ? loss_begin : n;
  int64_t previous = -1;
  for (size_t k = 0; k < spec.checkpoints.size(); ++k) {
    const CheckpointSpec& c = spec.checkpoints[k];
    const std::string field = "model.checkpoints[" + Str(k) + "]";
    if (c.first_op < 0 || c.last_op < c.first_op || c.last_op >= n) {
      return InvalidArgument(field + ": ops " + Str(c.first_op) + " to " + Str(c.last_op) +
                             " are not a range of the graph's " + Str(n) + " ops");
    }
    if (c.first_op <= previous) {
      return InvalidArgument(field + ": overlaps or precedes the region before it (regions are "
                                     "in order and do not overlap)");
    }
    if (training && c.last_op >= forward_end) {
      return InvalidArgument(field + ": reaches op " + Str(c.last_op) + ", but the loss starts at op " +
                             Str(forward_end) + " (checkpointed ops belong to the forward)");
    }
    previous = c.last_op;
    graph.checkpoints.emplace_back(first_op[c.first_op], last_op[c.last_op]);
    graph.checkpoint_non_reentrant.push_back(c.non_reentrant);
  }
  MEMEST_RETURN_IF_ERROR(AddPythonRefs(spec, ids, made_by, last_op, &graph));
  return graph;
}

}  // namespace memest
