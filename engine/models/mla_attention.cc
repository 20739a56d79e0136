// DeepSeek's multi-head latent attention as transformers 4.57's DeepseekV3Attention.forward runs
// it (engine/models/layers.h, MlaOptions): the projections through the low-rank latents, the
// rotary part of q and of the one key every head shares, and the same cores as Attention's.
#include <string>
#include <vector>

#include "engine/models/layers.h"
#include "engine/models/layers_internal.h"

namespace memest {

using namespace layers_internal;  // NOLINT: the helpers every layer uses

namespace {

// apply_rotary_pos_emb_interleave's reordering of x [N, H, T, r]: view(N, H, T, r / 2, 2),
// transpose(4, 3), reshape(N, H, T, r), which copies.
int Deinterleave(GraphBuilder& b, int x) {
  if (!b.ok() || x < 0) return -1;
  const Shape s = b.shape(x);
  int v = b.Add1("view", {x}, {{"shape", Ints({s[0], s[1], s[2], s[3] / 2, 2})}});
  v = b.Add1("transpose", {v}, {{"dim0", Int(4)}, {"dim1", Int(3)}});
  return b.Add1("reshape", {v}, {{"shape", Ints({s[0], s[1], s[2], s[3]})}});
}

// vLLM's MultiHeadLatentAttentionWrapper.forward (0.19, model_executor/layers/mla.py) in the
// profile run: fused_qkv_a_proj (q_a_proj and kv_a_proj_with_mqa as one replicated linear) or
// kv_a_proj_with_mqa and q_proj; the norms; kv_b_proj's weight (over no token: the profile
// does not up-project); the rotary in place (no op); MLAAttention with no
// metadata (mla_profile_attention: its output and the chunked prefill's placeholder, which
// tensor parallelism cuts by heads as q is); o_proj.
int VllmMla(GraphBuilder& b, const LayerContext& c, int x, const AttentionOptions& o,
            const MlaOptions& m) {
  const Shape in = b.shape(x);
  const int64_t n = in[0], t = in[1], d = in[2], heads = o.heads;
  const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim,
                latent = m.kv_lora_rank + m.qk_rope_head_dim;
  if (c.mla_workspace_rows <= 0) {
    b.Fail(Internal("attention: vLLM's latent attention needs its chunked-prefill workspace rows"));
    return -1;
  }
  int q = -1, kv_lora = -1;
  if (m.q_lora_rank > 0) {
    const int qkv = Linear(b, c, "fused_qkv_a_proj", x, m.q_lora_rank + latent, o.bias);
    std::vector<int> parts =
        b.Add("split", {qkv}, {{"dim", Int(2)}, {"sizes", Ints({m.q_lora_rank, latent})}});
    if (parts.size() != 2) return -1;
    kv_lora = parts[1];
    q = Linear(b, c, "q_b_proj", RmsNorm(b, c, "q_a_layernorm", parts[0], true), heads * qk,
               /*bias=*/false);
  } else {
    kv_lora = Linear(b, c, "kv_a_proj_with_mqa", x, latent, o.bias);
    q = Linear(b, c, "q_proj", x, heads * qk, /*bias=*/false);
  }
  std::vector<int> kv = b.Add(
      "split", {kv_lora}, {{"dim", Int(2)}, {"sizes", Ints({m.kv_lora_rank, m.qk_rope_head_dim})}});
  if (kv.size() != 2) return -1;
  const int kv_c_normed = RmsNorm(b, c, "kv_a_layernorm", kv[0], true);
  {
    // kv_b_proj, which the profile does not run (the prefill's up-projection): its weight, over
    // no token, for the passes that split and quantize it.
    const int none =
        b.Add1("slice", {kv_c_normed}, {{"dim", Int(1)}, {"start", Int(0)}, {"end", Int(0)}});
    Linear(b, c, "kv_b_proj", none, heads * (m.qk_nope_head_dim + m.v_head_dim), false);
  }
  q = b.Add1("view", {q}, {{"shape", Ints({n, t, heads, qk})}});
  const int k_pe = b.Add1("unsqueeze", {kv[1]}, {{"dim", Int(2)}});
  int out = -1;
  {
    ModuleScope core(b, "mla_attn");
    out = b.Add1("mla_profile_attention", {q, kv_c_normed, k_pe},
                 {{"workspace_rows", Int(c.mla_workspace_rows)},
                  {"v_head_dim", Int(m.v_head_dim)},
                  {"kv_head_dim", Int(m.qk_nope_head_dim + m.v_head_dim)}});
  }
  out = b.Add1("view", {out}, {{"shape", Ints({n, t, heads * m.v_head_dim})}});
  return Linear(b, c, "o_proj", out, d, o.out_bias.value_or(o.bias));
}

}  // namespace

int layers_internal::MlaAttention(GraphBuilder& b, const LayerContext& c, std::string_view name,
                                  int x, const AttentionOptions& o, int* weights_out) {
  if (!ExpectRank(b, x, 3, "attention")) return -1;
  const MlaOptions& m = *o.mla;
  const Shape in = b.shape(x);
  const int64_t n = in[0], t = in[1], d = in[2], heads = o.heads;
  const int64_t nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim;
  const int64_t qk = nope + rope, vd = m.v_head_dim;
  if (heads <= 0 || m.kv_lora_rank <= 0 || nope <= 0 || rope <= 0 || rope % 2 != 0 || vd <= 0 ||
      m.q_lora_rank < 0) {
    b.Fail(
        Internal("attention: latent attention needs positive heads, kv_lora_rank and head "
                 "dims, and an even qk_rope_head_dim"));
    return -1;
  }
  ModuleScope scope(b, name);
  if (c.vllm && !c.training()) return VllmMla(b, c, x, o, m);
  int q_states = -1;
  if (m.q_lora_rank == 0) {
    q_states = Linear(b, c, "q_proj", x, heads * qk, /*bias=*/false);
  } else {
    q_states = Linear(b, c, "q_a_proj", x, m.q_lora_rank, o.bias);
    q_states = RmsNorm(b, c, "q_a_layernorm", q_states, /*upcast=*/true);
    q_states = Linear(b, c, "q_b_proj", q_states, heads * qk, /*bias=*/false);
  }
  q_states = b.Add1("view", {q_states}, {{"shape", Ints({n, t, heads, qk})}});
  q_states = b.Add1("transpose", {q_states}, {{"dim0", Int(1)}, {"dim1", Int(2)}});
  std::vector<int> q = b.Add("split", {q_states}, {{"dim", Int(3)}, {"sizes", Ints({nope, rope})}});

  const int compressed_kv = Linear(b, c, "kv_a_proj_with_mqa", x, m.kv_lora_rank + rope, o.bias);
  std::vector<int> kv =
      b.Add("split", {compressed_kv}, {{"dim", Int(2)}, {"sizes", Ints({m.kv_lora_rank, rope})}});
  if (q.size() != 2 || kv.size() != 2) return -1;
  int k_pass = RmsNorm(b, c, "kv_a_layernorm", kv[0], /*upcast=*/true);
  k_pass = Linear(b, c, "kv_b_proj", k_pass, heads * (nope + vd), /*bias=*/false);
  k_pass = b.Add1("view", {k_pass}, {{"shape", Ints({n, t, heads, nope + vd})}});
  k_pass = b.Add1("transpose", {k_pass}, {{"dim0", Int(1)}, {"dim1", Int(2)}});
  std::vector<int> kpv = b.Add("split", {k_pass}, {{"dim", Int(3)}, {"sizes", Ints({nope, vd})}});
  if (kpv.size() != 2) return -1;
  int value = kpv[1];
  int k_rot = b.Add1("view", {kv[1]}, {{"shape", Ints({n, 1, t, rope})}});

  int q_rot = q[1];
  if (o.rotary_cos >= 0 && o.rotary_sin >= 0) {
    const int cos = b.Add1("unsqueeze", {o.rotary_cos}, {{"dim", Int(1)}});
    const int sin = b.Add1("unsqueeze", {o.rotary_sin}, {{"dim", Int(1)}});
    if (m.rope_interleave) {
      q_rot = Deinterleave(b, q_rot);
      k_rot = Deinterleave(b, k_rot);
    }
    q_rot = ApplyRotary(b, q_rot, cos, sin);
    k_rot = ApplyRotary(b, k_rot, cos, sin);
  }
  const int k_rot_all = b.Add1("expand", {k_rot}, {{"shape", Ints({n, heads, t, rope})}});
  const int query = b.Add1("cat", {q[0], q_rot}, {{"dim", Int(3)}});
  const int key = b.Add1("cat", {kpv[0], k_rot_all}, {{"dim", Int(3)}});
  // DynamicCache.update(key_states, value_states): every head's key and value, not the latents.
  AttentionCache(b, c, key, value, n, heads, o.kv_cache_len, qk, vd);
  AttentionDims dims{n, t, d, heads, heads, qk};
  if (c.attention == AttentionImpl::kFlash && qk != vd) {
    // F.pad(value_states, [0, qk_head_dim - v_head_dim]); the output sliced back after.
    value = b.Add1("pad", {value}, {{"pad", Ints({0, qk - vd})}});
    dims.keep_dim = vd;
  }
  AttentionOptions core = o;
  core.scale = AttentionScale::kMultiplyScores;
  core.softmax_fp32 = true;
  core.names = {"", "", "", "o_proj"};
  const int out = AttendAndProject(b, c, x, query, key, value, dims, core, weights_out);
  if (o.hold_locals) {  // the forward's locals until it returns
    for (int local : {q_states, q[0], q_rot, compressed_kv, k_pass, kpv[0], value, k_rot_all}) {
      b.HoldUntilLastOp(local);
    }
  }
  return out;
}

}  // namespace memest
