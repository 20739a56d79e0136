// Layers: PyTorch modules expanded into ops of the vocabulary (engine/rules/op_rules.h).
//
// Each helper adds, under the builder's current scope plus its own module name, the parameters
// and the ops that the PyTorch module runs in its forward, in the order it runs them, and
// returns the output tensor (or -1 once the builder has failed; errors are sticky, see
// GraphBuilder). Parameters and buffers are named after the module path, as in a PyTorch
// state_dict ("h.3.attn.c_attn.weight"), and take LayerContext::param_dtype. In inference
// (model.eval()) dropout is the identity and adds no op.
//
// ExpandLayer() is the layer-model front end (engine/models/model.h, LayerModelSpec): one LayerSpec
// of a kind below becomes ops. The kinds and their attributes (defaults after "="; attributes
// without a default are required; flags are 0/1 integers):
//
//   linear        out_features, bias=1, in_features (optional: checked against the input)
//                                                           input [.., in_features]
//   conv1d        out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=1,
//                 in_channels (optional: checked)           input [N, C, L]
//   conv2d        the same as conv1d                        input [N, C, H, W]
//   mlp           hidden, out_features=<in>, activation="gelu" (relu, gelu, gelu_tanh, silu,
//                 swish), bias=1, dropout=0.0   fc1 -> act -> fc2 [-> dropout]
//   attention     heads, kv_heads=heads, causal=0, dropout=0.0, bias=1,
//                 scale_qk=0 (1: scale q and k by head_dim**-0.25 each instead of dividing the
//                 scores by sqrt(head_dim))                 input [N, T, d_model]
//                 modules q_proj, k_proj, v_proj, core (see Attention), o_proj
//   transformer_block  heads, style="gpt2" (pre-LN, gelu_new MLP, fused qkv) or "llama" (RMSNorm,
//                 rotary, grouped-query attention, SwiGLU), ffn=4*d_model (gpt2) or
//                 8/3*d_model rounded up to 256 (llama), kv_heads=heads (llama only),
//                 causal=1, dropout=0.0 (gpt2: attention, residual and MLP dropout)
//                                                           input [N, T, d_model]
//   layer_norm    affine=1 (normalizes the last dim)
//   batch_norm    affine=1 (running statistics are buffers) input [N, C, ...]
//   group_norm    num_groups, affine=1                      input [N, C, ...]
//   rms_norm      upcast=0 (1: computes in float32 as HF's LlamaRMSNorm)
//   relu          inplace=0
//   gelu          approximate="none" ("tanh")
//   silu, sigmoid, tanh
//   swish         x * sigmoid(x) composed of two ops (what autograd saves for the composition,
//                 not for a fused SiLU)
//   softmax       dim=-1
//   dropout       p=0.5 (nn.Dropout's default)
//   max_pool2d    kernel_size, stride=kernel_size, padding=0
//   avg_pool2d    kernel_size, stride=kernel_size, padding=0
//   adaptive_avg_pool2d  output_size=1
//   flatten       start_dim=1, end_dim=-1 (nn.Flatten's defaults)
//   embedding     num_embeddings, embedding_dim             input: int64 indices
//
// Errors: an unknown kind is INVALID_ARGUMENT naming "<field>.kind" and listing the kinds; a
// missing, mistyped, out-of-range or unknown (misspelt) attribute names "<field>.attrs.<name>";
// an input of the wrong rank names "<field>" with the shape it got.
#ifndef MEMEST_ENGINE_MODELS_LAYERS_H_
#define MEMEST_ENGINE_MODELS_LAYERS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/ir/config.h"
#include "engine/ir/experts.h"
#include "engine/ir/graph.h"
#include "engine/models/model.h"
#include "engine/rules/sdpa_select.h"

namespace memest {

// Attribute values with their type spelled out (a bare `1` would be ambiguous in AttrValue).
inline AttrValue AttrInt(int64_t v) { return AttrValue(v); }
inline AttrValue AttrFloat(double v) { return AttrValue(v); }
inline AttrValue AttrInts(std::vector<int64_t> v) { return AttrValue(std::move(v)); }

struct LayerContext {
  Mode mode = Mode::kTraining;
  DType param_dtype = DType::kFloat32;
  // How Attention runs its core (config.attention resolved: never kDefault here), and the
  // device generation that picks the SDPA kernel (10 * major + minor).
  AttentionImpl attention = AttentionImpl::kEager;
  int compute_capability = 90;
  DType autocast = DType::kFloat32;  // torch.autocast's dtype while building; float32: none
  // vLLM's rotary embedding: one cos_sin_cache [rotary_positions, rotary_dim] in the model's
  // dtype, read in place by its kernel. 0: Hugging Face's per-forward tables.
  int64_t rotary_positions = 0;
  int64_t rotary_local_positions = 0;  // the sliding-window layers' cache (Gemma 3's)
  // Built for vLLM's profile run (BuildContext.serving): layers vLLM runs as one fused kernel
  // are built as that kernel (SparseMoe: FusedMoE).
  bool vllm = false;
  int64_t mla_workspace_rows = 0;  // BuildContext's
  // Trained by Megatron-LM (BuildContext.megatron): SparseMoe is its MoELayer.
  bool megatron = false;
  // The attention layers mark the keys and values the model returns in its cache
  // (BuildContext.use_cache): GraphBuilder::MarkCache.
  bool use_cache = false;
  bool training() const { return mode == Mode::kTraining; }
};

// ---------------------------------------------------------------------------------------------
// Building blocks. `name` is the module's attribute name ("c_attn", "ln_1"); an empty name adds
// the ops under the current scope.

// nn.Linear: linear(x, weight[out, in], bias[out]).
int Linear(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
           int64_t out_features, bool bias = true);
// nn.Linear whose weight is another module's (a tied lm_head uses the embedding's weight).
int TiedLinear(GraphBuilder& b, std::string_view name, int x, int weight);
// HF's GPT-2 Conv1D: weight [in, out]; addmm(bias, x.view(-1, in), weight).view(.., out).
int HfConv1D(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
             int64_t out_features);

struct ConvOptions {
  int64_t out_channels = 0;
  int64_t kernel_size = 1;
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};
// nn.Conv2d on [N, C, H, W] (square kernels) and nn.Conv1d on [N, C, L].
int Conv2d(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
           const ConvOptions& options);
int Conv1d(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
           const ConvOptions& options);

// Normalisations over the last dim (LayerNorm, RMSNorm) or the channel dim (BatchNorm2d with
// running_mean/running_var/num_batches_tracked buffers, GroupNorm).
int LayerNorm(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
              bool affine = true);
int RmsNorm(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
            bool upcast = true);
// HF's GemmaRMSNorm: computed in float32 and scaled by (1 + weight) before the cast back, made
// of the ops it runs (to, pow, mean, add, rsqrt, mul).
int GemmaRmsNorm(GraphBuilder& b, const LayerContext& c, std::string_view name, int x);
int BatchNorm(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
              bool affine = true);
int GroupNorm(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
              int64_t num_groups, bool affine = true);

// F.dropout: the identity (no op) in inference or when p == 0, as ATen's dropout returns its
// input then.
int Dropout(GraphBuilder& b, const LayerContext& c, int x, double p);

enum class Activation {
  kRelu,
  kReluInplace,
  kGelu,      // exact erf GELU (nn.GELU(), HF "gelu")
  kGeluTanh,  // F.gelu(approximate="tanh"), one op
  kGeluNew,   // HF's NewGELUActivation (GPT-2 "gelu_new"): 0.5*x*(1+tanh(c*(x+0.044715*x^3)))
              // composed of eight ops, as HF runs it
  kSilu,
  kSwish,  // x * sigmoid(x), two ops
  kSigmoid,
  kTanh,
};
int Activate(GraphBuilder& b, int x, Activation act);

// Linear(in -> hidden) -> act -> Linear(hidden -> out) [-> dropout], modules "fc1", "fc2".
struct MlpOptions {
  int64_t hidden = 0;
  int64_t out_features = 0;  // 0: the input's last dim
  Activation activation = Activation::kGelu;
  bool bias = true;
  double dropout = 0.0;
};
int Mlp(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
        const MlpOptions& options);

// Multi-head attention on x [N, T, d_model]. With LayerContext::attention kEager, the math form:
//   q, k, v projections (fused into one projection and split, or three); each viewed as
//   [N, T, heads, head_dim] and transposed to [N, heads, T, head_dim]; optional rotary
//   embedding on q and k; grouped-query k/v repeated to `heads` (unsqueeze + expand + reshape,
//   HF's repeat_kv); then under the sub-scope "core" (what the selective checkpoint policy
//   recomputes): scores = q @ k^T, the scale, the causal mask, softmax, dropout, @ v; then the
//   heads merged (transpose + contiguous + view) and the output projection.
// Otherwise (Hugging Face's sdpa_attention_forward, or flash_attention_2) the core is one
// scaled_dot_product_attention op with is_causal and no mask tensor (HF passes no mask for a
// batch without padding), dropout_p = attn_dropout in training, and attrs.backend the kernel
// engine/rules/sdpa_select.h picks; k and v keep their kv heads (enable_gqa, PyTorch >= 2.5) except
// when the math kernel runs, which repeats them as repeat_kv does. The fused kernels return the
// output in [N, T, heads, hd] memory order, so the merge's contiguous() copies nothing. A kernel
// that config.attention forces but cannot run the call fails the builder naming
// config.attention.
enum class AttentionScale {
  kDivideScores,    // scores / sqrt(head_dim) (GPT-2, BERT)
  kMultiplyScores,  // scores * head_dim**-0.5 (HF Llama's eager attention)
  kScaleQK,         // q * head_dim**-0.25 and k * head_dim**-0.25 before the product
};
enum class AttentionProjection {
  kFusedHfConv1D,  // GPT-2: c_attn (HF Conv1D to 3*d) then split; c_proj Conv1D
  kFusedLinear,    // torchvision/nn.MultiheadAttention: in_proj Linear to 3*d then split
  kSeparate,       // q_proj, k_proj, v_proj, o_proj (Llama) / query, key, value (BERT)
  kFusedQkv,       // Phi-3: qkv_proj Linear to (heads + 2 kv_heads) * head_dim, sliced; o_proj
  kFusedPerHead,   // GPT-NeoX: query_key_value Linear to 3 * d viewed [N, T, heads, 3 * hd],
                   // transposed, chunked into q, k, v along the last dim; dense (names[3])
};
// DeepSeek's multi-head latent attention (transformers 4.57's DeepseekV3Attention;
// engine/models/mla_attention.cc): the query through q_proj, or through q_a_proj (to
// q_lora_rank), q_a_layernorm and q_b_proj; kv_a_proj_with_mqa to kv_lora_rank + one rotary
// key of qk_rope_head_dim shared by every head; kv_a_layernorm and kv_b_proj to each head's
// qk_nope_head_dim key and v_head_dim value; the rotary on the last qk_rope_head_dim dims of
// q and on the shared key (interleaved pairs first with rope_interleave: a view, a transpose
// and a copying reshape), the key expanded to every head and both cat with their rotary part.
struct MlaOptions {
  int64_t q_lora_rank = 0;  // 0: q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool rope_interleave = true;
};

struct AttentionOptions {
  int64_t heads = 0;
  int64_t kv_heads = 0;  // 0: heads
  bool causal = false;
  // Causal masking: a bool buffer "<scope>.bias" [1, 1, mask_positions, mask_positions] sliced
  // to [1, 1, T, T] and masked_fill (GPT-2); or, when `additive_mask` >= 0, that float tensor
  // [.., T, T] added to the scores (HF Llama's 4-D causal mask). Eager attention adds an
  // `additive_mask` without `causal` too (BERT's extended padding mask, [N, 1, 1, T]).
  int64_t mask_positions = 0;  // 0: T
  int additive_mask = -1;
  double attn_dropout = 0.0;
  double resid_dropout = 0.0;
  bool bias = true;                // the q, k and v projections (and the output's, by default)
  std::optional<bool> out_bias;    // the output projection's; unset: as `bias` (Qwen2: q, k, v
                                   // biased, o_proj not)
  int64_t head_dim = 0;            // 0: d_model / heads; set where a config says (Qwen3, Gemma)
  // Qwen3: RMSNorm modules "q_norm" and "k_norm" over head_dim on q and k viewed as
  // [N, T, heads, hd], before the transpose; with gemma_qk_norm (Gemma 3), GemmaRMSNorms on q
  // and k after it, [N, heads, T, hd].
  bool qk_norm = false;
  bool gemma_qk_norm = false;
  // A mask SDPA takes as attn_mask with is_causal false (a sliding window the sequence reaches,
  // as HF builds it for sdpa); -1: none (causal by is_causal). Eager attention takes its mask
  // as `additive_mask`.
  int sdpa_mask = -1;
  AttentionScale scale = AttentionScale::kDivideScores;
  // kMultiplyScores' factor; 0: head_dim ** -0.5 (Gemma 2 and 3: query_pre_attn_scalar ** -0.5).
  double scaling = 0.0;
  // Eager attention: the scaled scores soft-capped (SoftCap) before the mask, as Gemma 2's
  // eager_attention_forward does with attn_logit_softcapping; SDPA has no soft-capping (HF's
  // sdpa_attention_forward drops it) and flash-attn applies it inside its kernel. 0: none.
  double softcap = 0.0;
  AttentionProjection projection = AttentionProjection::kSeparate;
  // Names of the projections for kSeparate: {q, k, v, out}.
  std::vector<std::string> names = {"q_proj", "k_proj", "v_proj", "o_proj"};
  // Rotary embedding (Llama): cos and sin tensors [T, head_dim] (-1: none).
  int rotary_cos = -1;
  int rotary_sin = -1;
  // Phi-3's apply_rotary_pos_emb: the first `rotary_dim` dims of q and k rotated (cos and sin
  // are [T, rotary_dim]) and cat with the rest, a copy even when no dim is left; 0: Llama's.
  int64_t rotary_dim = 0;
  // HF Llama: softmax(scores, dtype=float32).to(q.dtype).
  bool softmax_fp32 = false;
  // HF GPT-2: softmax(scores).type(value.dtype): under autocast softmax returns float32 and
  // the probabilities are cast back to the values' dtype before dropout.
  bool probs_to_value_dtype = false;
  // Hugging Face's attention functions keep their input and q, k, v (after rotary) referenced
  // until they return: held (Graph::held) until the output projection has run.
  bool hold_locals = false;
  // With hold_locals, eager attention's scores and probabilities too: BERT's and ViT's
  // self-attention (transformers 4.47's BertSelfAttention, ViTSelfAttention) keep
  // attention_scores and attention_probs as locals until they return.
  bool hold_scores = false;
  // Inference: the KV cache's room, kv_cache_len positions (AttentionCache).
  int64_t kv_cache_len = 0;
  // DeepSeek's latent attention instead of the projections above (MlaOptions); its scores are
  // multiplied by `scaling`, with `bias` on q_a_proj, kv_a_proj_with_mqa and o_proj.
  std::optional<MlaOptions> mla;
};
// `weights` (optional) receives the eager probabilities HF's attention returns with its output
// (-1 for SDPA, which returns none).
int Attention(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
              const AttentionOptions& options, int* weights = nullptr);

// An attention's cache, as Hugging Face's attentions fill it: with use_cache (c.use_cache) the
// key and value its forward returns (`k`, `v` as the cache takes them: GraphBuilder::MarkCache);
// in inference the room for `room` more positions, the KV cache buffers "k_cache" and "v_cache"
// [n, kv_heads, room, head_dim] in the parameter dtype (with use_cache an empty room too, which
// says a windowed layer has none left).
void AttentionCache(GraphBuilder& b, const LayerContext& c, int k, int v, int64_t n,
                    int64_t kv_heads, int64_t room, int64_t head_dim, int64_t v_head_dim = 0);

// Gemma 2's soft-capping of scores or logits, cap * tanh(x / cap), as the three ops HF writes
// (`x / cap`, `torch.tanh`, `* cap`): tanh keeps its output for backward.
int SoftCap(GraphBuilder& b, int x, double cap);

// HF Llama's rotary embedding on x [N, H, T, hd]: x * cos + rotate_half(x) * sin with
// rotate_half(x) = cat(-x[..., hd/2:], x[..., :hd/2]); cos and sin are [T, hd].
int ApplyRotary(GraphBuilder& b, int x, int cos, int sin);

// A sparse mixture-of-experts MLP as Hugging Face's MixtralSparseMoeBlock and
// Qwen2MoeSparseMoeBlock run it (transformers 4.4x), on x [N, T, d]: the router `gate` (Linear to
// the experts, no bias) on the tokens as [N*T, d]; softmax in float32; top-k (renormalised when
// norm_topk_prob) cast back to x's dtype; a zeros output; one_hot of the choices permuted to
// [experts, k, N*T]; then, for every expert in order, torch.where of its mask (nonzero, then
// the two columns), its tokens gathered (index), its MLP (`names`: first and second Linear to
// expert_ffn, the activation of the first times the second, the out Linear), times its routing
// weights, and index_add_ into the output. Qwen2-MoE adds a shared expert on every token, scaled
// by sigmoid(shared_expert_gate(x)). How many tokens each expert gets is the data's: `load`
// (kWorst, kDefault: the last k experts of the loop get every token, so that each computes on
// all of them and the loop's last locals, held until the block returns, are the largest;
// kBalanced: N*T*k spread evenly).
// `router_logits` (optional) receives the router's output, which the decoder layer returns.
struct MoeOptions {
  int64_t experts = 0;
  int64_t top_k = 0;
  int64_t expert_ffn = 0;
  bool norm_topk_prob = true;
  int64_t shared_expert_ffn = 0;  // 0: no shared expert
  Activation activation = Activation::kSilu;
  ExpertLoad load = ExpertLoad::kDefault;
  // The expert MLP's Linear modules: Mixtral's {"w1", "w3", "w2"}, Qwen's {"gate_proj",
  // "up_proj", "down_proj"}.
  std::vector<std::string> names = {"gate_proj", "up_proj", "down_proj"};
  // DeepSeek-V3's DeepseekV3MoE (transformers 4.57; engine/models/deepseek_moe.cc): the router
  // "gate" a float32 sigmoid over the experts, whose top-k is chosen without gradient among
  // the `topk_groups` best of `groups` groups (each scored by its two best), the weights
  // gathered from the sigmoid, renormalised when norm_topk_prob and scaled by routed_scaling;
  // the experts' outputs weighted and summed in the weights' dtype; `shared_expert_ffn` an
  // ungated MLP "shared_experts" on the block's input, added last.
  bool deepseek = false;
  int64_t groups = 1;
  int64_t topk_groups = 1;
  double routed_scaling = 1.0;
  // In training, the router's load-balancing loss (HF's output_router_logits; under Megatron-LM
  // a positive router_aux_loss_coef, its moe_aux_loss_coeff): Megatron's layer attaches its own
  // (engine/models/megatron_moe.cc); HF's comes from RouterAuxLoss.
  bool router_aux_loss = false;
};
// With c.vllm, vLLM's FusedMoE instead: the router's linear, its top-k, and one fused_experts
// op over every token (engine/rules/fused_moe.cc), its workspace added by the serving pass
// (engine/passes/fused_moe_workspace.h); each expert's Linear modules appear over zero tokens,
// which is what holds their weights for the passes that split and quantize them.
int SparseMoe(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
              const MoeOptions& options, int* router_logits = nullptr);
// With c.megatron, Megatron-LM's MoELayer instead (engine/models/megatron_moe.cc): its router,
// the tokens permuted by expert (index_select), the all-to-all token dispatcher
// (ep_all_to_all, a view with one expert-parallel rank), SequentialMLP's experts
// (experts.local_experts.<i>.linear_fc1 / linear_fc2 with the fused weighted SwiGLU), the way
// back and the unpermutation (scatter_add_); router_logits is left alone.
int MegatronMoe(GraphBuilder& b, const LayerContext& c, int x, const MoeOptions& options);

// In training with HF's output_router_logits: `loss` += coef * load_balancing_loss_func over
// the MoE layers' `router_logits` (cat, softmax, top-k, one_hot, the means), in place; returns
// the loss.
int RouterAuxLoss(GraphBuilder& b, const std::vector<int>& router_logits, const MoeOptions& o,
                  double coef, int loss);

// A transformer block. kGpt2: HF GPT2Block (pre-LN; ln_1, attn, +, ln_2, mlp with gelu_new,
// +; HF Conv1D projections; attention and residual dropout). kLlama: HF LlamaDecoderLayer
// (input_layernorm RMSNorm, self_attn with rotary and GQA, +, post_attention_layernorm,
// mlp = down_proj(silu(gate_proj(x)) * up_proj(x)), +).
enum class BlockStyle { kGpt2, kLlama };
struct BlockOptions {
  BlockStyle style = BlockStyle::kGpt2;
  int64_t heads = 0;
  int64_t kv_heads = 0;  // 0: heads
  int64_t ffn = 0;       // 0: 4 * d_model
  bool causal = true;
  double dropout = 0.0;        // GPT-2: resid_pdrop (the attention output's and the MLP's)
  // The probabilities' dropout (GPT-2 attn_pdrop, HF attention_dropout); negative: GPT-2 uses
  // `dropout`, Llama none.
  double attn_dropout = -1.0;
  int64_t mask_positions = 0;
  // Llama: rotary cos/sin [T, hd] and the additive causal mask; built when -1.
  int rotary_cos = -1;
  int rotary_sin = -1;
  int additive_mask = -1;
  int64_t kv_cache_len = 0;
  // Llama-style variants (HF Mistral, Qwen2, Qwen3, Llama 3): an explicit head_dim (0:
  // d_model / heads), biases of the q/k/v and o projections and of the MLP, Qwen3's q_norm and
  // k_norm, and a mask for SDPA (AttentionOptions).
  int64_t head_dim = 0;
  bool qkv_bias = false;
  bool out_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;
  int sdpa_mask = -1;
  bool gemma_norm = false;  // GemmaRMSNorm for input_layernorm and post_attention_layernorm
  // Gemma 2 and 3: the attention's output normed by post_attention_layernorm before its residual
  // add, the MLP's input by pre_feedforward_layernorm and its output by
  // post_feedforward_layernorm before the second add; the scores scaled by attn_scaling and
  // soft-capped by attn_softcap (AttentionOptions::scaling, softcap; 0: none).
  bool sandwich_norms = false;
  double attn_scaling = 0.0;
  double attn_softcap = 0.0;
  // Phi-3: qkv_proj (AttentionProjection::kFusedQkv), the MLP's gate_up_proj chunked in two,
  // the partial rotary form (AttentionOptions::rotary_dim), dropout on both residual branches.
  bool fused_projections = false;
  int64_t rotary_dim = 0;
  double resid_dropout = 0.0;
  // Hugging Face's references (AttentionOptions::hold_locals; the block's input and the eager
  // probabilities the attention returns, `hidden_states, _ = self.self_attn(...)` in
  // transformers 5, until the block's last op; the MLP's input until the MLP's).
  bool hold_locals = false;
  // The MLP's activation (HF hidden_act / activation_function); unset: the style's own,
  // gelu_new for GPT-2 and SiLU for Llama.
  std::optional<Activation> mlp_activation;
  // Llama style: a sparse mixture-of-experts MLP in place of the dense one when moe.experts > 0
  // (the module `moe_name`: Mixtral's "block_sparse_moe", Qwen's "mlp"); its router's logits
  // are held until the block returns, or, with `router_logits` set, handed out there (HF's
  // output_router_logits) and kept by the caller.
  MoeOptions moe;
  std::string moe_name = "mlp";
  std::vector<int>* router_logits = nullptr;
  // DeepSeek's latent attention (AttentionOptions::mla), its scores scaled by attn_scaling.
  std::optional<MlaOptions> mla;
};
int TransformerBlock(GraphBuilder& b, const LayerContext& c, std::string_view name, int x,
                     const BlockOptions& options);

// Llama helpers shared by blocks: rotary cos/sin buffers [seq, head_dim] ("<scope>.cos_cached",
// "<scope>.sin_cached"; with c.rotary_positions, vLLM's one "<scope>.cos_sin_cache" [positions,
// head_dim], both tables views of its first seq rows) and the additive causal mask buffer
// [1, 1, seq, seq] `name` (HF builds it once per forward in the model dtype and every layer adds
// it to its scores).
void RotaryBuffers(GraphBuilder& b, const LayerContext& c, int64_t seq, int64_t head_dim, int* cos,
                   int* sin);
int AdditiveCausalMask(GraphBuilder& b, const LayerContext& c, int64_t seq,
                       std::string_view name = "causal_mask");

// nn.Embedding: embedding(weight[num, dim], ids). `weight_out` (optional) receives the weight.
int Embedding(GraphBuilder& b, const LayerContext& c, std::string_view name, int ids,
              int64_t num_embeddings, int64_t embedding_dim, int* weight_out = nullptr);

// The loss of a classifier or language model: logits [.., C] and int64 targets "labels" shaped
// like logits without the class dim, both reshaped to [N, C] / [N], then cross_entropy (mean),
// as `loss_fct(logits.view(-1, C), labels.view(-1))`; `upcast` casts the logits to float32
// first (HF's ForCausalLMLoss). Returns the loss.
int CrossEntropyLoss(GraphBuilder& b, int logits, bool upcast);

// ---------------------------------------------------------------------------------------------
// The layer-model front end: expands `spec` (a layer of the kinds listed above) applied to `x`
// under the builder's current scope and returns its output. `field` is where errors point
// ("model.layers[3]"). Errors of the spec (kind, attributes, input shape) are returned; errors
// of the ops (should a rule refuse a shape) stay in the builder, and the result is then -1.
StatusOr<int> ExpandLayer(GraphBuilder& b, int x, const LayerSpec& spec, const LayerContext& c,
                          const std::string& field);

// The kinds ExpandLayer knows, sorted.
const std::vector<std::string>& LayerKinds();

// F.scaled_dot_product_attention(q, k, v, ...) as the builders call it (Attention, Falcon's and
// OPT's cores): the kernel choice's inputs for q [N, H, T, hd] against `kv_heads` key-value heads
// of as many positions, in the dtype autocast gives q, causal as given, with `dropout` in
// training (0 otherwise).
SdpaParams SdpaCallOf(const GraphBuilder& b, const LayerContext& c, int q, int64_t kv_heads,
                      bool causal, double dropout);
// The core op, scaled_dot_product_attention(inputs) in scope "core", as `backend` runs it
// (fused unless the math kernel), is_causal and dropout_p from `p`; its output.
int SdpaCore(GraphBuilder& b, std::vector<int> inputs, SdpaBackend backend, const SdpaParams& p);

}  // namespace memest

#endif  // MEMEST_ENGINE_MODELS_LAYERS_H_
