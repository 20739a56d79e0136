// --serve and vLLM's engine arguments (client/cli/serving_flags.h).
#include "client/cli/serving_flags.h"

#include "client/cli/words.h"

namespace memest::cli {
namespace {

const Word<v1::KvCacheDtype> kKvCacheDtypes[] = {
    {"auto", v1::KV_CACHE_DTYPE_UNSPECIFIED},
    {"fp8", v1::KV_CACHE_DTYPE_FP8_E4M3},
    {"fp8_e4m3", v1::KV_CACHE_DTYPE_FP8_E4M3},
    {"fp8_e5m2", v1::KV_CACHE_DTYPE_FP8_E5M2},
};

}  // namespace

void AddServingFlags(CLI::App* app, ServingFlags* f) {
  const char* group = "Serving (vLLM)";
  app->add_flag("--serve", f->serve,
                "the model served by vLLM's engine on each GPU: the KV cache its startup "
                "leaves and what it holds (inference; give a --device)")
      ->group(group);
  app->add_option("--gpu-memory-utilization", f->gpu_memory_utilization,
                  "the GPU's share the server may use (default 0.9)")
      ->group(group);
  app->add_option("--block-size", f->block_size, "tokens per KV-cache page (default 16)")
      ->group(group);
  app->add_option("--max-num-seqs", f->max_num_seqs,
                  "requests scheduled at once (default: 1024 on a GPU of 70 GiB or more that is "
                  "not an A100, else 256)")
      ->group(group);
  app->add_option("--max-num-batched-tokens", f->max_num_batched_tokens,
                  "tokens in one step (default: 8192, or 2048 where max-num-seqs is 256)")
      ->group(group);
  app->add_option("--max-model-len", f->max_model_len,
                  "the longest request, prompt and output (default: the model's context)")
      ->group(group);
  app->add_option("--kv-cache-dtype", f->kv_cache_dtype,
                  "auto (the model's dtype), fp8 (= fp8_e4m3) or fp8_e5m2")
      ->group(group);
  app->add_option("--request-tokens", f->request_tokens,
                  "how many requests of this many tokens fit at once (default: max-model-len)")
      ->group(group);
  app->add_option("--concurrency", f->concurrency,
                  "the longest request when this many run at once")
      ->group(group);
  app->add_option("--max-loras", f->max_loras,
                  "with --lora-rank (vLLM's --enable-lora and --max-lora-rank; --lora-targets "
                  "are vLLM's module suffixes, qkv_proj,o_proj,...; none: every module): "
                  "adapters in one batch (default 1)")
      ->group(group);
  app->add_flag("--fully-sharded-loras", f->fully_sharded_loras,
                "with --lora-rank: the adapters split by tensor parallelism too")
      ->group(group);
}

Status ApplyServingFlags(const ServingFlags& f, v1::RunConfig* config) {
  if (!f.serve) {
    const char* given = f.gpu_memory_utilization ? "--gpu-memory-utilization"
                        : f.block_size           ? "--block-size"
                        : f.max_num_seqs         ? "--max-num-seqs"
                        : f.max_num_batched_tokens ? "--max-num-batched-tokens"
                        : f.max_model_len        ? "--max-model-len"
                        : !f.kv_cache_dtype.empty() ? "--kv-cache-dtype"
                        : f.request_tokens       ? "--request-tokens"
                        : f.concurrency          ? "--concurrency"
                        : f.max_loras            ? "--max-loras"
                        : f.fully_sharded_loras  ? "--fully-sharded-loras"
                                                 : nullptr;
    if (given == nullptr) return Status::Ok();
    return InvalidArgument(std::string(given) + ": a serving setting; add --serve");
  }
  v1::Serving* s = config->mutable_serving();
  if (f.gpu_memory_utilization) s->set_gpu_memory_utilization(*f.gpu_memory_utilization);
  if (f.block_size) s->set_block_size(*f.block_size);
  if (f.max_num_seqs) s->set_max_num_seqs(*f.max_num_seqs);
  if (f.max_num_batched_tokens) s->set_max_num_batched_tokens(*f.max_num_batched_tokens);
  if (f.max_model_len) s->set_max_model_len(*f.max_model_len);
  if (f.request_tokens) s->set_request_tokens(*f.request_tokens);
  if (f.concurrency) s->set_concurrency(*f.concurrency);
  if (f.max_loras) s->set_max_loras(*f.max_loras);
  s->set_fully_sharded_loras(f.fully_sharded_loras);
  if (!f.kv_cache_dtype.empty()) {
    MEMEST_ASSIGN_OR_RETURN(v1::KvCacheDtype d,
                            ParseWord("--kv-cache-dtype", f.kv_cache_dtype, kKvCacheDtypes));
    s->set_kv_cache_dtype(d);
  }
  return Status::Ok();
}

}  // namespace memest::cli
