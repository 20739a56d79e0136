// What vLLM's profile run adds around a decoder's LM head (config.serving,
// engine/report/serving.h): the last hidden states gathered and replaced by random ones, and its
// sampler on the logits. Only the serving estimate builds them.
#ifndef MEMEST_ENGINE_MODELS_VLLM_SAMPLER_H_
#define MEMEST_ENGINE_MODELS_VLLM_SAMPLER_H_

#include "engine/ir/graph.h"

namespace memest {

// gpu_model_runner.py's profile run: hidden_states[logit_indices] (a gathered copy of `h`, each
// request's last token, which the run keeps: set in *gathered) and _dummy_sampler_run's
// torch.rand_like of it, which the LM head then reads (returned).
int VllmSamplerInput(GraphBuilder& b, int h, int* gathered);

// vLLM V1's Sampler on the logits of each request's last token (v1/sample/sampler.py, as the
// profile run's _dummy_sampler_run drives it: temperature 0.5, top-k and top-p set, no
// logprobs), under scope "sampler": logits.to(float32), the temperature divided in place,
// top-k/top-p masked in place, probs = softmax(float32), q = empty_like(probs).exponential_(),
// probs.div_(q).argmax(-1). The model-dtype logits stay alive throughout. Top-k/top-p
// (v1/sample/ops/topk_topp_triton.py, vLLM 0.17-0.19) runs one Triton program per
// multiprocessor, each with a row of scratch: logits.new_empty([min(next_power_of_2(min(SMs,
// requests)), SMs), vocab]), cached for the process's life; below 8 requests PyTorch's path sorts
// the logits instead (its sort's values and indices counted).
void VllmSampler(GraphBuilder& b, int logits, int multiprocessors);

}  // namespace memest

#endif  // MEMEST_ENGINE_MODELS_VLLM_SAMPLER_H_
