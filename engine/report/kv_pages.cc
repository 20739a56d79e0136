// vLLM's KV cache pages and groups (engine/report/kv_pages.h).
#include "engine/report/kv_pages.h"

#include <algorithm>
#include <map>

#include "engine/ir/shape.h"

namespace memest {
namespace {

// The tokens a layer of `window` keeps for a request of `tokens` (max_memory_usage_bytes).
int64_t BlocksOf(int64_t window, int64_t tokens, int64_t block_size, int64_t batched) {
  if (window == 0) return CeilDiv(tokens, block_size);
  return CeilDiv(std::min(window - 1 + batched, tokens), block_size) + 1;
}

}  // namespace

StatusOr<KvPages> KvPages::Make(const std::vector<KvLayer>& layers, int64_t block_size,
                                int64_t batched_tokens) {
  if (layers.empty()) return InvalidArgument("model: has no attention KV cache to serve from");
  KvPages p;
  p.block_size_ = block_size;
  p.batched_tokens_ = batched_tokens;
  p.layers_ = layers;
  std::map<int64_t, int64_t> kinds;  // window -> layers
  bool uniform = true;
  for (const KvLayer& l : layers) {
    if (!AddBytes(&p.bytes_per_token_, l.bytes_per_token)) {
      return InvalidArgument("model: its KV cache's bytes a token overflow");
    }
    ++kinds[l.window];
    uniform = uniform && l.bytes_per_token == layers[0].bytes_per_token;
  }
  if (kinds.size() == 1 || !uniform) {
    p.group_windows_ = {kinds.size() == 1 ? kinds.begin()->first : 0};
    MEMEST_ASSIGN_OR_RETURN(p.block_bytes_, CheckedMul(p.bytes_per_token_, block_size));
    return p;
  }
  int64_t group_size = static_cast<int64_t>(layers.size());
  for (const auto& [window, count] : kinds) group_size = std::min(group_size, count);
  for (const auto& [window, count] : kinds) {
    const int64_t groups = CeilDiv(count, group_size);
    p.padding_ += groups * group_size - count;
    for (int64_t g = 0; g < groups; ++g) p.group_windows_.push_back(window);
  }
  // group_size tensors of num_blocks pages, each shared by one layer of every group: a block id
  // is one group's pages (get_kv_cache_config_from_groups).
  MEMEST_ASSIGN_OR_RETURN(int64_t page, CheckedMul(layers[0].bytes_per_token, block_size));
  MEMEST_ASSIGN_OR_RETURN(p.block_bytes_, CheckedMul(page, group_size));
  return p;
}

bool KvPages::sliding() const {
  return std::any_of(group_windows_.begin(), group_windows_.end(),
                     [](int64_t w) { return w > 0; });
}

int64_t KvPages::Blocks(int64_t kv_bytes) const {
  return kv_bytes > 0 ? kv_bytes / block_bytes_ : 0;
}

int64_t KvPages::Tokens(int64_t blocks) const { return blocks / groups() * block_size_; }

int64_t KvPages::BlocksPerRequest(int64_t tokens) const {
  int64_t blocks = 0;
  for (int64_t window : group_windows_) {
    blocks += BlocksOf(window, tokens, block_size_, batched_tokens_);
  }
  return blocks;
}

int64_t KvPages::NeededBytes(int64_t tokens) const {
  int64_t bytes = 0;
  for (const KvLayer& l : layers_) {
    const int64_t pages = BlocksOf(l.window, tokens, block_size_, batched_tokens_);
    StatusOr<int64_t> layer = CheckedMul(pages * block_size_, l.bytes_per_token);
    if (!layer.ok() || !AddBytes(&bytes, *layer)) return kMaxBytes;  // more than any GPU holds
  }
  return bytes;
}

}  // namespace memest
