// vLLM's paged KV cache on one GPU (v1/kv_cache_interface.py, v1/core/kv_cache_utils.py; read at
// 0.11-0.19): the layers' pages, how its KV cache manager groups them, and how many blocks a
// request of some length takes. For engine/report/serving.cc.
//
// A page is block_size tokens of one layer's keys and values. Layers of one kind (all full
// attention, or all one sliding window) form one group whose block holds a page of every layer.
// Full-attention and sliding-window layers of one page size (Gemma 2 and 3) form groups of
// group_size layers, group_size the fewest layers of a kind, each kind padded to whole groups
// ("Add N padding layers"); every group draws its blocks from one pool, a block holding a page
// of each of a group's layers, so the full-attention tokens the pool holds are its blocks over
// the groups. A full-attention group needs ceil(tokens / block_size) blocks for a
// request; a sliding-window group ceil(min(window - 1 + max_num_batched_tokens, tokens) /
// block_size) + 1.
#ifndef MEMEST_ENGINE_REPORT_KV_PAGES_H_
#define MEMEST_ENGINE_REPORT_KV_PAGES_H_

#include <cstdint>
#include <vector>

#include "engine/ir/status.h"

namespace memest {

struct KvLayer {
  int64_t bytes_per_token = 0;  // keys and values of one token, on this GPU
  int64_t window = 0;           // sliding window in tokens; 0: full attention
};

class KvPages {
 public:
  // Refuses no layers and byte counts that overflow (naming "model"); layers of several kinds
  // with different page sizes are grouped as one kind (vLLM would refuse or unify them).
  static StatusOr<KvPages> Make(const std::vector<KvLayer>& layers, int64_t block_size,
                                int64_t batched_tokens);

  int64_t bytes_per_token() const { return bytes_per_token_; }  // every layer, unpadded
  int64_t groups() const { return static_cast<int64_t>(group_windows_.size()); }
  int64_t padding_layers() const { return padding_; }
  bool sliding() const;  // any group with a window
  // Blocks `kv_bytes` holds (get_num_blocks); 0 when it is not positive.
  int64_t Blocks(int64_t kv_bytes) const;
  // "GPU KV cache size": blocks / groups * block_size tokens.
  int64_t Tokens(int64_t blocks) const;
  // Blocks one request of `tokens` takes over every group.
  int64_t BlocksPerRequest(int64_t tokens) const;
  // What check_enough_kv_cache_memory wants for one request of `tokens`: each layer's pages,
  // unpadded; kMaxBytes when that does not fit in 64 bits.
  int64_t NeededBytes(int64_t tokens) const;

 private:
  int64_t block_size_ = 16;
  int64_t batched_tokens_ = 0;
  int64_t bytes_per_token_ = 0;
  int64_t block_bytes_ = 0;  // one block id: a page of each layer of one group
  int64_t padding_ = 0;
  std::vector<int64_t> group_windows_;
  std::vector<KvLayer> layers_;
};

}  // namespace memest

#endif  // MEMEST_ENGINE_REPORT_KV_PAGES_H_
