#include "engine/step/allocator.h"

#include <algorithm>
#include <climits>
#include <iterator>

#include "engine/ir/shape.h"

namespace memest {
namespace {

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

int Id(const std::tuple<int, int64_t, int64_t, int64_t, int>& key) { return std::get<4>(key); }

}  // namespace

CachingAllocatorModel::CachingAllocatorModel(bool expandable_segments, int64_t capacity)
    : expandable_(expandable_segments),
      capacity_(capacity <= 0 ? 0 : std::min(capacity, kMaxBytes)) {}

int64_t CachingAllocatorModel::RoundSize(int64_t bytes) {
  return bytes < kMinBlockSize ? kMinBlockSize : RoundUp(bytes, kMinBlockSize);
}

int64_t CachingAllocatorModel::SegmentSize(int64_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return RoundUp(size, kRoundLarge);
}

int CachingAllocatorModel::NewBlock(const Block& b) {
  int id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
    blocks_[id] = b;
  } else {
    id = static_cast<int>(blocks_.size());
    blocks_.push_back(b);
  }
  blocks_[id].in_free = blocks_[id].in_unmapped = false;  // a copy is in no set
  return id;
}

void CachingAllocatorModel::DeleteBlock(int id) { free_ids_.push_back(id); }

void CachingAllocatorModel::InsertFree(int id) {
  Block& b = blocks_[id];
  // An entry already there (not inserted again) is this block's own: its id is in the key.
  const FreeSet::value_type key(b.stream, b.size, segment_address_[b.segment], b.offset, id);
  if (spare_free_.empty()) {
    b.free_at = free_[b.small].insert(key).first;
  } else {
    // A node EraseFree kept: no allocation (a step frees and reuses blocks all the time).
    FreeSet::node_type node = std::move(spare_free_.back());
    spare_free_.pop_back();
    node.value() = key;
    b.free_at = free_[b.small].insert(std::move(node)).position;
  }
  b.in_free = true;
}

void CachingAllocatorModel::EraseFree(int id) {
  Block& b = blocks_[id];
  if (!b.in_free) return;
  spare_free_.push_back(free_[b.small].extract(b.free_at));
  b.free_at = FreeSet::iterator();
  b.in_free = false;
}

void CachingAllocatorModel::InsertUnmapped(int id) {
  Block& b = blocks_[id];
  b.unmapped_at =
      unmapped_[b.small].emplace(b.stream, segment_address_[b.segment], b.offset, id).first;
  b.in_unmapped = true;
}

void CachingAllocatorModel::EraseUnmapped(int id) {
  Block& b = blocks_[id];
  if (!b.in_unmapped) return;
  unmapped_[b.small].erase(b.unmapped_at);
  b.unmapped_at = UnmappedSet::iterator();
  b.in_unmapped = false;
}

// try_merge_blocks: `dst` (in no set) absorbs its neighbour `src` when `src` is free and
// mapped alike.
bool CachingAllocatorModel::TryMerge(int dst, int src) {
  if (src < 0 || blocks_[src].allocated || blocks_[src].mapped != blocks_[dst].mapped) {
    return false;
  }
  if (blocks_[src].mapped) {
    EraseFree(src);
  } else {
    EraseUnmapped(src);
  }
  Block& d = blocks_[dst];
  const Block& s = blocks_[src];
  if (d.prev == src) {
    d.offset = s.offset;
    d.prev = s.prev;
    if (d.prev >= 0) blocks_[d.prev].next = dst;
  } else {
    d.next = s.next;
    if (d.next >= 0) blocks_[d.next].prev = dst;
  }
  d.size += s.size;
  DeleteBlock(src);
  return true;
}

CachingAllocatorModel::Location CachingAllocatorModel::Locate(int handle) const {
  const Block& b = blocks_[handle];
  return {b.segment, b.offset};
}

void CachingAllocatorModel::AppendStateKey(std::vector<int64_t>* key) const {
  key->insert(key->end(), {allocated_, reserved_, segments_, retries_, ooms_,
                           static_cast<int64_t>(segment_bytes_.size())});
  key->insert(key->end(), segment_bytes_.begin(), segment_bytes_.end());
  key->insert(key->end(), segment_address_.begin(), segment_address_.end());
  for (int small = 0; small < 2; ++small) {
    key->push_back(static_cast<int64_t>(free_[small].size()));
    for (const auto& f : free_[small]) AppendBlockKey(std::get<4>(f), key);
    key->push_back(static_cast<int64_t>(unmapped_[small].size()));
    for (const auto& u : unmapped_[small]) AppendBlockKey(std::get<3>(u), key);
  }
}

void CachingAllocatorModel::AppendBlockKey(int handle, std::vector<int64_t>* key) const {
  const Block& b = blocks_[handle];
  key->insert(key->end(), {b.segment, b.offset, b.size, b.stream, b.small});
}

// With expandable segments, a block followed by unmapped space counts as able to grow into it.
int64_t CachingAllocatorModel::ExpandableSize(int id) const {
  const Block& b = blocks_[id];
  return b.size + (b.next >= 0 && !blocks_[b.next].mapped ? blocks_[b.next].size : 0);
}

// get_free_block: the smallest free block of the stream that fits; with expandable segments,
// past every block whose expandable size is larger than the next one's.
int CachingAllocatorModel::GetFreeBlock(bool small, int stream, int64_t size) const {
  const FreeSet& pool = free_[small];
  auto it = pool.lower_bound({stream, size, INT64_MIN, INT64_MIN, INT_MIN});
  if (it == pool.end() || std::get<0>(*it) != stream) return -1;
  if (expandable_) {
    for (auto next = std::next(it); next != pool.end() && std::get<0>(*next) == stream &&
                                    ExpandableSize(Id(*next)) < ExpandableSize(Id(*it));
         ++next) {
      it = next;
    }
  }
  return Id(*it);
}

// alloc_block: a new block of `size` bytes or more, in no set, from a new segment or new pages;
// -1 when that would take the reserved total past `limit` (and nothing changed).
int CachingAllocatorModel::AllocBlock(bool small, int stream, int64_t size, int64_t limit,
                                      int64_t address) {
  if (expandable_) return AllocExpandable(small, stream, size, limit, address);
  const int64_t grow = SegmentSize(size);
  if (grow > limit - reserved_) return -1;
  Block b;
  b.size = grow;
  b.stream = stream;
  b.small = small;
  b.segment = NewSegment(address, grow);
  reserved_ += grow;
  ++segments_;
  return NewBlock(b);
}

int CachingAllocatorModel::NewSegment(int64_t address, int64_t mapped) {
  const int index = static_cast<int>(segment_bytes_.size());
  segment_bytes_.push_back(mapped);
  segment_address_.push_back(address >= 0 ? address : index);
  return index;
}

// find_expandable_block: the lowest unmapped range of the stream's pool (or the free block
// before it) from which free and unmapped blocks reach `size`; -1 if none.
int CachingAllocatorModel::FindExpandableBlock(bool small, int stream, int64_t size) const {
  const UnmappedSet& pool = unmapped_[small];
  for (auto it = pool.lower_bound({stream, INT64_MIN, INT64_MIN, INT_MIN});
       it != pool.end() && std::get<0>(*it) == stream; ++it) {
    int c = std::get<3>(*it);
    const int prev = blocks_[c].prev;
    if (prev >= 0 && !blocks_[prev].allocated) c = prev;
    int64_t room = 0;
    for (int b = c; room < size && b >= 0 && !blocks_[b].allocated; b = blocks_[b].next) {
      room += blocks_[b].size;
    }
    if (room >= size) return c;
  }
  return -1;
}

// The bytes try_allocate_expandable_block maps from `candidate` for `size`: whole pages of each
// unmapped range in turn, as much as is still missing.
int64_t CachingAllocatorModel::MapGrowth(int candidate, int64_t size) const {
  const int64_t page = Page(blocks_[candidate].small);
  int64_t have = 0, grow = 0;
  for (int b = candidate; have < size; b = blocks_[b].next) {
    if (blocks_[b].mapped) {
      have += blocks_[b].size;
      continue;
    }
    const int64_t map = std::min(RoundUp(size - have, page), blocks_[b].size);
    grow += map;
    have += map;
  }
  return grow;
}

// try_allocate_expandable_block.
int CachingAllocatorModel::AllocExpandable(bool small, int stream, int64_t size, int64_t limit,
                                           int64_t address) {
  int c = FindExpandableBlock(small, stream, size);
  const int64_t grow = c >= 0 ? MapGrowth(c, size) : RoundUp(size, Page(small));
  if (grow > limit - reserved_) return -1;
  if (c < 0) {
    // A new segment: address space for all of the device (here kMaxBytes), none of it mapped.
    Block b;
    b.size = kMaxBytes / Page(small) * Page(small);
    b.stream = stream;
    b.small = small;
    b.mapped = false;
    b.segment = NewSegment(address, 0);
    c = NewBlock(b);
    InsertUnmapped(c);
  }
  if (!blocks_[c].mapped) {
    c = MapBlock(c, std::min(RoundUp(size, Page(small)), blocks_[c].size));
  }
  while (blocks_[c].size < size) {
    const int next = blocks_[c].next;
    c = MapBlock(next, std::min(RoundUp(size - blocks_[c].size, Page(small)), blocks_[next].size));
  }
  EraseFree(c);
  return c;
}

// map_block: maps the first `bytes` (whole pages) of unmapped block `id`, which then merges
// with free neighbours; returns the free block that holds them.
int CachingAllocatorModel::MapBlock(int id, int64_t bytes) {
  EraseUnmapped(id);
  if (bytes < blocks_[id].size) {
    Block rest = blocks_[id];
    rest.offset += bytes;
    rest.size -= bytes;
    rest.prev = id;
    const int r = NewBlock(rest);
    if (blocks_[r].next >= 0) blocks_[blocks_[r].next].prev = r;
    blocks_[id].next = r;
    blocks_[id].size = bytes;
    InsertUnmapped(r);
  }
  Block& b = blocks_[id];
  b.mapped = true;
  const bool left = b.prev >= 0 && blocks_[b.prev].mapped;
  const bool right = b.next >= 0 && blocks_[b.next].mapped;
  segments_ += 1 - left - right;  // contiguous mapped ranges
  reserved_ += bytes;
  segment_bytes_[b.segment] += bytes;
  TryMerge(id, blocks_[id].prev);
  TryMerge(id, blocks_[id].next);
  InsertFree(id);
  return id;
}

// unmap_block: unmaps the whole pages inside free block `id`; what is left of it on either
// side stays a free mapped block.
void CachingAllocatorModel::UnmapBlock(int id) {
  const int64_t page = Page(blocks_[id].small);
  const int64_t begin = RoundUp(blocks_[id].offset, page);
  const int64_t end = (blocks_[id].offset + blocks_[id].size) / page * page;
  if (begin >= end) return;
  EraseFree(id);
  const Block b = blocks_[id];  // out of its set: the pieces copied from it are in none
  auto add_free = [&](int64_t offset, int64_t size, int prev, int next) {
    Block f = b;
    f.offset = offset;
    f.size = size;
    f.prev = prev;
    f.next = next;
    const int n = NewBlock(f);
    if (prev >= 0) blocks_[prev].next = n;
    if (next >= 0) blocks_[next].prev = n;
    InsertFree(n);
  };
  if (begin > b.offset) add_free(b.offset, begin - b.offset, b.prev, id);
  if (end < b.offset + b.size) add_free(end, b.offset + b.size - end, id, b.next);
  Block& u = blocks_[id];
  u.offset = begin;
  u.size = end - begin;
  u.mapped = false;
  const bool left = u.prev >= 0 && blocks_[u.prev].mapped;
  const bool right = u.next >= 0 && blocks_[u.next].mapped;
  segments_ += left + right - 1;
  reserved_ -= end - begin;
  segment_bytes_[u.segment] -= end - begin;
  TryMerge(id, blocks_[id].prev);
  TryMerge(id, blocks_[id].next);
  InsertUnmapped(id);
}

// release_block: returns a whole free segment.
void CachingAllocatorModel::ReleaseSegment(int id) {
  EraseFree(id);
  reserved_ -= blocks_[id].size;
  segment_bytes_[blocks_[id].segment] = 0;
  --segments_;
  DeleteBlock(id);
}

// release_cached_blocks -> release_blocks, large pool then small: every free block that is a
// whole segment is released; with expandable segments every free block's whole pages are
// unmapped, and a segment left with nothing mapped is released.
void CachingAllocatorModel::ReleaseCachedBlocks() {
  for (bool small : {false, true}) {
    std::vector<int> ids;
    for (const auto& key : free_[small]) ids.push_back(Id(key));
    for (int id : ids) {
      const Block& b = blocks_[id];
      if (!expandable_) {
        if (b.prev < 0 && b.next < 0) ReleaseSegment(id);
        continue;
      }
      UnmapBlock(id);
      const Block& u = blocks_[id];
      if (!u.mapped && u.prev < 0 && u.next < 0) {  // release_expandable_segment
        EraseUnmapped(id);
        DeleteBlock(id);
      }
    }
  }
}

void CachingAllocatorModel::EmptyCache() { ReleaseCachedBlocks(); }

int CachingAllocatorModel::Malloc(int64_t bytes, int stream) {
  const int64_t address = next_segment_address_;
  next_segment_address_ = -1;
  if (bytes < 0 || bytes > kMaxBytes) return -1;
  const int64_t size = RoundSize(bytes);
  const bool small = size <= kSmallSize;
  int id = GetFreeBlock(small, stream, size);
  if (id >= 0) {
    EraseFree(id);
  } else {
    // Reserved bytes bound allocated ones (every block lies in a segment): keeping reserved
    // within the capacity, itself within kMaxBytes, keeps both within kMaxBytes.
    const int64_t limit = capacity_ > 0 ? capacity_ : kMaxBytes;
    id = AllocBlock(small, stream, size, limit, address);
    if (id < 0 && capacity_ > 0) {
      // cudaMalloc failed: free every cached free segment and try again.
      ++retries_;
      ReleaseCachedBlocks();
      id = AllocBlock(small, stream, size, limit, address);
      if (id < 0) ++ooms_;
    }
    if (id < 0) return -1;
  }
  const int64_t remaining = blocks_[id].size - size;
  // should_split: any remainder of 512 B or more in the small pool or with expandable
  // segments; more than 1 MiB in the large pool otherwise.
  const bool split = small || expandable_ ? remaining >= kMinBlockSize : remaining > kSmallSize;
  if (split) {
    Block rest = blocks_[id];
    rest.offset += size;
    rest.size = remaining;
    rest.prev = id;
    const int r = NewBlock(rest);
    if (blocks_[r].next >= 0) blocks_[blocks_[r].next].prev = r;
    blocks_[id].next = r;
    blocks_[id].size = size;
    InsertFree(r);
  }
  Block& b = blocks_[id];
  b.allocated = true;
  allocated_ += b.size;
  return id;
}

void CachingAllocatorModel::Free(int id) {
  blocks_[id].allocated = false;
  allocated_ -= blocks_[id].size;
  TryMerge(id, blocks_[id].prev);
  TryMerge(id, blocks_[id].next);
  InsertFree(id);
}

}  // namespace memest
