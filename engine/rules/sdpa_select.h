// Which kernel torch.nn.functional.scaled_dot_product_attention runs on CUDA, as PyTorch 2.x
// chooses it (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, select_sdp_backend): each
// backend has a list of constraints (dtype, head dim, mask, device generation, ...); the first
// backend of the priority order whose constraints all pass runs. The default order
// (aten/src/ATen/Context.h, sdp_priority_order) is flash, memory-efficient, math, cuDNN: math
// always passes, so cuDNN runs only where PyTorch moves it to the front (priority_order():
// sm_90/sm_100 with cuDNN newer than 9.15, or sdpa_kernel([CUDNN_ATTENTION])).
//
// The backends keep different tensors for backward (docs/op-rules.md, "Attention"): flash a
// float32 logsumexp [B, H, L] and a device RNG state; memory-efficient a logsumexp padded to a
// multiple of 32 rows; cuDNN its softmax statistics [B, H, L, 1]; math the [L, S]
// probabilities. The op rule (engine/rules/attention.cc) models each.
#ifndef MEMEST_ENGINE_RULES_SDPA_SELECT_H_
#define MEMEST_ENGINE_RULES_SDPA_SELECT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "engine/ir/config.h"
#include "engine/ir/dtype.h"
#include "engine/ir/status.h"

namespace memest {

enum class SdpaBackend { kMath, kFlash, kEfficient, kCudnn };

// One call, as sdp_params sees it: q [batch, heads, q_len, head_dim_qk], k [batch, kv_heads,
// kv_len, head_dim_qk], v [batch, kv_heads, kv_len, head_dim_v] (kv_heads < heads: grouped-query
// attention, enable_gqa=True).
struct SdpaParams {
  DType dtype = DType::kFloat32;
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t kv_heads = 1;
  int64_t q_len = 1;
  int64_t kv_len = 1;
  int64_t head_dim_qk = 64;
  int64_t head_dim_v = 64;
  bool has_mask = false;  // an attn_mask tensor (is_causal needs none)
  bool is_causal = false;
  double dropout = 0.0;
  bool requires_grad = true;
  int compute_capability = 90;  // 10 * major + minor, as cudaDeviceProp reports it
};

// Why `backend` cannot run the call (the constraint that fails, in sdp_utils' words), or "" when
// it can. Math can run every call.
std::string SdpaIneligible(const SdpaParams& p, SdpaBackend backend);

// The backend that runs the call under `impl`:
//   kSdpa          flash, memory-efficient, math (PyTorch's default order);
//   kCudnn         cuDNN, flash, memory-efficient, math (its order where it prefers cuDNN);
//   kFlash         flash, or INVALID_ARGUMENT naming config.attention and the constraint that
//                  fails (sdpa_kernel(FLASH_ATTENTION) raises "No available kernel"; HF's
//                  flash_attention_2 refuses float32 too);
//   kMemEfficient  memory-efficient, or INVALID_ARGUMENT likewise.
// kEager and kDefault are not SDPA: INVALID_ARGUMENT.
StatusOr<SdpaBackend> SelectSdpaBackend(const SdpaParams& p, AttentionImpl impl);

// "math", "flash", "efficient", "cudnn" (the op attribute `backend`), and back.
const char* SdpaBackendName(SdpaBackend b);
std::optional<SdpaBackend> SdpaBackendFromName(std::string_view name);

}  // namespace memest

#endif  // MEMEST_ENGINE_RULES_SDPA_SELECT_H_
