// What a user describes: a preset with parameters, a sequential list of layers, a graph of
// ops, or a Hugging Face config. Each front end turns its description into a Graph
// (engine/ir/graph.h) for one micro-batch.
#ifndef MEMEST_ENGINE_MODELS_MODEL_H_
#define MEMEST_ENGINE_MODELS_MODEL_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "engine/ir/budget.h"
#include "engine/ir/config.h"
#include "engine/ir/graph.h"
#include "engine/ir/json.h"

namespace memest {

// A named preset (engine/models/presets.h) with overrides of its parameters ("seq", "layers", ...).
struct PresetSpec {
  std::string name;
  std::map<std::string, int64_t> params;
};

// One layer of a sequential model. Kinds and their attributes are listed in engine/models/layers.h
// (e.g. kind "linear" with attrs {out_features: 4096, bias: 1}).
struct LayerSpec {
  std::string kind;
  std::string name;  // scope name; defaults to "<index>"
  Attrs attrs;
};

// A sequential model: an input of `input_shape` per sample (the batch dim is prepended), the
// layers applied in order, then a loss on the last output.
struct LayerModelSpec {
  Shape input_shape;
  DType input_dtype = DType::kFloat32;
  std::vector<LayerSpec> layers;
  // "cross_entropy" (targets: int64 class per sample/position), "mse" (targets like the
  // output), or "sum" (output.sum(), no targets). Default "sum".
  std::string loss = "sum";
};

// A tensor declared by an op-graph model: leaves (inputs, targets, parameters, buffers) must be
// declared; op outputs may be declared too, and are then checked against inference.
struct TensorSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::kFloat32;
  TensorRole role = TensorRole::kInput;
  // For inputs and targets: the dim that scales with the batch, -1 when none. Other roles
  // must leave it 0 (or -1): nothing else scales with the batch.
  int batch_dim = 0;
  bool requires_grad = true;  // for parameters: false means frozen
  bool input_requires_grad = false;  // for inputs: x.requires_grad_(), its gradient in x.grad
};

struct OpSpec {
  std::string kind;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  Attrs attrs;
  std::string scope;
};

// A torch.utils.checkpoint call in the model's code: ops [first_op, last_op] of OpGraphSpec::ops.
struct CheckpointSpec {
  int64_t first_op = 0;
  int64_t last_op = 0;
  bool non_reentrant = false;
};

// A reference of the model's code that keeps `tensor` allocated past its last use in the graph,
// until op `until_op` (an index into OpGraphSpec::ops) has run.
struct HeldSpec {
  std::string tensor;
  int64_t until_op = 0;
};

// A graph of ops in execution order, as the tracer records it.
struct OpGraphSpec {
  std::vector<TensorSpec> tensors;
  std::vector<OpSpec> ops;
  std::string loss;                 // the scalar output backward starts from (training)
  std::vector<std::string> blocks;  // scopes of repeated blocks (checkpoint units)
  std::vector<CheckpointSpec> checkpoints;  // the model's own torch.utils.checkpoint calls
  std::vector<HeldSpec> held;        // references of the model's code (Graph::held)
  std::vector<std::string> outputs;  // what the forward returns (Graph::outputs)
  // The batch size the shapes were recorded at. When it differs from the run's micro-batch,
  // every input's batch_dim is rescaled and shapes are re-inferred.
  int64_t traced_batch = 0;
};

// A Hugging Face config.json (engine/models/hf_config.h): the model its model_type and fields
// describe, for sequences of `seq` tokens.
struct HfConfigSpec {
  JsonValue config;
  int64_t seq = 0;
};

struct ModelSpec {
  std::variant<PresetSpec, LayerModelSpec, OpGraphSpec, HfConfigSpec> source;
};

// What every front end needs to know to build the graph of one micro-batch.
struct BuildContext {
  int64_t micro_batch = 1;
  Mode mode = Mode::kTraining;
  DType param_dtype = DType::kFloat32;  // from the precision policy
  int64_t generate_tokens = 0;          // inference: KV cache room beyond the prompt
  int64_t max_ops = 1'000'000;          // refuse larger graphs
  // Build under torch.autocast to this dtype (float32: no autocast); the graph then holds the
  // casts autocast makes, where it makes them.
  DType autocast = DType::kFloat32;
  // The request's budget (engine/ir/budget.h): its deadline and cancellation are looked at while
  // the graph is built (every 256 ops), so a large build stops too. Null: none.
  Budget* budget = nullptr;
  // How attention layers run (config.attention, resolved: ResolveAttention in engine/ir/config.h)
  // and the generation of the device that picks the SDPA kernel (10 * major + minor).
  AttentionImpl attention = AttentionImpl::kEager;
  int compute_capability = 90;
  // How mixture-of-experts layers' routers spread the tokens (config.expert_load): the tokens
  // each expert computes on.
  ExpertLoad expert_load = ExpertLoad::kDefault;
  // vLLM's profile run (config.serving, engine/report/serving.h): inference without a KV cache
  // in the graph (the server's paged pool is allocated after it), vLLM's sampler on each
  // sequence's last logits, and the rotary cos_sin_cache vLLM keeps for `rotary_positions`
  // positions.
  bool serving = false;
  int64_t rotary_positions = 0;
  int64_t rotary_local_positions = 0;  // the sliding-window layers' table (Gemma 3's)
  int multiprocessors = 132;  // the device's, which size vLLM's top-k/top-p scratch
  // vLLM's chunked-prefill workspace rows for latent attention (MLACommonMetadataBuilder's
  // determine_chunked_prefill_workspace_size), which its profile run allocates per layer.
  int64_t mla_workspace_rows = 0;
  // Megatron-LM trains the model (config.parallelism's megatron-ddp / megatron-distopt):
  // mixture-of-experts layers are built as its MoELayer (engine/models/megatron_moe.cc).
  bool megatron = false;
  // The model returns its keys and values with its outputs (Hugging Face's use_cache, which its
  // decoders' configs set): the attention layers mark what the cache holds (Graph::cache), in
  // training and in inference, where it is the prompt's cache that generation goes on from
  // (not in vLLM's profile run, nor under Megatron-LM, whose models return none).
  bool use_cache = false;
  // What runs the step (config.runtime): the graph's shape rules that differ see it.
  Runtime runtime = Runtime::kCuda;
  // Repeated blocks alike are copied rather than built again (GraphBuilder::StampBlock). The
  // graph is the same either way (tests build it both ways), so GraphKeyOf leaves this out.
  bool stamp_blocks = true;
};

// Every field of `context` the graph BuildGraph makes depends on: two contexts with equal keys
// build the same graph of a model (max_ops and the budget limit the build, not what it makes).
// A field added to BuildContext that the front ends read belongs here (SweepEstimator,
// engine/sweep.h, reuses graphs by this key).
inline auto GraphKeyOf(const BuildContext& c) {
  return std::make_tuple(c.micro_batch, c.mode, c.param_dtype, c.generate_tokens, c.autocast,
                         c.attention, c.compute_capability, c.expert_load, c.serving,
                         c.rotary_positions, c.rotary_local_positions, c.multiprocessors,
                         c.mla_workspace_rows, c.megatron, c.use_cache, c.runtime);
}

// Sets up a front end's builder as `context` asks: its op limit, runtime, budget and stamping.
void ConfigureBuilder(const BuildContext& context, GraphBuilder& b);

// Whether the model's forward returns its keys and values (Graph::cache): context.use_cache,
// but not in vLLM's profile run nor under Megatron-LM.
bool ReturnsCache(const BuildContext& context);

// The LayerContext (engine/models/layers.h) a front end builds its layers with.
struct LayerContext;
LayerContext LayerContextOf(const BuildContext& context);

// Checks the context every front end relies on (a positive micro-batch, non-negative
// generate_tokens); errors name the config field they come from.
Status ValidateBuildContext(const BuildContext& context);

// Builds the graph of one micro-batch. Errors name fields under "model." (for example
// "model.layers[3].attrs.out_features: must be positive, got -4"). A name longer than
// kMaxNameBytes (engine/ir/text.h) is refused. A tensor too large to count in bytes is reported
// against the field its size came from: "config.batch_size" (also when the batch only
// overflows once folded into an activation: the model is then built again for one sample to
// tell), "model.input_shape[i]", "model.layers[i].attrs.<name>", "model.preset.params.<name>".
// In inference, a positive context.generate_tokens is refused ("config.generate_tokens") for a
// model that keeps no KV cache: only the decoder presets do, and the tokens would change
// nothing.
StatusOr<Graph> BuildGraph(const ModelSpec& model, const BuildContext& context);

StatusOr<Graph> BuildLayerModel(const LayerModelSpec& spec, const BuildContext& context);
StatusOr<Graph> BuildOpGraph(const OpGraphSpec& spec, const BuildContext& context);

}  // namespace memest

#endif  // MEMEST_ENGINE_MODELS_MODEL_H_
