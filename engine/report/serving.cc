// vLLM's startup on one GPU: the profile run, the KV-cache budget and its pages
// (engine/report/serving.h).
#include "engine/report/serving.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/ir/devices.h"
#include "engine/ir/shape.h"
#include "engine/models/served_model.h"
#include "engine/passes/tensor_parallel.h"
#include "engine/report/kv_pages.h"

namespace memest {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

std::string Str(int64_t v) { return std::to_string(v); }

std::string Gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", static_cast<double>(bytes) / kGiB);
  return text;
}

// What vLLM 0.19.0 allocated outside PyTorch between its startup snapshot and the end of its
// profile run (the "non-torch forward increase"), and what its startup snapshot held beyond the
// CUDA context (NCCL's communicators), on H100-80GB: 0.24-0.27 GiB on one GPU, 2.06-2.21 GiB
// with tensor parallelism, and 1.02-1.04 GiB at the snapshot (docs/serving.md, llm-d-planner's
// logs). The largest of each is taken: the KV cache is never promised more than vLLM gives it.
int64_t NonTorchBytes(int64_t tensor) { return tensor > 1 ? 2263 * kMiB : 277 * kMiB; }
int64_t SnapshotNcclBytes(int64_t tensor) { return tensor > 1 ? 1065 * kMiB : 0; }

// `vllm serve`'s defaults for max_num_seqs and max_num_batched_tokens (engine/arg_utils.py,
// _set_default_args, OPENAI_API_SERVER): a GPU of at least 70 GiB that is not an A100 gets
// 1024 and 8192, the others 256 and 2048.
bool LargeGpu(const DeviceInfo& device) {
  return device.capacity_bytes >= 70 * kGiB && device.name.find("a100") == std::string::npos;
}

Status Refuse(const std::string& field, const std::string& message) {
  return InvalidArgument(field + ": " + message);
}

// vLLM's settings with its defaults filled in, checked together.
// `context`: the model's (ServedContextLength).
StatusOr<ServingReport> ResolveSettings(int64_t context, const RunConfig& config,
                                        const DeviceInfo& device) {
  const ServingConfig& c = config.serving;
  ServingReport s;
  s.gpu_memory_utilization = c.gpu_memory_utilization;
  s.block_size = c.block_size;
  if (c.max_model_len > context) {
    return Refuse("config.serving.max_model_len",
                  Str(c.max_model_len) + " is beyond the model's context of " + Str(context) +
                      " tokens, which vLLM refuses (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)");
  }
  s.max_model_len = c.max_model_len > 0 ? c.max_model_len : context;
  // vLLM 0.19's order (_set_default_max_num_seqs_and_batched_tokens_args): the defaults, the
  // default batched tokens at most max_num_seqs * max_model_len, the default sequences at most
  // the batched tokens.
  const bool large = LargeGpu(device);
  const int64_t seqs = c.max_num_seqs > 0 ? c.max_num_seqs : (large ? 1024 : 256);
  s.max_num_batched_tokens = c.max_num_batched_tokens;
  if (s.max_num_batched_tokens == 0) {
    s.max_num_batched_tokens = large ? 8192 : 2048;
    if (seqs <= s.max_num_batched_tokens / s.max_model_len) {
      s.max_num_batched_tokens = seqs * s.max_model_len;
    }
  }
  s.max_num_seqs =
      c.max_num_seqs > 0 ? c.max_num_seqs : std::min(seqs, s.max_num_batched_tokens);
  if (s.max_num_batched_tokens < s.max_num_seqs) {
    // SchedulerConfig's check: every scheduled request takes at least one token of the step.
    return Refuse(c.max_num_batched_tokens > 0 ? "config.serving.max_num_batched_tokens"
                                               : "config.serving.max_num_seqs",
                  "max_num_batched_tokens " + Str(s.max_num_batched_tokens) +
                      " must be at least max_num_seqs " + Str(s.max_num_seqs) +
                      " (each scheduled request takes a token of the step)");
  }
  s.request_tokens = c.request_tokens > 0 ? c.request_tokens : s.max_model_len;
  if (s.request_tokens > s.max_model_len) {
    return Refuse("config.serving.request_tokens",
                  Str(s.request_tokens) + " is longer than max_model_len " +
                      Str(s.max_model_len) + ", which the server refuses");
  }
  if (c.concurrency > s.max_num_seqs) {
    return Refuse("config.serving.concurrency",
                  Str(c.concurrency) + " requests never run at once with max_num_seqs " +
                      Str(s.max_num_seqs));
  }
  s.concurrency = c.concurrency;
  s.profile_requests = std::min(s.max_num_seqs, s.max_num_batched_tokens);
  return s;
}

// MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size (vLLM 0.19): eight requests
// of max_model_len or four pages a request, at most 64 Ki tokens, at least a page a request.
// With an fp8 cache vLLM runs FlashMLA, whose pages are 64 tokens when --block-size is unset:
// the larger of that and the setting. ResolveSettings bounds max_model_len (2^24), max_num_seqs
// (2^20) and block_size: no overflow.
int64_t MlaWorkspaceRows(const ServingReport& s, bool fp8_cache) {
  const int64_t block = fp8_cache ? std::max<int64_t>(s.block_size, 64) : s.block_size;
  const int64_t pages = s.max_num_seqs * block;
  return std::max(std::min(std::max(8 * s.max_model_len, 4 * pages), int64_t{64} * 1024), pages);
}

// Latent attention (DeepSeek's): vLLM caches kv_a_proj_with_mqa's output, the latent and the
// rotary key, as one "head" a token a layer (MLAAttentionSpec), whole on every rank. The layers
// of `graph` (built for transformers, whose caches hold every head's keys and values) that have
// one; none for another model.
std::vector<KvLayer> LatentLayers(const Graph& graph, KvCacheDType kv, ServingReport* s) {
  static constexpr std::string_view kLatent = ".kv_a_proj_with_mqa.weight";
  std::unordered_map<std::string_view, int64_t> width;  // attention scope -> latent width
  for (const Tensor& t : graph.tensors) {
    const std::string_view name = t.name;
    if (name.size() > kLatent.size() && name.substr(name.size() - kLatent.size()) == kLatent) {
      width[name.substr(0, name.size() - kLatent.size())] = t.shape[0];
    }
  }
  std::vector<KvLayer> layers;
  if (width.empty()) return layers;
  for (const Tensor& cache : graph.tensors) {
    if (!cache.kv_cache || cache.name.find("k_cache") == std::string::npos) continue;
    auto it = width.find(std::string_view(cache.name).substr(0, cache.name.rfind('.')));
    if (it == width.end()) continue;
    const int64_t element = kv == KvCacheDType::kAuto ? DTypeSize(cache.dtype) : 1;
    layers.push_back({it->second * element, 0});
    if (kv == KvCacheDType::kAuto) s->kv_cache_dtype = std::string(DTypeName(cache.dtype));
  }
  return layers;
}

// The layers' KV caches on this GPU, as vLLM's pages: the model built for one token of one
// sequence in inference, with room for the most tokens a request may generate so that a
// sliding-window layer's cache stops at its window (transformers 5's, which the builders follow)
// where a full one does not; tensor parallelism applied (each rank's max(1, kv_heads / t) heads);
// the elements at the served element type; latent attention's layers as LatentLayers says. Sets
// s->kv_layers, s->kv_bytes_per_token and s->kv_cache_dtype.
StatusOr<KvPages> ReadKvPages(const ModelSpec& model, const RunConfig& config, int64_t max_ops,
                              Budget* budget, ServingReport* s) {
  RunConfig one = config;
  one.serving = ServingConfig{};
  one.quantization = QuantizationConfig{};  // the caches are the same whatever the weights
  one.lora = LoraConfig{};                  // and whatever the adapters
  one.batch_size = 1;
  one.parallelism = ParallelismConfig{};
  one.generate_tokens = kMaxGenerateTokens - 1;
  const int64_t full = 1 + one.generate_tokens;
  MEMEST_ASSIGN_OR_RETURN(ModelSpec token, WithSequence(model, 1));
  MEMEST_ASSIGN_OR_RETURN(Graph graph, BuildStepGraph(token, one, max_ops, budget));
  const KvCacheDType kv = config.serving.kv_cache_dtype;
  std::vector<KvLayer> layers = LatentLayers(graph, kv, s);
  const int64_t t = config.parallelism.tensor;
  if (layers.empty() && t > 1) {  // each rank's KV heads: max(1, kv_heads / t) (replicated
                                  // below one)
    MEMEST_ASSIGN_OR_RETURN(TensorParallelView view,
                            ShardTensorParallel(graph, config.parallelism));
    graph = std::move(view.graph);
  }
  if (layers.empty()) {
    // With use_cache the prompt's token is the forward's (Graph::cache), the room the rest.
    const int64_t prompt = graph.cache.empty() ? 0 : 1;
    for (const Tensor& cache : graph.tensors) {
      // The keys' cache [1, kv_heads, positions, head_dim]; the values' is its twin.
      if (!cache.kv_cache || cache.shape.size() != 4 ||
          cache.name.find("k_cache") == std::string::npos) {
        continue;
      }
      const int64_t element = kv == KvCacheDType::kAuto ? DTypeSize(cache.dtype) : 1;
      const int64_t positions = cache.shape[2] + prompt;
      const int64_t window = positions < full ? positions : 0;
      layers.push_back({2 * cache.shape[1] * cache.shape[3] * element, window});
      if (kv == KvCacheDType::kAuto) s->kv_cache_dtype = std::string(DTypeName(cache.dtype));
    }
  }
  if (kv != KvCacheDType::kAuto) s->kv_cache_dtype = KvCacheDTypeName(kv);
  MEMEST_ASSIGN_OR_RETURN(KvPages pages,
                          KvPages::Make(layers, s->block_size, s->max_num_batched_tokens));
  s->kv_layers = static_cast<int64_t>(layers.size());
  s->kv_bytes_per_token = pages.bytes_per_token();
  return pages;
}

// The longest request, up to `most` tokens, for which fits(tokens) holds (fits is monotone:
// a longer request never takes less); 0 when none does.
int64_t Longest(int64_t most, const std::function<bool(int64_t)>& fits) {
  int64_t lo = 0, hi = most;
  while (lo < hi) {
    const int64_t mid = hi - (hi - lo) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// The budget, the pages and the answers, from the profile run's peak.
void DivideMemory(const Report& profile, const DeviceInfo& device, int64_t tensor,
                  const KvPages& pages, ServingReport* s) {
  const int64_t total = device.capacity_bytes;
  s->requested_bytes =
      static_cast<int64_t>(std::floor(static_cast<double>(total) * s->gpu_memory_utilization));
  s->weights_bytes = profile.peak.by_category[static_cast<int>(Category::kParameters)];
  s->activation_peak_bytes = profile.peak.allocated_bytes - s->weights_bytes;
  s->non_torch_bytes = NonTorchBytes(tensor);
  s->kv_cache_bytes = s->requested_bytes - profile.peak.allocated_bytes - s->non_torch_bytes;
  s->baseline_bytes = device.cuda_context_bytes + SnapshotNcclBytes(tensor);
  const int64_t blocks = pages.Blocks(s->kv_cache_bytes);
  s->num_blocks = blocks;
  s->kv_tokens = pages.Tokens(blocks);
  s->max_concurrency = static_cast<double>(blocks) /
                       static_cast<double>(pages.BlocksPerRequest(s->max_model_len));
  const int64_t usable = std::max<int64_t>(blocks - 1, 0);  // block 0 is the null block
  s->concurrent_requests =
      std::min(s->max_num_seqs, usable / pages.BlocksPerRequest(s->request_tokens));
  if (s->concurrency > 0) {
    const int64_t c = s->concurrency;
    s->longest_request = Longest(s->max_model_len, [&](int64_t tokens) {
      return pages.BlocksPerRequest(tokens) <= usable / c;
    });
  }
  // vLLM's estimate_max_model_len: the longest request whose pages the cache's bytes hold.
  s->longest_single_request = Longest(s->max_model_len, [&](int64_t tokens) {
    return pages.NeededBytes(tokens) <= s->kv_cache_bytes;
  });
  const int64_t free_at_start = total - s->baseline_bytes;
  const int64_t needed = pages.NeededBytes(s->max_model_len);
  if (free_at_start < s->requested_bytes) {
    s->refusal = "Free memory on device (" + Gib(free_at_start) + "/" + Gib(total) +
                 " GiB) on startup is less than desired GPU memory utilization (" +
                 std::to_string(s->gpu_memory_utilization) + ", " + Gib(s->requested_bytes) +
                 " GiB)";
  } else if (profile.peak.allocated_bytes > free_at_start) {
    s->refusal = "CUDA out of memory while loading the model: its weights and the profile run "
                 "take " + Gib(profile.peak.allocated_bytes) + " GiB, and the GPU has " +
                 Gib(free_at_start) + " GiB free";
  } else if (s->kv_cache_bytes <= 0) {
    s->refusal = "No available memory for the cache blocks: the weights, the profile run's "
                 "activations and the memory outside PyTorch take " +
                 Gib(profile.peak.allocated_bytes + s->non_torch_bytes) + " GiB of the " +
                 Gib(s->requested_bytes) + " GiB requested";
  } else if (needed > s->kv_cache_bytes) {
    s->refusal = "To serve at least one request with the model's max seq len (" +
                 Str(s->max_model_len) + "), " + Gib(needed) +
                 " GiB KV cache is needed, which is larger than the available KV cache memory (" +
                 Gib(s->kv_cache_bytes) + " GiB); the estimated maximum model length is " +
                 Str(s->longest_single_request);
  }
  s->starts = s->refusal.empty();
}

DeviceFit ServingFit(const DeviceInfo& device, const Report& profile, const ServingReport& s,
                     int64_t needed) {
  DeviceFit fit;
  fit.device = device.name;
  fit.capacity_bytes = device.capacity_bytes;
  // What the server takes: its share of the GPU, or when that cannot hold the weights, the
  // profile and one longest request, those.
  const int64_t least =
      std::min(profile.peak.allocated_bytes + s.non_torch_bytes + needed, kMaxBytes);
  fit.required_bytes = s.baseline_bytes + std::max(s.requested_bytes, least);
  fit.fits = s.starts;
  fit.headroom_bytes = fit.capacity_bytes - fit.required_bytes;
  return fit;
}

// The largest CUDA-graph pool vLLM 0.18-0.19's logs show, captured after the KV cache, outside
// the budget: 2.27 GiB for DeepSeek-R1 at TP 8 on H200 (Red Hat's records); 0.51-1.85 GiB for
// dense and MoE models on H100 (llm-d-planner's, 51 + 51 graphs up to 512 tokens).
constexpr int64_t kLargestGraphPool = 2325 * kMiB;

void AddServingNotes(const ServingReport& s, int64_t tensor, const KvPages& pages, Report* r) {
  if (s.starts && r->fit && r->fit->headroom_bytes < kLargestGraphPool) {
    r->notes.push_back(
        "serving: after the server's share the GPU has " + Gib(r->fit->headroom_bytes) +
        " GiB left, less than the " + Gib(kLargestGraphPool) +
        " GiB of CUDA graphs vLLM 0.19.0 captured after its KV cache (DeepSeek-R1 on eight "
        "H200s; 0.5-1.9 GiB for dense and MoE models on H100): capturing them "
        "may run out of memory; a lower gpu_memory_utilization leaves them room");
  }
  r->notes.push_back(
      "serving: vLLM V1's startup as 0.17-0.19 run it (earlier versions' sampler sorts the "
      "logits and peaks higher): the breakdown and peak are its profile run, " +
      Str(s.max_num_batched_tokens) + " tokens in " + Str(s.profile_requests) +
      " requests (attention fused, no KV cache yet) and its sampler on their last tokens "
      "(float32 logits, probabilities and exponential draws, [requests, vocab] each)");
  r->notes.push_back(
      "serving: memory outside PyTorch's allocator during the profile counted as vLLM 0.19.0 "
      "measured it on H100 (" + Gib(NonTorchBytes(tensor)) + " GiB " +
      (tensor > 1 ? "with tensor parallelism" : "on one GPU") +
      "); CUDA graphs are captured after the KV cache, outside gpu_memory_utilization "
      "(0.5-1.9 GiB on H100, 2.3 GiB for DeepSeek-R1 on H200), so the rest of the GPU must "
      "hold them");
  if (pages.sliding()) {
    r->notes.push_back("serving: full-attention and sliding-window layers grouped as vLLM's "
                       "hybrid KV cache manager groups them, in " + Str(pages.groups()) +
                       " groups (" + Str(pages.padding_layers()) + " padding layers)");
  }
  r->notes.push_back(
      "serving: the forward is built as Hugging Face's modules run it (vLLM fuses q/k/v and "
      "gate/up projections under torch.compile)");
}

}  // namespace

StatusOr<Report> EstimateServing(const ModelSpec& model, const RunConfig& config,
                                 const EstimateOptions& options) {
  MEMEST_RETURN_IF_ERROR(ValidateRunConfig(config));
  if (config.batch_size != 1) {
    return Refuse("config.batch_size",
                  "a server's batches are its scheduler's (config.serving.max_num_seqs, "
                  "max_num_batched_tokens); leave it unset");
  }
  if (config.attention != AttentionImpl::kDefault && config.attention != AttentionImpl::kFlash) {
    return Refuse("config.attention", std::string(AttentionImplName(config.attention)) +
                                          ": vLLM runs its own attention backend "
                                          "(FlashAttention); leave it unset");
  }
  if (IsAutocast(config.precision)) {
    return Refuse("config.precision",
                  std::string(PrecisionName(config.precision)) +
                      " is torch.autocast; vLLM keeps the model in one dtype: use bf16-pure, "
                      "fp16-pure or fp32");
  }
  const auto* hf = std::get_if<HfConfigSpec>(&model.source);
  if (hf != nullptr && hf->seq != 0) {
    return Refuse("model.hf_config.seq", "a server's lengths are config.serving's (max_model_len, "
                                         "request_tokens); leave it unset");
  }
  MEMEST_ASSIGN_OR_RETURN(std::optional<DeviceInfo> device, ResolveDevice(config));
  MEMEST_ASSIGN_OR_RETURN(const int64_t context, ServedContextLength(model));
  MEMEST_ASSIGN_OR_RETURN(ServingReport s, ResolveSettings(context, config, *device));
  MEMEST_ASSIGN_OR_RETURN(const ServedRotary rotary, ServedRotaryRows(model, context));
  RunConfig profile = config;
  // vLLM skips the attention kernel in its profile run; a fused kernel of the model's dtype
  // stands for it (FlashAttention takes 16-bit dtypes only).
  const bool flash = ParameterDType(config.precision) != DType::kFloat32 &&
                     AttentionCapability(*device) >= 80;
  profile.attention = flash ? AttentionImpl::kFlash : AttentionImpl::kMemEfficient;
  // vLLM's lm_head: its logits all-gathered whole on every rank (LogitsProcessor._gather_logits),
  // where the sampler reads them.
  profile.parallelism.gather_lm_head = true;
  profile.batch_size = s.profile_requests;
  // The passes read vLLM's settings with its defaults filled in (engine/passes/served_lora.h).
  profile.serving.max_num_seqs = s.max_num_seqs;
  profile.serving.max_num_batched_tokens = s.max_num_batched_tokens;
  if (config.lora.rank > 0) {
    MEMEST_ASSIGN_OR_RETURN(profile.serving.lora_layout, ServedLoraModules(model));
  }
  MEMEST_ASSIGN_OR_RETURN(
      ModelSpec run, WithSequence(model, CeilDiv(s.max_num_batched_tokens, s.profile_requests)));
  MEMEST_ASSIGN_OR_RETURN(BuildContext ctx,
                          StepBuildContext(profile, options.max_ops, options.budget));
  ctx.serving = true;
  ctx.mla_workspace_rows =
      MlaWorkspaceRows(s, config.serving.kv_cache_dtype != KvCacheDType::kAuto);
  ctx.rotary_positions = rotary.global;
  ctx.rotary_local_positions = rotary.local;
  MEMEST_ASSIGN_OR_RETURN(Graph graph, BuildGraph(run, ctx));
  MEMEST_ASSIGN_OR_RETURN(KvPages pages,
                          ReadKvPages(model, profile, options.max_ops, options.budget, &s));
  EstimateOptions plain = options;
  plain.advice = false;
  MEMEST_ASSIGN_OR_RETURN(Report report, EstimateGraph(graph, profile, plain));
  if (report.serving) s.lora_bytes = report.serving->lora_bytes;
  DivideMemory(report, *device, config.parallelism.tensor, pages, &s);
  report.fit = ServingFit(*device, report, s, pages.NeededBytes(s.max_model_len));
  AddServingNotes(s, config.parallelism.tensor, pages, &report);
  report.serving = std::move(s);
  return report;
}

}  // namespace memest
