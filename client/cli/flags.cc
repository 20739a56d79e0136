#include "client/cli/flags.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "client/cli/capacity.h"
#include "client/cli/words.h"
#include "client/cli/yaml_json.h"
#include "engine/ir/text.h"

namespace memest::cli {
namespace {

// The largest files the flags read: a Hugging Face or adapter config (a few KiB in practice),
// and a model file (as large as the server's largest request).
constexpr size_t kMaxConfigBytes = 16 << 20;
constexpr size_t kMaxModelFileBytes = 64 << 20;

const Word<v1::Mode> kModes[] = {
    {"training", v1::MODE_TRAINING},
    {"inference", v1::MODE_INFERENCE},
};

const Word<v1::Runtime> kRuntimes[] = {
    {"cuda", v1::RUNTIME_CUDA},
    {"cpu-1.13", v1::RUNTIME_CPU_TORCH_1_13},
};

const Word<v1::CpuIsa> kCpuIsas[] = {
    {"avx512", v1::CPU_ISA_AVX512},
    {"avx2", v1::CPU_ISA_AVX2},
};

const Word<v1::Precision> kPrecisions[] = {
    {"fp32", v1::PRECISION_FP32},           {"fp16", v1::PRECISION_FP16_AMP},
    {"bf16", v1::PRECISION_BF16_AMP},       {"bf16-pure", v1::PRECISION_BF16_PURE},
    {"fp16-pure", v1::PRECISION_FP16_PURE},
};
const Word<v1::Fp8Recipe> kFp8Recipes[] = {
    {"delayed", v1::FP8_RECIPE_DELAYED},
    {"current", v1::FP8_RECIPE_CURRENT},
};

const Word<v1::OptimizerKind> kOptimizers[] = {
    {"sgd", v1::OPTIMIZER_KIND_SGD},
    {"momentum", v1::OPTIMIZER_KIND_SGD_MOMENTUM},
    {"adam", v1::OPTIMIZER_KIND_ADAM},
    {"adamw", v1::OPTIMIZER_KIND_ADAMW},
    {"adagrad", v1::OPTIMIZER_KIND_ADAGRAD},
    {"rmsprop", v1::OPTIMIZER_KIND_RMSPROP},
    {"lion", v1::OPTIMIZER_KIND_LION},
    {"adafactor", v1::OPTIMIZER_KIND_ADAFACTOR},
    {"hf-adamw", v1::OPTIMIZER_KIND_HF_ADAMW},
    {"hf-adafactor", v1::OPTIMIZER_KIND_HF_ADAFACTOR},
    {"adamw-bnb-8bit", v1::OPTIMIZER_KIND_BNB_ADAMW_8BIT},
    {"paged-adamw-8bit", v1::OPTIMIZER_KIND_BNB_PAGED_ADAMW_8BIT},
    {"paged-adamw-32bit", v1::OPTIMIZER_KIND_BNB_PAGED_ADAMW_32BIT},
};

// memest's names and Hugging Face's attn_implementation names.
const Word<v1::Attention> kAttentions[] = {
    {"eager", v1::ATTENTION_EAGER},
    {"sdpa", v1::ATTENTION_SDPA},
    {"flash", v1::ATTENTION_FLASH},
    {"flash_attention_2", v1::ATTENTION_FLASH},
    {"mem-efficient", v1::ATTENTION_MEM_EFFICIENT},
    {"cudnn", v1::ATTENTION_CUDNN},
};

const Word<v1::CudaModuleLoading> kModuleLoadings[] = {
    {"lazy", v1::CUDA_MODULE_LOADING_LAZY},
    {"eager", v1::CUDA_MODULE_LOADING_EAGER},
};

const Word<v1::ExpertLoad> kExpertLoads[] = {
    {"worst", v1::EXPERT_LOAD_WORST},
    {"balanced", v1::EXPERT_LOAD_BALANCED},
};

const Word<v1::OptimizerImpl> kOptimizerImpls[] = {
    {"for-loop", v1::OPTIMIZER_IMPL_FOR_LOOP},
    {"foreach", v1::OPTIMIZER_IMPL_FOREACH},
    {"fused", v1::OPTIMIZER_IMPL_FUSED},
};

const Word<v1::CheckpointPolicy> kCheckpoints[] = {
    {"none", v1::CHECKPOINT_POLICY_NONE},
    {"every-block", v1::CHECKPOINT_POLICY_EVERY_BLOCK},
    {"every-k", v1::CHECKPOINT_POLICY_EVERY_K_BLOCKS},
    {"sqrt", v1::CHECKPOINT_POLICY_SQRT_BLOCKS},
    {"attention", v1::CHECKPOINT_POLICY_ATTENTION_CORE},
    {"scopes", v1::CHECKPOINT_POLICY_SCOPES},
};

// "seq=2048" into the preset's parameter map.
Status AddPresetParam(const std::string& text, v1::Preset* preset) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgument("--param: expected NAME=INTEGER, got \"" + Escape(text) + "\"");
  }
  const std::string name = text.substr(0, eq);
  const std::string value = text.substr(eq + 1);
  size_t used = 0;
  int64_t number = 0;
  try {
    number = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (value.empty() || used != value.size()) {
    return InvalidArgument("--param " + Escape(name) + ": expected an integer, got \"" +
                           Escape(value) + "\"");
  }
  (*preset->mutable_params())[name] = number;
  return Status::Ok();
}

Status FillModel(const EstimateFlags& flags, v1::Model* model) {
  std::vector<std::string> given;
  if (!flags.preset.empty()) given.push_back("--preset");
  if (!flags.model_file.empty()) given.push_back("--model");
  if (!flags.hf_config.empty()) given.push_back("--hf-config");
  if (given.empty()) return InvalidArgument("--preset, --model or --hf-config: one is required");
  if (given.size() > 1) {
    return InvalidArgument(given[0] + " and " + given[1] + ": give one model, not both");
  }
  if (!flags.model_file.empty()) {
    if (!flags.params.empty() || flags.seq) {
      return InvalidArgument(
          "--param/--seq: only apply to --preset or --hf-config, not to --model");
    }
    MEMEST_ASSIGN_OR_RETURN(*model, ReadModelFile(flags.model_file));
    return Status::Ok();
  }
  if (!flags.hf_config.empty()) {
    if (!flags.params.empty()) {
      return InvalidArgument("--param: only applies to --preset; edit the config.json instead");
    }
    v1::HfConfig* hf = model->mutable_hf_config();
    MEMEST_ASSIGN_OR_RETURN(*hf->mutable_config(), ReadHfConfigFile(flags.hf_config));
    if (flags.seq) hf->set_seq(*flags.seq);
    return Status::Ok();
  }
  v1::Preset* preset = model->mutable_preset();
  preset->set_name(flags.preset);
  for (const std::string& param : flags.params) {
    MEMEST_RETURN_IF_ERROR(AddPresetParam(param, preset));
  }
  if (flags.seq) (*preset->mutable_params())["seq"] = *flags.seq;
  return Status::Ok();
}

Status FillConfig(const EstimateFlags& flags, v1::RunConfig* config) {
  // A server's batches are its scheduler's: with --serve the batch stays unset unless given.
  if (flags.batch || !flags.serving.serve) config->set_batch_size(flags.batch.value_or(1));
  if (flags.grad_accum) config->set_grad_accum_steps(*flags.grad_accum);
  if (!flags.mode.empty()) {
    MEMEST_ASSIGN_OR_RETURN(v1::Mode mode, ParseWord("--mode", flags.mode, kModes));
    config->set_mode(mode);
  }
  if (!flags.precision.empty()) {
    MEMEST_ASSIGN_OR_RETURN(v1::Precision precision,
                            ParseWord("--precision", flags.precision, kPrecisions));
    config->set_precision(precision);
  }
  if (!flags.fp8.empty()) {
    MEMEST_ASSIGN_OR_RETURN(v1::Fp8Recipe recipe, ParseWord("--fp8", flags.fp8, kFp8Recipes));
    config->mutable_fp8()->set_recipe(recipe);
    if (flags.fp8_amax_history)
      config->mutable_fp8()->set_amax_history_len(*flags.fp8_amax_history);
  } else if (flags.fp8_amax_history) {
    return InvalidArgument("--fp8-amax-history: needs --fp8 delayed");
  }
  if (!flags.optimizer.empty()) {
    MEMEST_ASSIGN_OR_RETURN(v1::OptimizerKind kind,
                            ParseWord("--optimizer", flags.optimizer, kOptimizers));
    config->mutable_optimizer()->set_kind(kind);
  }
  if (!flags.optimizer_impl.empty()) {
    MEMEST_ASSIGN_OR_RETURN(v1::OptimizerImpl impl,
                            ParseWord("--optimizer-impl", flags.optimizer_impl, kOptimizerImpls));
    config->mutable_optimizer()->set_impl(impl);
  }
  if (flags.weight_decay) config->mutable_optimizer()->set_weight_decay(*flags.weight_decay);
  config->set_zero_grad_keep_grads(flags.keep_grads);
  if (!flags.checkpoint.empty()) {
    MEMEST_ASSIGN_OR_RETURN(v1::CheckpointPolicy policy,
                            ParseWord("--checkpoint", flags.checkpoint, kCheckpoints));
    config->mutable_checkpoint()->set_policy(policy);
  }
  if (flags.checkpoint_k) config->mutable_checkpoint()->set_every_k(*flags.checkpoint_k);
  if (flags.non_reentrant) config->mutable_checkpoint()->set_non_reentrant(true);
  for (const std::string& scope : flags.checkpoint_scopes) {
    config->mutable_checkpoint()->add_scopes(scope);
  }
  if (flags.first_step) config->set_step(v1::STEP_KIND_FIRST_STEP);
  if (flags.device && !flags.capacity.empty()) {
    return InvalidArgument("--device and --capacity: give one, not both");
  }
  if (flags.device) config->set_device_name(*flags.device);
  if (!flags.capacity.empty()) {
    MEMEST_ASSIGN_OR_RETURN(int64_t bytes, ParseCapacity(flags.capacity));
    config->set_device_capacity_bytes(static_cast<uint64_t>(bytes));
  }
  if (flags.generate_tokens) config->set_generate_tokens(*flags.generate_tokens);
  config->set_expandable_segments(flags.expandable_segments);
  if (flags.hold_outputs && flags.no_hold_outputs) {
    return InvalidArgument("--hold-outputs and --no-hold-outputs: give one, not both");
  }
  if (flags.hold_outputs || flags.no_hold_outputs) config->set_hold_outputs(flags.hold_outputs);
  if (!flags.runtime.empty()) {
    MEMEST_ASSIGN_OR_RETURN(v1::Runtime runtime, ParseWord("--runtime", flags.runtime, kRuntimes));
    config->set_runtime(runtime);
  }
  if (!flags.cpu_isa.empty()) {
    MEMEST_ASSIGN_OR_RETURN(v1::CpuIsa isa, ParseWord("--cpu-isa", flags.cpu_isa, kCpuIsas));
    config->set_cpu_isa(isa);
  }
  for (const auto& [name, bytes] :
       {std::pair<const char*, std::optional<int64_t>>{"--cpu-l1-cache", flags.cpu_l1_cache},
        {"--cpu-l2-cache", flags.cpu_l2_cache}}) {
    if (bytes && *bytes <= 0) {
      return InvalidArgument(std::string(name) + ": a cache size in bytes, got " +
                             std::to_string(*bytes));
    }
  }
  if (flags.cpu_l1_cache)
    config->set_cpu_l1_cache_bytes(static_cast<uint64_t>(*flags.cpu_l1_cache));
  if (flags.cpu_l2_cache)
    config->set_cpu_l2_cache_bytes(static_cast<uint64_t>(*flags.cpu_l2_cache));
  if (!flags.attention.empty()) {
    MEMEST_ASSIGN_OR_RETURN(v1::Attention a,
                            ParseWord("--attention", flags.attention, kAttentions));
    config->set_attention(a);
  }
  if (!flags.cuda_module_loading.empty()) {
    MEMEST_ASSIGN_OR_RETURN(
        v1::CudaModuleLoading m,
        ParseWord("--cuda-module-loading", flags.cuda_module_loading, kModuleLoadings));
    config->set_cuda_module_loading(m);
  }
  if (!flags.cublas_workspace_config.empty()) {
    config->set_cublas_workspace_config(flags.cublas_workspace_config);
  }
  if (!flags.expert_load.empty()) {
    MEMEST_ASSIGN_OR_RETURN(v1::ExpertLoad l,
                            ParseWord("--expert-load", flags.expert_load, kExpertLoads));
    config->set_expert_load(l);
  }
  MEMEST_RETURN_IF_ERROR(ApplyServingFlags(flags.serving, config));
  MEMEST_RETURN_IF_ERROR(ApplyLoraFlags(flags.lora, config));
  return ApplyParallelismFlags(flags.parallel, config);
}

}  // namespace

std::vector<std::string> SplitWords(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

Status ParseWords(CLI::App* app, const std::vector<std::string>& words) {
  std::vector<std::string> reversed(words.rbegin(), words.rend());  // CLI11 parses from the back
  try {
    app->parse(reversed);
  } catch (const CLI::ParseError& error) {
    return InvalidArgument(error.what());
  }
  return Status::Ok();
}

void AddConnectionFlags(CLI::App* app, ConnectionFlags* flags) {
  app->add_option("--server", flags->server, "memest-server address HOST:PORT")
      ->capture_default_str();
  app->add_flag("--local", flags->local,
                "run the engine in this process instead of calling a server");
  app->add_flag("--json", flags->json, "print the response as the proto's JSON mapping");
  app->add_option("--deadline-ms", flags->deadline_ms, "deadline of the call in milliseconds")
      ->capture_default_str();
  app->add_option("--auth-token-file", flags->auth_token_file,
                  "a file holding the server's bearer token (memest-server --auth-token-file)")
      ->type_name("FILE");
  const char* tls = "TLS (memest-server --tls-cert)";
  app->add_flag("--tls", flags->tls.enabled,
                "call the server over TLS, trusting the system's CAs (implied by the flags below)")
      ->group(tls);
  app->add_option("--tls-ca", flags->tls.ca_file, "the CA that signed the server's certificate")
      ->type_name("FILE")
      ->group(tls);
  app->add_option("--tls-cert", flags->tls.cert_file,
                  "this client's certificate, for a server that asks for one (--tls-client-ca)")
      ->type_name("FILE")
      ->group(tls);
  app->add_option("--tls-key", flags->tls.key_file, "the private key of --tls-cert")
      ->type_name("FILE")
      ->group(tls);
  app->add_option("--tls-server-name", flags->tls.server_name,
                  "the name the server's certificate carries, when --server's host is not it")
      ->group(tls);
}

void AddEstimateFlags(CLI::App* app, EstimateFlags* f) {
  const char* model = "Model";
  app->add_option("--preset", f->preset, "built-in model (see `memest presets`)")->group(model);
  app->add_option("--param", f->params, "preset parameter NAME=INTEGER (repeatable)")
      ->group(model)
      ->type_name("NAME=INT");
  app->add_option("--seq", f->seq,
                  "sequence length: shortcut for --param seq=N; required with --hf-config")
      ->group(model);
  app->add_option(
         "--model", f->model_file,
         "model file: the proto JSON mapping of memest.v1.Model, in JSON or (.yaml/.yml) YAML")
      ->group(model)
      ->type_name("FILE");
  app->add_option("--hf-config", f->hf_config,
                  "a Hugging Face config.json (llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, "
                  "qwen3_moe, deepseek_v3, gemma, gemma2, gemma3_text, phi3, gpt_neox, gpt2, "
                  "falcon, opt, bert, roberta, t5, vit) or a "
                  "model directory holding one, built offline without weights; give --seq")
      ->group(model)
      ->type_name("FILE|DIR");

  const char* run = "Run";
  app->add_option("--batch", f->batch,
                  "samples per optimizer step (default 1; an op graph without a traced batch: "
                  "its own batch)")
      ->group(run);
  app->add_option("--grad-accum", f->grad_accum, "micro-batches per step (default 1)")->group(run);
  app->add_option("--mode", f->mode, "training | inference (default training)")->group(run);
  app->add_option("--precision", f->precision,
                  "fp32 | fp16 | bf16 | bf16-pure | fp16-pure (fp16/bf16: autocast with fp32 "
                  "master weights; default fp32, or an --hf-config's torch_dtype as the pure "
                  "precision on CUDA)")
      ->group(run);
  app->add_option("--fp8", f->fp8,
                  "delayed | current: fp8 training with TransformerEngine as accelerate runs it "
                  "(every nn.Linear a te.Linear under fp8_autocast; DelayedScaling or "
                  "Float8CurrentScaling; docs/fp8.md)")
      ->group(run);
  app->add_option("--fp8-amax-history", f->fp8_amax_history,
                  "--fp8 delayed: amax_history_len (default 1024)")
      ->group(run);
  app->add_option("--optimizer", f->optimizer,
                  "sgd | momentum | adam | adamw | adagrad | rmsprop | lion | adafactor | "
                  "hf-adamw | hf-adafactor (transformers' own) | adamw-bnb-8bit | "
                  "paged-adamw-8bit | paged-adamw-32bit (bitsandbytes') (default adamw)")
      ->group(run);
  app->add_option("--optimizer-impl", f->optimizer_impl,
                  "for-loop | foreach | fused (default foreach)")
      ->group(run);
  app->add_option("--weight-decay", f->weight_decay, "optimizer weight decay")->group(run);
  app->add_flag("--keep-grads", f->keep_grads,
                "zero_grad(set_to_none=False): gradients stay allocated")
      ->group(run);
  app->add_option("--checkpoint", f->checkpoint,
                  "none | every-block | every-k | sqrt | attention | scopes (default none)")
      ->group(run);
  app->add_option("--checkpoint-k", f->checkpoint_k, "blocks per region for every-k")->group(run);
  app->add_option("--checkpoint-scope", f->checkpoint_scopes,
                  "scope to checkpoint for scopes (repeatable)")
      ->group(run);
  app->add_flag("--non-reentrant", f->non_reentrant,
                "checkpoint with use_reentrant=False (default: reentrant)")
      ->group(run);
  app->add_flag("--first-step", f->first_step,
                "the first step, which creates the optimizer state (default: a later step)")
      ->group(run);
  app->add_option("--generate-tokens", f->generate_tokens,
                  "inference: tokens generated after the prompt (KV cache)")
      ->group(run);
  app->add_flag("--expandable-segments", f->expandable_segments,
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
      ->group(run);
  app->add_flag("--hold-outputs", f->hold_outputs,
                "training: the loop keeps the model's outputs through backward and the "
                "optimizer step, as `outputs = model(**batch)` does (the default)")
      ->group(run);
  app->add_flag("--no-hold-outputs", f->no_hold_outputs,
                "training: the loop lets the outputs go once the loss exists (Hugging Face's "
                "Trainer, Lightning)")
      ->group(run);
  app->add_option("--runtime", f->runtime,
                  "what runs the step: cuda (PyTorch 2.x, default) or cpu-1.13 (PyTorch 1.13 on "
                  "the CPU, exact tensor bytes: what the conformance suite measures)")
      ->group(run);
  app->add_option("--cpu-isa", f->cpu_isa,
                  "with --runtime cpu-1.13: the vector ISA oneDNN uses, avx512 (default) or "
                  "avx2; it picks the convolution kernels and their scratch")
      ->group(run);
  app->add_option("--cpu-l1-cache", f->cpu_l1_cache,
                  "with --runtime cpu-1.13: the per-core L1 data cache oneDNN blocks convolutions "
                  "by, in bytes, as Xbyak reports it (an Intel CPU's; default oneDNN's 32768)")
      ->group(run);
  app->add_option("--cpu-l2-cache", f->cpu_l2_cache,
                  "with --runtime cpu-1.13: the per-core L2 cache, in bytes (default oneDNN's "
                  "524288)")
      ->group(run);
  app->add_option("--attention", f->attention,
                  "how attention layers run: eager, sdpa (the kernel PyTorch 2.x picks; the "
                  "default on CUDA, unless an --hf-config names its attn_implementation), flash, "
                  "mem-efficient, cudnn; HF's flash_attention_2 = flash")
      ->group(run);
  app->add_option("--cuda-module-loading", f->cuda_module_loading,
                  "CUDA_MODULE_LOADING: lazy (default since PyTorch 1.13 / CUDA 11.7) or eager "
                  "(a larger CUDA context)")
      ->group(run);
  app->add_option(
         "--cublas-workspace-config", f->cublas_workspace_config,
         "CUBLAS_WORKSPACE_CONFIG as the run sets it, \":SIZE_KIB:COUNT\" pairs (\":4096:8\": "
         "32 MiB a handle, as deterministic runs set it; default PyTorch's: 32 MiB on "
         "sm_90+, else 8 MiB + 128 KiB)")
      ->group(run);
  app->add_option("--expert-load", f->expert_load,
                  "how a mixture-of-experts router spreads the tokens: worst (default: every "
                  "token to the same top-k experts, the most one expert can hold) or balanced "
                  "(tokens x top-k spread evenly)")
      ->group(run);
  app->add_flag("--no-advice", f->no_advice, "skip the advice (faster)")->group(run);
  app->add_option("--layer-rows", f->max_layer_rows,
                  "the per-layer table's rows: the N layers that hold the most (parameters and "
                  "saved activations), in model order; 0: no table (default: every layer)")
      ->group(run)
      ->type_name("N");
  AddParallelismFlags(app, &f->parallel);
  AddLoraFlags(app, &f->lora);
  AddServingFlags(app, &f->serving);

  const char* device = "Device";
  app->add_option("--device", f->device, "GPU from the catalog (see `memest devices`)")
      ->group(device);
  app->add_option("--capacity", f->capacity, "bare device capacity: bytes, or e.g. 80GiB, 24GB")
      ->group(device)
      ->type_name("BYTES");
}

// An op graph without traced_batch is estimated at the batch it was written at: without
// --batch, that batch (its first input's batch dim, times --grad-accum); a --batch that differs
// is the engine's to refuse (config.batch_size), never silently ignored.
namespace {
std::optional<int64_t> OwnBatch(const EstimateFlags& flags, const v1::Model& model) {
  if (!model.has_ops() || model.ops().traced_batch() != 0) return std::nullopt;
  const int64_t accum = std::max<int64_t>(1, flags.grad_accum.value_or(1));
  for (bool inputs : {true, false}) {  // the inputs fix the batch; targets when no input does
    for (const v1::TensorDecl& t : model.ops().tensors()) {
      const bool role =
          inputs ? t.role() == v1::TENSOR_ROLE_INPUT || t.role() == v1::TENSOR_ROLE_UNSPECIFIED
                 : t.role() == v1::TENSOR_ROLE_TARGET;
      if (!role || t.batch_dim() < 0 || t.batch_dim() >= t.shape_size()) continue;
      return t.shape(t.batch_dim()) * accum;
    }
  }
  return std::nullopt;
}
}  // namespace

StatusOr<v1::RunConfig> BuildRunConfig(const EstimateFlags& flags, const v1::Model& model) {
  v1::RunConfig config;
  MEMEST_RETURN_IF_ERROR(FillConfig(flags, &config));
  if (!flags.batch) {
    if (std::optional<int64_t> own = OwnBatch(flags, model)) config.set_batch_size(*own);
  }
  return config;
}

StatusOr<v1::EstimateRequest> BuildEstimateRequest(const EstimateFlags& flags) {
  v1::EstimateRequest request;
  MEMEST_RETURN_IF_ERROR(FillModel(flags, request.mutable_model()));
  MEMEST_ASSIGN_OR_RETURN(*request.mutable_config(), BuildRunConfig(flags, request.model()));
  request.set_skip_advice(flags.no_advice);
  if (flags.max_layer_rows.has_value()) request.set_max_layer_rows(*flags.max_layer_rows);
  return request;
}

void AddValidateFlags(CLI::App* app, ValidateFlags* f) {
  AddEstimateFlags(app, &f->model);
  const char* v = "Validation";
  app->add_flag("--scale-batch-to-fit", f->scale_batch_to_fit,
                "validate the largest micro-batch that fits the free memory instead of refusing")
      ->group(v);
  app->add_option("--repeats", f->repeats, "timed runs per kernel (default 3)")->group(v);
  app->add_flag("-q,--quiet", f->quiet, "no progress on stderr")->group(v);
}

StatusOr<v1::ValidateRequest> BuildValidateRequest(const ValidateFlags& flags) {
  MEMEST_ASSIGN_OR_RETURN(v1::EstimateRequest estimate, BuildEstimateRequest(flags.model));
  v1::ValidateRequest request;
  *request.mutable_model() = std::move(*estimate.mutable_model());
  *request.mutable_config() = std::move(*estimate.mutable_config());
  request.set_scale_batch_to_fit(flags.scale_batch_to_fit);
  request.set_repeats(flags.repeats);
  return request;
}

StatusOr<google::protobuf::Struct> ReadHfConfigFile(const std::string& given) {
  // A model's directory (a snapshot from the hub) holds its config.json.
  return ReadJsonObjectFile(given, "--hf-config", "config.json");
}

namespace {

// A file's text: a regular file (not a FIFO that would block, nor /dev/zero) of at most `max`
// bytes, read no further than that. `flag` names it in the error.
StatusOr<std::string> ReadBoundedFile(const std::string& flag, const std::string& path,
                                      size_t max) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    return InvalidArgument(flag + (std::filesystem::exists(path, error)
                                       ? ": not a regular file"
                                       : ": cannot open the file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(flag + ": cannot open the file");
  std::string text(max + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > max) {
    return InvalidArgument(flag + ": larger than " + std::to_string(max >> 20) + " MiB");
  }
  return text;
}

}  // namespace

StatusOr<google::protobuf::Struct> ReadJsonObjectFile(const std::string& given,
                                                      const std::string& flag_name,
                                                      const std::string& file_in_directory) {
  const std::string flag = flag_name + " " + Escape(given, kMaxNameBytes);
  std::error_code error;
  const bool directory = std::filesystem::is_directory(given, error);
  const std::string path =
      directory ? (std::filesystem::path(given) / file_in_directory).string() : given;
  if (directory && !std::filesystem::exists(path, error)) {
    return InvalidArgument(flag + ": the directory has no " + file_in_directory);
  }
  MEMEST_ASSIGN_OR_RETURN(const std::string text, ReadBoundedFile(flag, path, kMaxConfigBytes));
  google::protobuf::Struct config;
  const auto status = google::protobuf::util::JsonStringToMessage(text, &config);
  if (!status.ok()) {
    return InvalidArgument(flag + ": not a JSON object: " +
                           BoundMessage(std::string(status.message()), kMaxNameBytes));
  }
  return config;
}

StatusOr<v1::Model> ReadModelFile(const std::string& path) {
  const std::string flag = "--model " + Escape(path, kMaxNameBytes);
  MEMEST_ASSIGN_OR_RETURN(std::string json, ReadBoundedFile(flag, path, kMaxModelFileBytes));
  const bool yaml = IsYamlPath(path);
  if (yaml) {
    StatusOr<std::string> converted = YamlToJson(json);
    if (!converted.ok()) return converted.status().Prefixed(flag + ": ");
    json = *std::move(converted);
  }
  v1::Model model;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &model, options);
  if (!status.ok()) {
    // The parser's message may quote the file's text: escaped and bounded like any message.
    return InvalidArgument(flag + ": not a memest.v1.Model in " + (yaml ? "YAML" : "JSON") + ": " +
                           BoundMessage(std::string(status.message()), kMaxNameBytes));
  }
  return model;
}

}  // namespace memest::cli
