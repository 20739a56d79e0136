// Rules for scaled_dot_product_attention(q [B, H, L, D], k [B, Hk, S, D], v [B, Hk, S, Dv],
// mask?; is_causal, dropout_p, fused, backend).
//
// fused=0 is the math form (_scaled_dot_product_attention_math): q and k^T are each scaled by
// sqrt(scale) into new tensors that bmm keeps, the causal mask is built as an [L, S] bool and
// float pair, softmax keeps its [.., L, S] result, dropout its bool mask and output.
//
// fused=1 is F.scaled_dot_product_attention as PyTorch 2.x dispatches it. attrs.backend names
// the CUDA kernel ("flash", "efficient", "cudnn", "math") where the front end chose it
// (engine/rules/sdpa_select.h, from config.attention and the device); without it (a traced graph)
// the kernel is chosen as PyTorch's default order would on an sm_90 device. What each kernel
// keeps, from its source (docs/op-rules.md, "Attention"):
//   flash      (flash_attn/flash_api.cpp mha_fwd / mha_bwd) the inputs, the output, softmax_lse
//              float32 [B, H, L], rng_state uint64 [2] and a 0-dim uint64 on the device (both
//              allocated with or without dropout). Backward: dq_accum float32 [B, L128, H, D32]
//              (L rounded up to 128, D to 32, or 64 above 128), softmax_d float32 [B, H, L128],
//              and for grouped-query attention dk/dv expanded to [B, S, H, D] before the sum.
//   efficient  (mem_eff_attention, _efficient_attention_forward / _backward) the inputs, the
//              output, logsumexp float32 [B, H, L32] (L rounded up to 32); a float32 output
//              accumulator [B, L, H, Dv] while it runs for half inputs with head dims above 128;
//              k and v repeated to H heads for grouped-query attention (its backward requires
//              equal heads); the philox seed and offset are host scalars. Backward: delta
//              float32 [B, H, L] and, for half inputs, a float32 dq accumulator [B, L, H, D].
//   cudnn      (cudnn/MHA.cpp) the inputs, the output, softmax statistics float32 [B, H, L, 1],
//              and with dropout a device seed and offset (int64 each). Backward: assumed (the
//              workspace is the cuDNN plan's) a float32 dq accumulator [B, H, L, D] and a float32
//              row sum [B, H, L], what a flash-style backward needs.
//   math       the math form above.
// None keeps an [L, S] matrix. On the cpu-1.13 runtime a fused op (from a 2.x trace) is
// _scaled_dot_product_flash_attention_for_cpu: logsumexp [.., L], the math form under dropout.
#include <algorithm>

#include "engine/ir/text.h"
#include "engine/rules/internal.h"
#include "engine/rules/sdpa_select.h"

namespace memest {
namespace rules {
namespace {

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

SdpaParams ParamsOf(const OpCall& c);
SdpaBackend CudaBackend(const OpCall& c, const SdpaParams& p);

// The cpu-1.13 runtime runs a 2.x trace's fused op as the math form under dropout with grad.
bool CpuRunsMath(const OpCall& c, const SdpaParams& p) { return p.dropout > 0 && c.grad_enabled; }

// The memory layout a fused op's output [B, H, L, Dv] has, as the kernel that runs it writes
// it. CUDA's memory-efficient kernel allocates [B, L, H, Dv] whatever the query's layout and
// returns it transposed (_efficient_attention_forward: at::empty({B, M, num_heads, Kv})), so
// nn.MultiheadAttention's permute(2, 0, 1, 3).contiguous() of it copies (measured on an H200,
// PyTorch 2.11: one [L, B, E] copy per layer that out_proj keeps). Flash (empty_like of
// q.transpose(1, 2)) and cuDNN (the query's layout) follow the query, and so does the CPU
// runtime's fused kernel (measured on a 2.x CPU: that permute copies nothing). The math form,
// which runs where no fused kernel can (and on the CPU runtime under dropout with grad), ends
// in matmul(attn, v): contiguous.
Strides FusedOutputStrides(const OpCall& c, const Shape& out) {
  const SdpaParams p = ParamsOf(c);
  if (c.runtime == Runtime::kCpuTorch113) {
    return CpuRunsMath(c, p) ? Strides{} : DenseStridesLike(c.in(0), out);
  }
  const SdpaBackend backend = CudaBackend(c, p);
  if (backend == SdpaBackend::kMath) return {};
  if (backend == SdpaBackend::kEfficient && out.size() == 4) {
    const int64_t h = out[1], l = out[2], dv = out[3];
    return Strides{l * h * dv, dv, h * dv, 1};
  }
  return DenseStridesLike(c.in(0), out);
}

StatusOr<std::vector<OutputSpec>> InferSdpa(const OpCall& c) {
  for (size_t i = 0; i < 3; ++i) {
    MEMEST_RETURN_IF_ERROR(RequireFloating(c, i));
    MEMEST_RETURN_IF_ERROR(RequireRank(c, i, 2, 8));
  }
  const Shape& q = c.in(0).shape;
  const Shape& k = c.in(1).shape;
  const Shape& v = c.in(2).shape;
  if (q.back() != k.back() || k[k.size() - 2] != v[v.size() - 2]) {
    return InvalidArgument(c.field + ".inputs: attention shapes q " + ShapeToString(q) + ", k " +
                           ShapeToString(k) + ", v " + ShapeToString(v) + " do not match");
  }
  // Grouped-query attention (enable_gqa): k and v may have fewer heads, dividing q's.
  if (q.size() == 4 && k.size() == 4 && v.size() == 4 &&
      (k[1] != v[1] || k[1] <= 0 || q[1] % k[1] != 0)) {
    return InvalidArgument(c.field + ".inputs: attention shapes q " + ShapeToString(q) + ", k " +
                           ShapeToString(k) + ", v " + ShapeToString(v) +
                           ": k and v need one number of heads that divides q's");
  }
  MEMEST_ASSIGN_OR_RETURN(double p, FloatAttr(c.op.attrs, "dropout_p", 0.0, c.field));
  if (p < 0 || p >= 1) return InvalidArgument(AttrField(c, "dropout_p") + ": must be in [0, 1)");
  MEMEST_RETURN_IF_ERROR(IntAttr(c.op.attrs, "is_causal", 0, c.field).status());
  MEMEST_ASSIGN_OR_RETURN(int64_t fused, IntAttr(c.op.attrs, "fused", 0, c.field));
  MEMEST_ASSIGN_OR_RETURN(std::string backend, StringAttr(c.op.attrs, "backend", "", c.field));
  if (!backend.empty() && !SdpaBackendFromName(backend)) {
    return InvalidArgument(AttrField(c, "backend") + ": unknown backend '" + Escape(backend) +
                           "'; expected flash, efficient, cudnn or math");
  }
  if (c.inputs.size() == 4) MEMEST_RETURN_IF_ERROR(RequireRank(c, 3, 2, 8));  // attn_mask
  // The math form materialises [.., L, S] scores (and an [L, S] causal mask): they must be
  // representable, which bounds every scratch SdpaMemory forms from them.
  Shape scores(q.begin(), q.end() - 1);
  scores.push_back(k[k.size() - 2]);
  MEMEST_RETURN_IF_ERROR(
      CheckedBytes(scores, c.in(0).dtype, c.field + ": its attention scores").status());
  Shape out = q;
  out.back() = v.back();
  OutputSpec spec{out, c.in(0).dtype};
  if (fused) spec.strides = FusedOutputStrides(c, out);
  return std::vector<OutputSpec>{spec};
}

// The call as sdp_utils sees it. Inputs of rank other than 4 are read as [.., L, D] with the
// leading dims folded into the batch.
SdpaParams ParamsOf(const OpCall& c) {
  const Shape& q = c.in(0).shape;
  const Shape& k = c.in(1).shape;
  const Shape& v = c.in(2).shape;
  SdpaParams p;
  p.dtype = c.in(0).dtype;
  p.q_len = q[q.size() - 2];
  p.kv_len = k[k.size() - 2];
  p.head_dim_qk = q.back();
  p.head_dim_v = v.back();
  if (q.size() == 4 && k.size() == 4) {
    p.batch = q[0];
    p.heads = q[1];
    p.kv_heads = k[1];
  } else {
    p.batch = Numel(Shape(q.begin(), q.end() - 2));
    p.heads = p.kv_heads = 1;
  }
  p.has_mask = c.inputs.size() == 4;
  p.is_causal = IntAttr(c.op.attrs, "is_causal", 0, c.field).value() != 0;
  p.dropout = FloatAttr(c.op.attrs, "dropout_p", 0.0, c.field).value();
  p.requires_grad = c.needs_grad(0) || c.needs_grad(1) || c.needs_grad(2);
  return p;
}

SdpaBackend CudaBackend(const OpCall& c, const SdpaParams& p) {
  const std::string name = StringAttr(c.op.attrs, "backend", "", c.field).value();
  if (std::optional<SdpaBackend> b = SdpaBackendFromName(name)) return *b;
  SdpaParams generic = p;
  generic.compute_capability = 90;
  StatusOr<SdpaBackend> b = SelectSdpaBackend(generic, AttentionImpl::kSdpa);
  return b.ok() ? *b : SdpaBackend::kMath;
}

void Keep(OpMemory* m, bool grad, const Alloc& a) {
  (grad ? m->saved_extras : m->forward_temps).push_back(a);
}

// The CUDA kernels (not math): what they keep and what their backward allocates.
void CudaFusedMemory(const OpCall& c, const SdpaParams& p, SdpaBackend backend, OpMemory* m) {
  const bool grad = p.requires_grad;
  const Tensor& q = c.in(0);
  const int64_t B = p.batch, H = p.heads, L = p.q_len, S = p.kv_len;
  const int64_t D = p.head_dim_qk, Dv = p.head_dim_v;
  const bool half = q.dtype == DType::kFloat16 || q.dtype == DType::kBFloat16;
  const bool gqa = p.kv_heads != p.heads;
  if (grad) {
    m->saved_inputs = {0, 1, 2};
    if (p.has_mask) m->saved_inputs.push_back(3);
    m->saved_outputs.push_back(0);
  }
  switch (backend) {
    case SdpaBackend::kFlash: {
      Keep(m, grad, AllocOf({B, H, L}, DType::kFloat32, "softmax_lse"));
      Keep(m, grad, Alloc{16, "rng_state (uint64 [2])"});
      Keep(m, grad, Alloc{8, "unused philox offset (uint64)"});
      if (!grad) return;
      const int64_t d_rounded = RoundUp(RoundUp(D, 8), D <= 128 ? 32 : 64);
      m->backward_temps.push_back(
          AllocOf({B, RoundUp(L, 128), H, d_rounded}, DType::kFloat32, "dq_accum"));
      m->backward_temps.push_back(
          AllocOf({B, H, RoundUp(L, 128)}, DType::kFloat32, "softmax_d"));
      if (gqa) {
        m->backward_temps.push_back(AllocOf({B, S, H, D}, q.dtype, "dk expanded to every head"));
        m->backward_temps.push_back(AllocOf({B, S, H, Dv}, q.dtype, "dv expanded to every head"));
      }
      return;
    }
    case SdpaBackend::kEfficient: {
      if (gqa) {  // k and v repeated to every head; the repeats are what the kernel keeps
        if (grad) m->saved_inputs = {0};
        if (grad && p.has_mask) m->saved_inputs.push_back(3);
        Keep(m, grad, AllocOf({B, H, S, D}, q.dtype, "k repeated to every head"));
        Keep(m, grad, AllocOf({B, H, S, Dv}, c.in(2).dtype, "v repeated to every head"));
      }
      if (half && std::max(D, Dv) > 128) {
        m->forward_temps.push_back(AllocOf({B, L, H, Dv}, DType::kFloat32, "output_accum"));
      }
      if (!grad) return;  // compute_log_sumexp is false: a logsumexp of 0 rows
      m->saved_extras.push_back(AllocOf({B, H, RoundUp(L, 32)}, DType::kFloat32, "logsumexp"));
      m->backward_temps.push_back(AllocOf({B, H, L}, DType::kFloat32, "delta"));
      if (half) {
        m->backward_temps.push_back(AllocOf({B, L, H, D}, DType::kFloat32, "grad_q accumulator"));
      }
      return;
    }
    case SdpaBackend::kCudnn: {
      if (grad) m->saved_extras.push_back(AllocOf({B, H, L, 1}, DType::kFloat32, "softmax stats"));
      if (p.dropout > 0) {
        Keep(m, grad, Alloc{8, "philox seed (int64)"});
        Keep(m, grad, Alloc{8, "philox offset (int64)"});
      }
      if (!grad) return;
      m->backward_temps.push_back(AllocOf({B, H, L, D}, DType::kFloat32, "dq accumulator"));
      m->backward_temps.push_back(AllocOf({B, H, L}, DType::kFloat32, "softmax sum"));
      return;
    }
    case SdpaBackend::kMath:
      return;
  }
}

// PyTorch 2.x's CPU flash kernel, for a fused op under the cpu-1.13 runtime (a 2.x trace).
void CpuFusedMemory(const OpCall& c, const SdpaParams& p, OpMemory* m) {
  Shape rows(c.in(0).shape.begin(), c.in(0).shape.end() - 1);  // [.., L]
  const Alloc lse = AllocOf(rows, DType::kFloat32, "logsumexp");
  if (!p.requires_grad) {
    m->forward_temps.push_back(lse);
    return;
  }
  m->saved_inputs = {0, 1, 2};
  if (p.has_mask) m->saved_inputs.push_back(3);
  m->saved_outputs.push_back(0);
  m->saved_extras.push_back(lse);
}

// True when a fused kernel runs the call (its memory is then in `m`); false for the math form.
bool FusedSdpa(const OpCall& c, OpMemory* m) {
  if (!IntAttr(c.op.attrs, "fused", 0, c.field).value()) return false;
  const SdpaParams p = ParamsOf(c);
  if (c.runtime == Runtime::kCpuTorch113) {
    if (CpuRunsMath(c, p)) return false;
    CpuFusedMemory(c, p, m);
    return true;
  }
  const SdpaBackend backend = CudaBackend(c, p);
  if (backend == SdpaBackend::kMath) return false;
  CudaFusedMemory(c, p, backend, m);
  return true;
}

void SdpaMemory(const OpCall& c, OpMemory* m) {
  if (FusedSdpa(c, m)) return;
  const Tensor& q = c.in(0);
  const Tensor& k = c.in(1);
  Shape scores(q.shape.begin(), q.shape.end() - 1);
  scores.push_back(k.shape[k.shape.size() - 2]);
  const int64_t L = q.shape[q.shape.size() - 2], S = scores.back();
  const int64_t score_bytes = Bytes(scores, q.dtype);
  const double p = FloatAttr(c.op.attrs, "dropout_p", 0.0, c.field).value();
  const bool causal = IntAttr(c.op.attrs, "is_causal", 0, c.field).value() != 0;
  const bool grad = c.needs_grad(0) || c.needs_grad(1) || c.needs_grad(2);
  if (causal) {
    m->forward_temps.push_back(Alloc{L * S, "causal mask (bool)"});
    m->forward_temps.push_back(Alloc{L * S * DTypeSize(q.dtype), "causal mask (additive)"});
  }
  Alloc q_scaled{BytesOf(q), "q * sqrt(scale)"};
  Alloc k_scaled{BytesOf(k), "k^T * sqrt(scale)"};
  Alloc probs{score_bytes, "softmax(scores)"};
  if (!grad) {
    for (Alloc a : {q_scaled, k_scaled, probs}) m->forward_temps.push_back(a);
    m->forward_temps.push_back(Alloc{score_bytes, "scores"});
    return;
  }
  m->saved_extras = {q_scaled, k_scaled, probs};
  m->saved_inputs.push_back(2);
  if (p > 0) {
    m->saved_extras.push_back(Alloc{Numel(scores), "dropout mask"});
    m->saved_extras.push_back(Alloc{score_bytes, "dropout(softmax)"});
  } else {
    m->forward_temps.push_back(Alloc{score_bytes, "scores before softmax"});
  }
  m->backward_temps.push_back(Alloc{2 * score_bytes, "grad of probabilities and scores"});
}

}  // namespace

void RegisterAttentionRules(std::vector<OpRule>* r) {
  r->push_back({"scaled_dot_product_attention", 3, 4, InferSdpa, SdpaMemory});
}

}  // namespace rules
}  // namespace memest
