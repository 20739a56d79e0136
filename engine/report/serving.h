// A model served by vLLM's V1 engine (config.serving; docs/serving.md): what one GPU of its
// tensor-parallel group holds when the server has started, and what its KV cache holds.
//
// vLLM starts by loading the weights, then runs a profile: one forward of
// max_num_batched_tokens tokens split into min(max_num_seqs, tokens) requests, and its sampler
// on each request's last token (v1/worker/gpu_model_runner.py, profile_run). What the GPU may
// hold is total * gpu_memory_utilization; the KV cache gets what the weights, the profile's
// activation peak and the memory allocated outside PyTorch leave (v1/worker/gpu_worker.py,
// determine_available_memory), cut into pages of block_size tokens of every layer
// (v1/core/kv_cache_utils.py). The estimate builds that profile run op by op (the model's graph
// at ceil(tokens / requests) tokens a request, its attention fused, no KV cache in the graph,
// vLLM's sampler after the head), walks it as any step, and divides what is left into pages
// whose size it reads from the model's KV cache layout on this GPU (the same model built for one
// token, tensor parallelism applied).
//
// Versions: the budget and pages are vLLM 0.11-0.19's (CUDA graphs captured after the KV cache,
// outside the budget); the sampler and the defaults are 0.17-0.19's (Triton top-k/top-p; `vllm
// serve`'s max_num_seqs 1024 and max_num_batched_tokens 8192 on a GPU of at least 70 GiB that is
// not an A100, else 256 and 2048, the tokens at most max_num_seqs * max_model_len; utilization
// 0.9; blocks of 16 tokens). Full-attention and sliding-window layers are grouped as vLLM's
// hybrid KV cache manager groups them (engine/report/kv_pages.h).
#ifndef MEMEST_ENGINE_REPORT_SERVING_H_
#define MEMEST_ENGINE_REPORT_SERVING_H_

#include "engine/estimator.h"

namespace memest {

// The report of the profile run (its peak, breakdown, layers) with `serving` set. Refused,
// naming the field: a model that is not a decoder language model ("model"), a preset's seq out
// of range ("model.preset.params.seq"), a config's seq ("model.hf_config.seq": the lengths are
// config.serving's), a batch size ("config.batch_size": the scheduler makes the batches), an
// attention other than the default or flash ("config.attention"), an autocast precision
// ("config.precision": vLLM keeps one dtype), more tensor-parallel ranks than KV heads
// ("config.parallelism.tensor"), a max_model_len beyond the model's context, and settings vLLM
// would refuse together once its defaults are filled in (max_num_batched_tokens below
// max_num_seqs, request_tokens beyond max_model_len, concurrency beyond max_num_seqs).
StatusOr<Report> EstimateServing(const ModelSpec& model, const RunConfig& config,
                                 const EstimateOptions& options);

}  // namespace memest

#endif  // MEMEST_ENGINE_REPORT_SERVING_H_
