// The constraints are those of sdp_utils.cpp (PyTorch main, 2.x): can_use_flash_attention,
// can_use_mem_efficient_attention, can_use_cudnn_attention and the checks they list. Checks
// that a dense batch of ordinary tensors always passes (nested tensors, stride(-1) == 1, zero
// sequence lengths, runtime switches) are left out.
#include "engine/rules/sdpa_select.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace memest {
namespace {

bool IsHalf(DType d) { return d == DType::kFloat16 || d == DType::kBFloat16; }

std::string Sm(int cc) { return "sm_" + std::to_string(cc); }

// minimum_gemm_alignment: tensor cores (sm_80+, or sm_7x for half) need 128-bit rows.
int64_t GemmAlignment(const SdpaParams& p) {
  const bool half = IsHalf(p.dtype);
  const bool tensor_cores = p.compute_capability >= 80 || (p.compute_capability >= 70 && half);
  int64_t align = p.compute_capability >= 80 ? 4 : 1;
  if (tensor_cores) align = std::max<int64_t>(align, 128 / (half ? 16 : 32));
  return align;
}

std::string FlashIneligible(const SdpaParams& p) {
  const int cc = p.compute_capability;
  if (cc < 80 || cc > 121) {
    return "flash attention only supports sm_80 to sm_121, the device is " + Sm(cc);
  }
  if (p.has_mask) return "flash attention does not support an attn_mask";
  if (!IsHalf(p.dtype)) {
    return std::string("flash attention takes float16 or bfloat16, the inputs are ") +
           std::string(DTypeName(p.dtype));
  }
  if (p.head_dim_qk != p.head_dim_v || p.head_dim_qk > 256) {
    return "flash attention needs q, k and v of one head dim of at most 256, got " +
           std::to_string(p.head_dim_qk) + " and " + std::to_string(p.head_dim_v);
  }
  // check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120
  const bool consumer = (cc >= 86 && cc <= 89) || cc == 120 || cc == 121;
  if (consumer && p.requires_grad && p.head_dim_qk > 192 &&
      (p.head_dim_qk <= 224 || p.dropout > 0)) {
    return "flash attention's backward on " + Sm(cc) + " does not take head dim " +
           std::to_string(p.head_dim_qk) + (p.dropout > 0 ? " with dropout" : "");
  }
  if (p.is_causal && p.q_len != p.kv_len) {
    return "flash attention does not support is_causal with a query length (" +
           std::to_string(p.q_len) + ") other than the key length (" + std::to_string(p.kv_len) +
           ")";
  }
  return "";
}

std::string EfficientIneligible(const SdpaParams& p) {
  const int cc = p.compute_capability;
  if (cc < 50 || cc > 121) {
    return "memory-efficient attention only supports sm_50 to sm_121, the device is " + Sm(cc);
  }
  const bool dtype_ok = p.dtype == DType::kFloat16 || p.dtype == DType::kFloat32 ||
                        (cc >= 80 && p.dtype == DType::kBFloat16);
  if (!dtype_ok) {
    return std::string("memory-efficient attention on ") + Sm(cc) + " does not take " +
           std::string(DTypeName(p.dtype));
  }
  const int64_t align = GemmAlignment(p);
  if (p.head_dim_qk % align != 0 || p.head_dim_v % align != 0) {
    return "memory-efficient attention needs head dims divisible by " + std::to_string(align) +
           ", got " + std::to_string(p.head_dim_qk) + " and " + std::to_string(p.head_dim_v);
  }
  return "";
}

std::string CudnnIneligible(const SdpaParams& p) {
  const int cc = p.compute_capability;
  if (cc < 80 || cc > 121) {
    return "cuDNN attention only supports sm_80 to sm_121, the device is " + Sm(cc);
  }
  if (!IsHalf(p.dtype)) {
    return std::string("cuDNN attention takes float16 or bfloat16, the inputs are ") +
           std::string(DTypeName(p.dtype));
  }
  if (p.dropout * 16.0 != std::floor(p.dropout * 16.0)) {
    return "cuDNN attention's dropout must be a multiple of 1/16";
  }
  if (p.batch > 65535 || p.heads > 65535) {
    return "cuDNN attention takes at most 65535 samples and heads";
  }
  // check_cudnn_tensor_shapes: head dims of at most 128 (256 on sm_90/sm_100 only with cuDNN
  // newer than 9.22, later than the wheels of PyTorch 2.5 to 2.9 ship), multiples of 8.
  if (p.head_dim_qk > 128 || p.head_dim_v > 128) {
    return "cuDNN attention takes head dims of at most 128, got " + std::to_string(p.head_dim_qk);
  }
  if (p.head_dim_qk % 8 != 0 || p.head_dim_v % 8 != 0) {
    return "cuDNN attention needs head dims that are multiples of 8";
  }
  if (p.kv_len == 1) return "cuDNN attention does not take a key length of 1";
  if (p.dropout > 0 && p.q_len == 1) {
    return "cuDNN attention does not take a query length of 1 with dropout";
  }
  return "";
}

}  // namespace

std::string SdpaIneligible(const SdpaParams& p, SdpaBackend backend) {
  switch (backend) {
    case SdpaBackend::kMath: return "";
    case SdpaBackend::kFlash: return FlashIneligible(p);
    case SdpaBackend::kEfficient: return EfficientIneligible(p);
    case SdpaBackend::kCudnn: return CudnnIneligible(p);
  }
  return "unknown backend";
}

StatusOr<SdpaBackend> SelectSdpaBackend(const SdpaParams& p, AttentionImpl impl) {
  std::vector<SdpaBackend> order;
  switch (impl) {
    case AttentionImpl::kSdpa:
      order = {SdpaBackend::kFlash, SdpaBackend::kEfficient, SdpaBackend::kMath};
      break;
    case AttentionImpl::kCudnn:
      order = {SdpaBackend::kCudnn, SdpaBackend::kFlash, SdpaBackend::kEfficient,
               SdpaBackend::kMath};
      break;
    case AttentionImpl::kFlash:
      order = {SdpaBackend::kFlash};
      break;
    case AttentionImpl::kMemEfficient:
      order = {SdpaBackend::kEfficient};
      break;
    case AttentionImpl::kEager:
    case AttentionImpl::kDefault:
      return InvalidArgument(std::string("config.attention: ") + AttentionImplName(impl) +
                             " is not a scaled_dot_product_attention backend");
  }
  for (SdpaBackend b : order) {
    if (SdpaIneligible(p, b).empty()) return b;
  }
  return InvalidArgument(std::string("config.attention: ") + AttentionImplName(impl) +
                         " cannot run this attention: " + SdpaIneligible(p, order.front()) +
                         "; choose sdpa to let PyTorch fall back to another kernel");
}

const char* SdpaBackendName(SdpaBackend b) {
  switch (b) {
    case SdpaBackend::kMath: return "math";
    case SdpaBackend::kFlash: return "flash";
    case SdpaBackend::kEfficient: return "efficient";
    case SdpaBackend::kCudnn: return "cudnn";
  }
  return "?";
}

std::optional<SdpaBackend> SdpaBackendFromName(std::string_view name) {
  for (SdpaBackend b : {SdpaBackend::kMath, SdpaBackend::kFlash, SdpaBackend::kEfficient,
                        SdpaBackend::kCudnn}) {
    if (name == SdpaBackendName(b)) return b;
  }
  return std::nullopt;
}

}  // namespace memest
