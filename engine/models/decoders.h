// Decoder-only language models, built op by op as Hugging Face's modules run them: GPT-2
// (GPT2LMHeadModel), the Llama family (LlamaForCausalLM and the models written like it:
// Mistral, Qwen2, Qwen3, Gemma 1, 2 and 3, Phi-3), GPT-NeoX, Falcon and OPT. The presets
// (engine/models/presets.cc) and the Hugging Face config front end (engine/models/hf_config.cc)
// both fill these specs; neither builds a decoder itself.
#ifndef MEMEST_ENGINE_MODELS_DECODERS_H_
#define MEMEST_ENGINE_MODELS_DECODERS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "engine/models/layers.h"
#include "engine/models/model.h"

namespace memest {

// Where a spec's value came from, for errors: Field("heads") is "model.preset.params.heads" for
// a preset and "model.hf_config.config.num_attention_heads" for a config.
using FieldOf = std::function<std::string(const char* spec_field)>;

struct Gpt2Spec {
  int64_t seq = 0;
  int64_t layers = 0;
  int64_t d_model = 0;
  int64_t heads = 0;
  int64_t vocab = 0;
  int64_t positions = 1024;  // n_positions: the position table's rows (seq must fit)
  int64_t ffn = 0;           // n_inner; 0: 4 * d_model
  bool tie_embeddings = true;  // lm_head uses wte's weight (every GPT-2 checkpoint)
  Activation activation = Activation::kGeluNew;
  double embd_dropout = 0.1;
  double attn_dropout = 0.1;
  double resid_dropout = 0.1;
};

struct LlamaSpec {
  int64_t seq = 0;
  int64_t layers = 0;
  int64_t d_model = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;  // 0: d_model / heads
  int64_t ffn = 0;
  int64_t vocab = 0;
  bool tie_embeddings = false;  // lm_head uses embed_tokens' weight (Llama 3.2 1B, Qwen2.5 0.5B)
  bool qkv_bias = false;        // Qwen2; Llama's attention_bias biases o_proj too
  bool out_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;  // Qwen3
  // Gemma: the embeddings scaled by sqrt(d_model), and GemmaRMSNorm (float32, 1 + weight) for
  // every norm.
  bool gemma = false;
  // Gemma 2 and 3 (engine/models/hf_gemma.h): the sandwich norms (BlockOptions), the scores
  // scaled by attn_scaling (0: head_dim ** -0.5) and soft-capped by attn_softcap in eager
  // attention, the logits soft-capped by final_softcap before the loss (0: none); the layers
  // `windowed_layers` marks attend within sliding_window, the others to every key (empty: every
  // layer as sliding_window says, as Mistral's). Eager attention adds the windowed layers a mask
  // of their own ("sliding_window_mask" beside "causal_mask", both built once as transformers 5
  // builds them); SDPA gets it once the sequence reaches the window and the global layers run
  // is_causal. In inference a windowed layer's KV cache keeps min(seq + generated, max(seq,
  // sliding_window)) positions (transformers 5's DynamicSlidingWindowLayer keeps the window,
  // and the prefill's keys until the first generated token). Gemma 3: the windowed layers take
  // their own rotary tables (rope_local_base_freq, under "rotary_emb_local"), q_norm and k_norm
  // are GemmaRMSNorms after the transpose.
  bool sandwich_norms = false;
  double attn_scaling = 0.0;
  double attn_softcap = 0.0;
  double final_softcap = 0.0;
  std::vector<bool> windowed_layers;
  bool local_rotary = false;
  // Phi-3: qkv_proj and gate_up_proj fused; rotary on the first `rotary_dim` dims of each head
  // (head_dim * partial_rotary_factor) and cat with the rest; dropout on both residual branches.
  bool phi3 = false;
  int64_t rotary_dim = 0;
  double resid_dropout = 0.0;
  Activation activation = Activation::kSilu;
  double attn_dropout = 0.0;  // HF attention_dropout, on the probabilities (eager) or in SDPA
  // Mistral: each query sees the last `sliding_window` keys; 0: all of them. Once the sequence
  // reaches it, HF gives SDPA an explicit [1, 1, T, T] mask (no is_causal, so no flash kernel);
  // eager attention adds its additive mask either way, and flash-attn takes the window as an
  // argument. The KV cache of inference keeps every position (transformers 4's DynamicCache),
  // an over-count for caches that keep the window only (transformers 5's, servers').
  int64_t sliding_window = 0;
  // Mixtral, Qwen2-MoE, Qwen3-MoE: a sparse mixture-of-experts MLP (moe.experts > 0) under
  // `moe_name` in the layers where (i + 1) % moe_every == 0 and i is not in dense_layers
  // (Qwen's decoder_sparse_step and mlp_only_layers); the others keep the dense MLP of `ffn`.
  MoeOptions moe;
  std::string moe_name = "mlp";
  int64_t moe_every = 1;
  std::vector<int64_t> dense_layers;
  int64_t first_dense_layers = 0;  // DeepSeek-V3's first_k_dense_replace: dense MLPs first
  // DeepSeek-V3: latent attention (MlaOptions; head_dim is then qk_rope_head_dim, the rotary
  // tables' width, and attn_scaling the scores' scale).
  std::optional<MlaOptions> mla;
  // HF's output_router_logits: in training the loss adds router_aux_loss_coef times
  // load_balancing_loss_func over every MoE layer's router logits, which the model keeps until
  // then.
  bool router_aux_loss = false;
  double router_aux_loss_coef = 0.001;
};

// GPT-NeoX (GPTNeoXForCausalLM: Pythia, GPT-NeoX-20B): LayerNorm, query_key_value fused per
// head, the rotary on the first rotary_dim dims of each head, and the attention and the MLP in
// parallel on the layer's input (use_parallel_residual) or one after the other.
struct NeoxSpec {
  int64_t seq = 0;
  int64_t layers = 0;
  int64_t d_model = 0;
  int64_t heads = 0;
  int64_t ffn = 0;
  int64_t vocab = 0;
  int64_t rotary_dim = 0;  // head_dim * rotary_pct (partial_rotary_factor)
  bool parallel_residual = true;
  bool attention_bias = true;  // query_key_value and dense
  bool tie_embeddings = false;
  Activation activation = Activation::kGelu;
  double attn_dropout = 0.0;
  double hidden_dropout = 0.0;  // the embeddings', and both branches' before the residual
  // transformers 4.x registers in every attention a causal-mask buffer "bias" [1, 1, P, P]
  // (bool, P = max_position_embeddings) and a 0-dim "masked_bias"; transformers 5 has neither,
  // and there they are an over-count (P^2 bytes a layer). 0: none.
  int64_t mask_positions = 0;
};

// Falcon (FalconForCausalLM, transformers 4.47's modeling_falcon.py;
// engine/models/falcon_decoder.cc): LayerNorms, query_key_value fused, the rotary on every dim
// of each head, GELU MLP (dense_h_to_4h, dense_4h_to_h), the LM head tied by default. Its
// attention's k and v: one head shared by all (multi_query: Falcon-7B), `kv_heads` groups
// whose k and v transformers broadcasts to every head before the product and the cache
// (new_decoder_architecture: Falcon-40B, 180B), or a head each. The attention and the MLP run
// on the same normed input (parallel_attn; with new_decoder_architecture and two norms,
// ln_attn and ln_mlp each their own) or one after the other. Alibi is refused by the config
// reader.
struct FalconSpec {
  int64_t seq = 0;
  int64_t layers = 0;
  int64_t d_model = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;  // new_decoder_architecture's num_kv_heads (0: heads)
  bool new_decoder_architecture = false;
  bool multi_query = true;  // read without new_decoder_architecture only
  bool parallel_attn = true;
  int64_t parallel_norms = 1;  // new_decoder_architecture: 2, ln_attn and ln_mlp; 1, one norm
  bool bias = false;           // every Linear of the layers (FalconLinear: matmul, then + bias)
  int64_t ffn = 0;             // ffn_hidden_size; 0: 4 * d_model
  int64_t vocab = 0;
  bool tie_embeddings = true;
  Activation activation = Activation::kGelu;
  double hidden_dropout = 0.0;     // the MLP's output (and the attention's, in parallel)
  double attention_dropout = 0.0;  // the attention's output before its residual (sequential)
};

// OPT (OPTForCausalLM, transformers 4.47's modeling_opt.py; engine/models/opt_decoder.cc):
// learned positions (max_position_embeddings + 2 rows), embeddings of word_embed_proj_dim
// projected in and out of d_model when they differ (project_in, project_out, OPT-350m), the
// LayerNorms before (do_layer_norm_before) or after each sub-layer, q/k/v/out_proj and fc1/fc2
// biased by enable_bias, a 4-D [N, 1, T, T] mask built every forward, dropout on both
// branches and the probabilities; the LM head tied by default. In inference the forward
// computes every position's logits (4.47's OPT takes no logits_to_keep).
struct OptSpec {
  int64_t seq = 0;
  int64_t layers = 0;
  int64_t d_model = 0;
  int64_t heads = 0;
  int64_t ffn = 0;
  int64_t vocab = 0;
  int64_t positions = 2048;     // max_position_embeddings (the table has 2 more rows)
  int64_t embed_dim = 0;        // word_embed_proj_dim; 0: d_model
  bool norm_before = true;      // do_layer_norm_before
  bool final_norm = true;       // final_layer_norm: with norm_before, unless removed
  bool bias = true;             // enable_bias
  bool norm_affine = true;      // layer_norm_elementwise_affine
  bool tie_embeddings = true;
  Activation activation = Activation::kRelu;
  double dropout = 0.1;
  double attn_dropout = 0.0;
};

// The decoder's graph for ctx.micro_batch sequences of spec.seq tokens. Training ends in HF's
// ForCausalLMLoss (logits upcast to float32, cross_entropy); inference keeps a KV cache of
// seq + ctx.generate_tokens positions and computes the last position's logits. Errors name
// `field(...)` of the spec field at fault.
Status BuildGpt2Model(GraphBuilder& b, const BuildContext& ctx, const Gpt2Spec& spec,
                      const FieldOf& field);
Status BuildLlamaModel(GraphBuilder& b, const BuildContext& ctx, const LlamaSpec& spec,
                       const FieldOf& field);
Status BuildNeoxModel(GraphBuilder& b, const BuildContext& ctx, const NeoxSpec& spec,
                      const FieldOf& field);
Status BuildFalconModel(GraphBuilder& b, const BuildContext& ctx, const FalconSpec& spec,
                        const FieldOf& field);
Status BuildOptModel(GraphBuilder& b, const BuildContext& ctx, const OptSpec& spec,
                     const FieldOf& field);

}  // namespace memest

#endif  // MEMEST_ENGINE_MODELS_DECODERS_H_
