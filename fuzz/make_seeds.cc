// memest-fuzz-seeds: writes the fuzzers' seed corpus, a few dozen small serialized
// EstimateRequests, one file each (<model>.<config>.pb).
//
//   build/bin/memest-fuzz-seeds [--examples DIR] OUT_DIR
//
// The models: the example model files (examples/*.json, *.yaml), every preset with few blocks,
// Hugging Face configs of tests/data/hf_configs cut to two layers,
// every preset's graph again as an op graph (what the tracer sends), and layer models that use
// each layer kind. The configs: the defaults, then one variant each of mode, precision,
// optimizer, checkpointing, step, device, runtime, accumulation and advice, on two models; and a
// few refusals. Output is deterministic (the files are the same bytes on every run); the *.pb
// files already in OUT_DIR are removed first. Each seed is run through the service's handler
// and its status printed, so a seed that stops working shows.
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "client/cli/flags.h"
#include "engine/models/model.h"
#include "engine/models/presets.h"
#include "fuzz/estimate_target.h"
#include "server/estimator_service.h"

namespace memest::fuzz {
namespace {

namespace fs = std::filesystem;

struct Seed {
  std::string name;
  v1::EstimateRequest request;
};

// Builds an attribute value.
v1::AttrValue I(int64_t v) {
  v1::AttrValue a;
  a.set_i(v);
  return a;
}
v1::AttrValue F(double v) {
  v1::AttrValue a;
  a.set_f(v);
  return a;
}
v1::AttrValue S(const std::string& v) {
  v1::AttrValue a;
  a.set_s(v);
  return a;
}

void AddLayer(v1::LayerModel* model, const std::string& kind,
              std::vector<std::pair<std::string, v1::AttrValue>> attrs = {}) {
  v1::Layer* layer = model->add_layers();
  layer->set_kind(kind);
  for (auto& [name, value] : attrs) (*layer->mutable_attrs())[name] = value;
}

// Layer models that, together with examples/, use every kind of engine/models/layers.h.
std::vector<std::pair<std::string, v1::Model>> LayerModels() {
  std::vector<std::pair<std::string, v1::Model>> models;
  {
    v1::Model m;
    v1::LayerModel* l = m.mutable_layers();
    for (int64_t d : {3, 32, 32}) l->add_input_shape(d);
    AddLayer(l, "conv2d", {{"out_channels", I(8)}, {"kernel_size", I(3)}, {"padding", I(1)}});
    AddLayer(l, "batch_norm");
    AddLayer(l, "relu", {{"inplace", I(1)}});
    AddLayer(l, "max_pool2d", {{"kernel_size", I(2)}});
    AddLayer(l, "conv2d",
             {{"out_channels", I(16)},
              {"kernel_size", I(3)},
              {"stride", I(2)},
              {"groups", I(2)},
              {"bias", I(0)}});
    AddLayer(l, "group_norm", {{"num_groups", I(4)}});
    AddLayer(l, "silu");
    AddLayer(l, "avg_pool2d", {{"kernel_size", I(2)}});
    AddLayer(l, "adaptive_avg_pool2d");
    AddLayer(l, "flatten");
    AddLayer(l, "linear", {{"out_features", I(10)}});
    l->set_loss("cross_entropy");
    models.emplace_back("layers-cnn", m);
  }
  {
    v1::Model m;
    v1::LayerModel* l = m.mutable_layers();
    for (int64_t d : {4, 64}) l->add_input_shape(d);
    AddLayer(l, "conv1d",
             {{"out_channels", I(8)}, {"kernel_size", I(5)}, {"dilation", I(2)}, {"groups", I(2)}});
    AddLayer(l, "gelu", {{"approximate", S("tanh")}});
    AddLayer(l, "flatten");
    AddLayer(l, "linear", {{"out_features", I(1)}});
    AddLayer(l, "tanh");
    l->set_loss("mse");
    models.emplace_back("layers-conv1d", m);
  }
  {
    v1::Model m;
    v1::LayerModel* l = m.mutable_layers();
    l->add_input_shape(16);
    l->set_input_dtype("int64");
    AddLayer(l, "embedding", {{"num_embeddings", I(100)}, {"embedding_dim", I(32)}});
    AddLayer(l, "transformer_block", {{"heads", I(4)}, {"dropout", F(0.1)}});
    AddLayer(l, "transformer_block", {{"heads", I(4)}, {"style", S("llama")}, {"kv_heads", I(2)}});
    AddLayer(l, "rms_norm", {{"upcast", I(1)}});
    AddLayer(l, "linear", {{"out_features", I(100)}, {"bias", I(0)}});
    l->set_loss("cross_entropy");
    models.emplace_back("layers-transformer", m);
  }
  {
    v1::Model m;
    v1::LayerModel* l = m.mutable_layers();
    for (int64_t d : {8, 32}) l->add_input_shape(d);
    l->set_input_dtype("bf16");
    AddLayer(l, "attention",
             {{"heads", I(4)}, {"causal", I(1)}, {"dropout", F(0.1)}, {"scale_qk", I(1)}});
    AddLayer(l, "layer_norm");
    AddLayer(l, "mlp", {{"hidden", I(64)}, {"activation", S("swish")}});
    AddLayer(l, "swish");
    AddLayer(l, "sigmoid");
    AddLayer(l, "softmax", {{"dim", I(-1)}});
    AddLayer(l, "dropout", {{"p", F(0.2)}});
    models.emplace_back("layers-attention", m);
  }
  return models;
}

// A preset with at most two blocks (layers, levels), so each run is quick.
v1::Model SmallPreset(const PresetInfo& preset) {
  v1::Model m;
  m.mutable_preset()->set_name(preset.name);
  for (const PresetParam& param : preset.params) {
    if (param.name == "layers" || param.name == "levels") {
      (*m.mutable_preset()->mutable_params())[param.name] = 2;
    }
  }
  return m;
}

// The graph the engine builds for `preset`, written as the op graph a tracer would send.
StatusOr<v1::Model> PresetAsOpGraph(const v1::Model& preset, int64_t micro_batch) {
  PresetSpec spec{preset.preset().name(), {}};
  for (const auto& [name, value] : preset.preset().params()) spec.params[name] = value;
  BuildContext context;
  context.micro_batch = micro_batch;
  MEMEST_ASSIGN_OR_RETURN(Graph graph, BuildGraph(ModelSpec{spec}, context));
  auto name_of = [&graph](int id) {
    const Tensor& t = graph.tensors[id];
    return t.producer < 0 && !t.name.empty() ? t.name : "t" + std::to_string(id);
  };
  v1::Model m;
  v1::OpGraph* g = m.mutable_ops();
  for (size_t id = 0; id < graph.tensors.size(); ++id) {
    const Tensor& t = graph.tensors[id];
    if (t.producer >= 0) continue;
    v1::TensorDecl* decl = g->add_tensors();
    decl->set_name(name_of(static_cast<int>(id)));
    for (int64_t d : t.shape) decl->add_shape(d);
    decl->set_dtype(std::string(DTypeName(t.dtype)));
    switch (t.role) {
      case TensorRole::kInput:
        decl->set_role(v1::TENSOR_ROLE_INPUT);
        break;
      case TensorRole::kTarget:
        decl->set_role(v1::TENSOR_ROLE_TARGET);
        break;
      case TensorRole::kParameter:
        decl->set_role(v1::TENSOR_ROLE_PARAMETER);
        break;
      case TensorRole::kBuffer:
        decl->set_role(v1::TENSOR_ROLE_BUFFER);
        break;
      case TensorRole::kActivation:
        decl->set_role(v1::TENSOR_ROLE_ACTIVATION);
        break;
    }
    if (t.role == TensorRole::kInput || t.role == TensorRole::kTarget) {
      decl->set_batch_dim(t.batch_dim);
    }
    decl->set_frozen(t.role == TensorRole::kParameter && !t.requires_grad);
  }
  for (const Op& op : graph.ops) {
    v1::OpDecl* decl = g->add_ops();
    decl->set_kind(op.kind);
    decl->set_scope(op.scope);
    for (int in : op.inputs) decl->add_inputs(name_of(in));
    for (int out : op.outputs) decl->add_outputs(name_of(out));
    for (const auto& [name, value] : op.attrs) {
      v1::AttrValue& a = (*decl->mutable_attrs())[name];
      if (const auto* i = std::get_if<int64_t>(&value)) a.set_i(*i);
      if (const auto* f = std::get_if<double>(&value)) a.set_f(*f);
      if (const auto* s = std::get_if<std::string>(&value)) a.set_s(*s);
      if (const auto* ints = std::get_if<std::vector<int64_t>>(&value)) {
        for (int64_t v : *ints) a.mutable_ints()->add_values(v);
      }
    }
  }
  if (graph.loss >= 0) g->set_loss(name_of(graph.loss));
  for (const std::string& block : graph.blocks) g->add_blocks(block);
  return m;
}

// One variant of the run: a name and what it changes in a training request of batch 8.
using Variant = std::pair<std::string, std::function<void(v1::EstimateRequest*)>>;

std::vector<Variant> ConfigVariants() {
  auto config = [](v1::EstimateRequest* r) { return r->mutable_config(); };
  return {
      {"inference", [=](auto* r) { config(r)->set_mode(v1::MODE_INFERENCE); }},
      {"generate",
       [=](auto* r) {
         config(r)->set_mode(v1::MODE_INFERENCE);
         config(r)->set_generate_tokens(16);
       }},
      {"fp16-amp", [=](auto* r) { config(r)->set_precision(v1::PRECISION_FP16_AMP); }},
      {"bf16-amp", [=](auto* r) { config(r)->set_precision(v1::PRECISION_BF16_AMP); }},
      {"bf16-pure", [=](auto* r) { config(r)->set_precision(v1::PRECISION_BF16_PURE); }},
      {"fp16-pure", [=](auto* r) { config(r)->set_precision(v1::PRECISION_FP16_PURE); }},
      {"sgd-momentum-for-loop",
       [=](auto* r) {
         config(r)->mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_SGD_MOMENTUM);
         config(r)->mutable_optimizer()->set_impl(v1::OPTIMIZER_IMPL_FOR_LOOP);
       }},
      {"adam-decay-fused",
       [=](auto* r) {
         config(r)->mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_ADAM);
         config(r)->mutable_optimizer()->set_impl(v1::OPTIMIZER_IMPL_FUSED);
         config(r)->mutable_optimizer()->set_weight_decay(0.01);
       }},
      {"adafactor",
       [=](auto* r) { config(r)->mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_ADAFACTOR); }},
      {"lion", [=](auto* r) { config(r)->mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_LION); }},
      {"every-block",
       [=](auto* r) {
         config(r)->mutable_checkpoint()->set_policy(v1::CHECKPOINT_POLICY_EVERY_BLOCK);
         config(r)->mutable_checkpoint()->set_non_reentrant(true);
       }},
      {"every-2",
       [=](auto* r) {
         config(r)->mutable_checkpoint()->set_policy(v1::CHECKPOINT_POLICY_EVERY_K_BLOCKS);
         config(r)->mutable_checkpoint()->set_every_k(2);
       }},
      {"sqrt",
       [=](auto* r) {
         config(r)->mutable_checkpoint()->set_policy(v1::CHECKPOINT_POLICY_SQRT_BLOCKS);
       }},
      {"attention-core",
       [=](auto* r) {
         config(r)->mutable_checkpoint()->set_policy(v1::CHECKPOINT_POLICY_ATTENTION_CORE);
       }},
      {"first-step-keep-grads",
       [=](auto* r) {
         config(r)->set_step(v1::STEP_KIND_FIRST_STEP);
         config(r)->set_zero_grad_keep_grads(true);
       }},
      {"accum-4", [=](auto* r) { config(r)->set_grad_accum_steps(4); }},
      {"a100-expandable",
       [=](auto* r) {
         config(r)->set_device_name("a100-80gb");
         config(r)->set_expandable_segments(true);
       }},
      {"zero3-offload",
       [=](auto* r) {
         v1::Parallelism* p = config(r)->mutable_parallelism();
         p->set_data(4);
         p->set_data_parallel(v1::DATA_PARALLEL_DEEPSPEED_ZERO3);
         p->set_offload_optimizer(true);
         p->set_offload_param(true);
       }},
      {"fsdp2-cpu-offload",
       [=](auto* r) {
         v1::Parallelism* p = config(r)->mutable_parallelism();
         p->set_data(4);
         p->set_data_parallel(v1::DATA_PARALLEL_FSDP2);
         p->set_fsdp_cpu_offload(true);
       }},
      {"fsdp1-cpu-offload-hybrid",
       [=](auto* r) {
         v1::Parallelism* p = config(r)->mutable_parallelism();
         p->set_data(8);
         p->set_data_shard(4);
         p->set_data_parallel(v1::DATA_PARALLEL_FSDP1);
         p->set_fsdp_cpu_offload(true);
       }},
      {"capacity-24gib", [=](auto* r) { config(r)->set_device_capacity_bytes(24ull << 30); }},
      {"cpu-avx2",
       [=](auto* r) {
         config(r)->set_runtime(v1::RUNTIME_CPU_TORCH_1_13);
         config(r)->set_cpu_isa(v1::CPU_ISA_AVX2);
       }},
  };
}

std::vector<Seed> MakeSeeds(const fs::path& examples) {
  std::vector<Seed> seeds;
  auto add = [&seeds](std::string name, const v1::Model& model, int64_t batch = 8) {
    Seed seed{std::move(name), {}};
    *seed.request.mutable_model() = model;
    seed.request.mutable_config()->set_batch_size(batch);
    seeds.push_back(std::move(seed));
    return &seeds.back().request;
  };
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(examples)) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    StatusOr<v1::Model> model = cli::ReadModelFile(file.string());
    if (!model.ok()) {
      std::cerr << "skipped " << file << ": " << model.status().message() << "\n";
      continue;
    }
    add(file.stem().string() + "-" + file.extension().string().substr(1), *model);
  }
  for (const PresetInfo& preset : ListPresets()) {
    const v1::Model small = SmallPreset(preset);
    add("preset-" + preset.name, small);
    StatusOr<v1::Model> ops = PresetAsOpGraph(small, 2);
    if (ops.ok()) {
      add("ops-" + preset.name, *ops, 2);
    } else {
      std::cerr << "no op graph for " << preset.name << ": " << ops.status().message() << "\n";
    }
  }
  for (const auto& [name, model] : LayerModels()) add(name, model);

  // Hugging Face configs (tests/data/hf_configs), cut to two layers and 32 tokens.
  const fs::path configs = examples / ".." / "tests" / "data" / "hf_configs";
  for (const char* name : {"gpt2", "llama-3.2-1b", "mistral-7b-v0.1", "qwen3-0.6b", "gemma-2b",
                           "gemma-2-2b", "gemma-3-1b-it", "mixtral-8x7b", "qwen1.5-moe-a2.7b",
                           "falcon-7b", "falcon-40b", "opt-350m"}) {
    StatusOr<google::protobuf::Struct> config =
        cli::ReadHfConfigFile((configs / (std::string(name) + ".json")).string());
    if (!config.ok()) {
      std::cerr << "skipped " << name << ": " << config.status().message() << "\n";
      continue;
    }
    v1::Model model;
    *model.mutable_hf_config()->mutable_config() = *config;
    model.mutable_hf_config()->set_seq(32);
    auto& fields = *model.mutable_hf_config()->mutable_config()->mutable_fields();
    fields[fields.count("n_layer") ? "n_layer" : "num_hidden_layers"].set_number_value(2);
    v1::EstimateRequest* seed = add(std::string("hf-") + name, model, 2);
    // A mixture-of-experts model's routing load (config.expert_load), and the model trained by
    // Megatron-LM with its experts split over two of four data ranks (its MoELayer).
    if (fields.count("num_local_experts") || fields.count("num_experts")) {
      seed->mutable_config()->set_expert_load(v1::EXPERT_LOAD_BALANCED);
      const v1::Model moe = seed->model();  // add() may move the seeds
      v1::RunConfig* ep = add(std::string("hf-") + name + ".expert-parallel", moe, 2)
                              ->mutable_config();
      ep->set_precision(v1::PRECISION_BF16_PURE);
      ep->mutable_parallelism()->set_data(4);
      ep->mutable_parallelism()->set_data_parallel(v1::DATA_PARALLEL_MEGATRON_DISTOPT);
      ep->mutable_parallelism()->set_expert(2);
    }
  }

  // The variants on a decoder preset and on a convolutional layer model.
  v1::Model gpt2 = SmallPreset(ListPresets().front());
  (*gpt2.mutable_preset()->mutable_params())["seq"] = 128;
  const v1::Model cnn = LayerModels().front().second;
  for (const auto& [name, change] : ConfigVariants()) {
    change(add("gpt2." + name, gpt2));
    change(add("cnn." + name, cnn));
  }
  v1::EstimateRequest* scopes = add("gpt2.scopes-skip-advice", gpt2);
  scopes->mutable_config()->mutable_checkpoint()->set_policy(v1::CHECKPOINT_POLICY_SCOPES);
  scopes->mutable_config()->mutable_checkpoint()->add_scopes("transformer.h.1");
  scopes->set_skip_advice(true);
  // LoRA (config.lora): adapters with dropout and a saved head on GPT-2's Conv1D, all-linear in
  // bf16 on a Llama-family config.
  v1::Lora* lora = add("gpt2.lora", gpt2)->mutable_config()->mutable_lora();
  lora->set_rank(8);
  lora->set_dropout(0.1);
  lora->add_target_modules("c_attn");
  lora->add_modules_to_save("lm_head");
  const auto llama = std::find_if(seeds.begin(), seeds.end(),
                                  [](const Seed& s) { return s.name == "hf-llama-3.2-1b"; });
  if (llama != seeds.end()) {
    const v1::Model model = llama->request.model();  // add() may move the seeds
    v1::EstimateRequest* all = add("hf-llama-3.2-1b.lora-all-linear", model, 2);
    all->mutable_config()->set_precision(v1::PRECISION_BF16_PURE);
    all->mutable_config()->mutable_lora()->set_rank(4);
    all->mutable_config()->mutable_lora()->add_target_modules("all-linear");
    v1::EstimateRequest* qlora = add("hf-llama-3.2-1b.qlora-nf4", model, 2);
    qlora->mutable_config()->set_precision(v1::PRECISION_BF16_PURE);
    qlora->mutable_config()->mutable_lora()->set_rank(8);
    qlora->mutable_config()->mutable_lora()->add_target_modules("q_proj");
    qlora->mutable_config()->mutable_quantization()->set_format(v1::WEIGHT_FORMAT_BNB_NF4);
    qlora->mutable_config()->mutable_quantization()->set_double_quant(true);
    qlora->mutable_config()->mutable_quantization()->set_compute_dtype("bfloat16");
    // Served by vLLM (config.serving): two H100s, an fp8 KV cache, both questions asked.
    v1::Model served = model;
    served.mutable_hf_config()->clear_seq();  // a server's lengths are config.serving's
    v1::EstimateRequest* serve = add("hf-llama-3.2-1b.serving-tp2-fp8", served, 0);
    serve->mutable_config()->set_device_name("h100-80gb");
    serve->mutable_config()->mutable_parallelism()->set_tensor(2);
    v1::Serving* serving = serve->mutable_config()->mutable_serving();
    serving->set_max_model_len(4096);
    serving->set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_E4M3);
    serving->set_request_tokens(1000);
    serving->set_concurrency(16);
    // A GPTQ W4A16 checkpoint served on one H100 (Machete), its ignore list a pattern.
    v1::EstimateRequest* w4 = add("hf-llama-3.2-1b.serving-w4a16", served, 0);
    w4->mutable_config()->set_device_name("h100-80gb");
    w4->mutable_config()->mutable_serving()->set_max_model_len(4096);
    v1::Quantization* q = w4->mutable_config()->mutable_quantization();
    q->set_format(v1::WEIGHT_FORMAT_W4A16);
    q->set_group_size(64);
    q->set_act_order(true);
    q->set_gptq_layout(true);
    q->add_skip_modules("re:.*mlp\\.down_proj$");
    // vLLM's fp8 with block scales on an A100 (Marlin, weight-only).
    v1::EstimateRequest* fp8 = add("hf-llama-3.2-1b.serving-fp8-a100", served, 0);
    fp8->mutable_config()->set_device_name("a100-80gb");
    fp8->mutable_config()->mutable_serving()->set_max_model_len(4096);
    v1::Quantization* block = fp8->mutable_config()->mutable_quantization();
    block->set_format(v1::WEIGHT_FORMAT_W8A8_FP8);
    block->set_weight_scales(v1::SCALE_GRANULARITY_BLOCK);
  }
  // A preset served on an L4 with vLLM's defaults (256 requests of 8 tokens in the profile).
  v1::EstimateRequest* served_gpt2 = add("gpt2.serving-l4", gpt2, 0);
  served_gpt2->mutable_config()->set_device_name("l4");
  served_gpt2->mutable_config()->mutable_serving();

  // Refusals: the fuzzer finds many more, these show it the shape of a few.
  add("refused.batch-0", gpt2, 0);
  v1::Model unknown;
  unknown.mutable_preset()->set_name("gpt5");
  add("refused.unknown-preset", unknown);
  add("refused.no-model", v1::Model());
  return seeds;
}

std::string Serialize(const v1::EstimateRequest& request) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    request.SerializeToCodedStream(&out);
  }
  return bytes;
}

int Main(int argc, char** argv) {
  fs::path examples = MEMEST_EXAMPLES_DIR;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 3 && args[0] == "--examples") {
    examples = args[1];
    args.erase(args.begin(), args.begin() + 2);
  }
  if (args.size() != 1) {
    std::cerr << "usage: memest-fuzz-seeds [--examples DIR] OUT_DIR\n";
    return 2;
  }
  const fs::path out = args[0];
  fs::create_directories(out);
  for (const auto& entry : fs::directory_iterator(out)) {
    if (entry.path().extension() == ".pb") fs::remove(entry.path());
  }
  std::set<std::string> written;
  int failures = 0;
  for (const Seed& seed : MakeSeeds(examples)) {
    const std::string bytes = Serialize(seed.request);
    if (!written.insert(bytes).second) continue;  // the same request under another name
    std::ofstream(out / (seed.name + ".pb"), std::ios::binary) << bytes;
    v1::EstimateResponse response;
    const auto start = std::chrono::steady_clock::now();
    const Status status = HandleEstimate(seed.request, ServiceOptions{}, &response);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const std::string broken = CheckEstimate(seed.request, status, response);
    if (!broken.empty()) ++failures;
    std::printf("%-40s %6zu bytes %8.1f ms  %s%s%s\n", (seed.name + ".pb").c_str(), bytes.size(),
                ms, StatusCodeName(status.code()), status.ok() ? "" : ": ",
                status.ok() ? "" : status.message().substr(0, 80).c_str());
    if (!broken.empty()) std::printf("  CHECK FAILED: %s\n", broken.c_str());
  }
  std::printf("%zu seeds in %s\n", written.size(), out.c_str());
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace memest::fuzz

int main(int argc, char** argv) { return memest::fuzz::Main(argc, argv); }
