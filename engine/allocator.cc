#include "engine/allocator.h"

#include <algorithm>

#include "engine/shape.h"

namespace memest {
namespace {

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

int64_t CachingAllocatorModel::RoundSize(int64_t bytes) {
  return bytes < kMinBlockSize ? kMinBlockSize : RoundUp(bytes, kMinBlockSize);
}

int64_t CachingAllocatorModel::SegmentSize(int64_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return RoundUp(size, kRoundLarge);
}

int CachingAllocatorModel::NewBlock(const Block& b) {
  if (!free_ids_.empty()) {
    int id = free_ids_.back();
    free_ids_.pop_back();
    blocks_[id] = b;
    return id;
  }
  blocks_.push_back(b);
  return static_cast<int>(blocks_.size()) - 1;
}

void CachingAllocatorModel::InsertFree(int id) {
  const Block& b = blocks_[id];
  Pool(b.small).emplace(b.size, b.addr, id);
}

void CachingAllocatorModel::EraseFree(int id) {
  const Block& b = blocks_[id];
  Pool(b.small).erase({b.size, b.addr, id});
}

CachingAllocatorModel::Location CachingAllocatorModel::Locate(int handle) const {
  const Block& b = blocks_[handle];
  return {b.segment, b.addr - segment_start_[b.segment]};
}

int64_t CachingAllocatorModel::GrowthFor(bool small, int64_t size) const {
  const int64_t page = small ? kSmallBuffer : kLargeBuffer;
  if (expandable_ && last_block_[small] >= 0) {
    const Block& b = blocks_[last_block_[small]];
    return RoundUp(size - (b.allocated ? 0 : b.size), page);
  }
  return expandable_ ? RoundUp(size, page) : SegmentSize(size);
}

int CachingAllocatorModel::Grow(bool small, int64_t size) {
  const int64_t grow = GrowthFor(small, size);
  reserved_ += grow;
  if (expandable_ && last_block_[small] >= 0) {
    const int last = last_block_[small];
    Block& b = blocks_[last];
    if (!b.allocated) {
      EraseFree(last);
      b.size += grow;
      InsertFree(last);
      return last;
    }
    Block nb;
    nb.addr = b.addr + b.size;
    nb.size = grow;
    nb.small = small;
    nb.segment = b.segment;
    nb.prev = last;
    const int id = NewBlock(nb);
    blocks_[last].next = id;
    last_block_[small] = id;
    InsertFree(id);
    return id;
  }
  Block nb;
  nb.addr = next_addr_;
  nb.size = grow;
  nb.small = small;
  nb.segment = segments_;
  segment_start_.push_back(nb.addr);
  segment_size_.push_back(nb.size);
  next_addr_ += nb.size;
  ++segments_;
  const int id = NewBlock(nb);
  if (expandable_) last_block_[small] = id;
  InsertFree(id);
  return id;
}

int CachingAllocatorModel::Malloc(int64_t bytes) {
  if (bytes < 0 || bytes > kMaxBytes) return -1;
  const int64_t size = RoundSize(bytes);
  const bool small = size <= kSmallSize;
  FreeSet& pool = Pool(small);
  auto it = pool.lower_bound({size, 0, 0});
  // Reserved bytes bound allocated ones (every block lies in a segment): checking the growth of
  // the reserved total, before anything changes, keeps both within kMaxBytes.
  if (it == pool.end()) {
    int64_t reserved = reserved_;
    if (!AddBytes(&reserved, GrowthFor(small, size))) return -1;
  }
  const int id = it == pool.end() ? Grow(small, size) : std::get<2>(*it);
  EraseFree(id);
  Block& b = blocks_[id];
  const int64_t remaining = b.size - size;
  // should_split: any remainder of 512 B or more in the small pool or with expandable
  // segments; more than 1 MiB in the large pool otherwise.
  const bool split = small || expandable_ ? remaining >= kMinBlockSize : remaining > kSmallSize;
  if (split) {
    Block rest;
    rest.addr = b.addr + size;
    rest.size = remaining;
    rest.small = small;
    rest.segment = b.segment;
    rest.prev = id;
    rest.next = b.next;
    b.size = size;
    const int rid = NewBlock(rest);
    Block& bb = blocks_[id];  // NewBlock may have reallocated blocks_
    bb.next = rid;
    if (blocks_[rid].next >= 0) blocks_[blocks_[rid].next].prev = rid;
    if (expandable_ && last_block_[small] == id) last_block_[small] = rid;
    InsertFree(rid);
  }
  Block& done = blocks_[id];
  done.allocated = true;
  allocated_ += done.size;
  return id;
}

void CachingAllocatorModel::Free(int id) {
  Block& b = blocks_[id];
  b.allocated = false;
  allocated_ -= b.size;
  // Merge with free neighbours.
  for (int side = 0; side < 2; ++side) {
    const int other = side == 0 ? blocks_[id].prev : blocks_[id].next;
    if (other < 0 || blocks_[other].allocated) continue;
    EraseFree(other);
    Block& me = blocks_[id];
    Block& o = blocks_[other];
    if (side == 0) {  // absorb the previous block into this one
      me.addr = o.addr;
      me.prev = o.prev;
      if (me.prev >= 0) blocks_[me.prev].next = id;
    } else {
      me.next = o.next;
      if (me.next >= 0) blocks_[me.next].prev = id;
      if (last_block_[me.small] == other) last_block_[me.small] = id;
    }
    me.size += o.size;
    free_ids_.push_back(other);
  }
  InsertFree(id);
}

}  // namespace memest
