// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp), replaying
// the allocations and frees of a step to predict what torch.cuda.memory_allocated and
// memory_reserved report. It reproduces the 50 recorded device traces of tests/alloc_traces/
// exactly (docs/step-model.md, "Allocator model", names the functions each rule follows).
//
// As the real allocator does: every request is rounded up to a multiple of 512 bytes;
// requests up to 1 MiB come from the small pool, carved out of 2 MiB segments; larger ones
// from the large pool, out of 20 MiB segments below 10 MiB and segments rounded up to 2 MiB
// above. Each stream has its own blocks: a request takes the smallest free block of its
// stream and pool that fits (best fit, lowest address on ties), which is split when the rest
// is at least 512 bytes (small pool, or any pool with expandable segments) or more than 1 MiB
// (large pool); a freed block merges with free neighbours in its segment; segments are cached.
// "Allocated" counts whole blocks, so an unsplit block counts in full.
//
// With expandable_segments each stream's pool is one segment that maps 2 MiB (small) or
// 20 MiB (large) pages as it grows, at the lowest address where free and unmapped space fit
// the request. Best fit treats a free block followed by unmapped space as able to grow into
// it, so any other fitting block is taken first.
//
// The device capacity (0: unlimited) bounds the reserved bytes. When a new segment or page
// would pass it, every cached segment with nothing allocated is released (with expandable
// segments, every free page is unmapped) and the request tried again; if it still does not
// fit, the request fails (out of memory, counted by ooms()). EmptyCache() releases the same way.
//
// Allocated and reserved bytes stay within kMaxBytes (engine/ir/shape.h): without a capacity, a
// request that would take either past it is refused (Malloc returns -1) and changes nothing.
#ifndef MEMEST_ENGINE_STEP_ALLOCATOR_H_
#define MEMEST_ENGINE_STEP_ALLOCATOR_H_

#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

namespace memest {

class CachingAllocatorModel {
 public:
  static constexpr int64_t kMinBlockSize = 512;
  static constexpr int64_t kSmallSize = 1 << 20;       // 1 MiB: small pool limit
  static constexpr int64_t kSmallBuffer = 2 << 20;     // 2 MiB small segments (and pages)
  static constexpr int64_t kLargeBuffer = 20 << 20;    // 20 MiB segments for 1-10 MiB (pages)
  static constexpr int64_t kMinLargeAlloc = 10 << 20;  // 10 MiB
  static constexpr int64_t kRoundLarge = 2 << 20;      // larger segments round to 2 MiB

  // `capacity`: the bytes the allocator can reserve on the device (0 or less: unlimited; at
  // most kMaxBytes).
  explicit CachingAllocatorModel(bool expandable_segments = false, int64_t capacity = 0);
  // Its blocks point into its own sets: not copied.
  CachingAllocatorModel(const CachingAllocatorModel&) = delete;
  CachingAllocatorModel& operator=(const CachingAllocatorModel&) = delete;

  // The size a request of `bytes` is rounded to (at least 512).
  static int64_t RoundSize(int64_t bytes);
  // The size of the segment a request of rounded `size` would make the allocator reserve.
  static int64_t SegmentSize(int64_t size);

  // Allocates `bytes` on `stream` (any id; 0 is the default stream); returns a handle for
  // Free(), or -1 with nothing allocated: when `bytes` is negative or past kMaxBytes or, with
  // no capacity, the reserved total would pass kMaxBytes (nothing changes); or when the
  // request does not fit the capacity even after the release (cached segments are released).
  int Malloc(int64_t bytes, int stream = 0);
  void Free(int handle);
  // The device address (0 or more) at which the next Malloc's new segment, if it reserves one,
  // lies: best fit breaks ties by address, and the driver chooses addresses. A replay of a
  // recorded trace gives every segment's; without it each new segment lies above all earlier
  // ones (give it for every segment or for none).
  void SetNextSegmentAddress(int64_t address) { next_segment_address_ = address; }
  // torch.cuda.empty_cache(): releases every cached segment with nothing allocated in it, and
  // with expandable segments unmaps every whole page that is free.
  void EmptyCache();

  int64_t allocated() const { return allocated_; }
  int64_t reserved() const { return reserved_; }
  // The segments held, as torch.cuda.memory_snapshot() lists them: one per cudaMalloc, or with
  // expandable segments one per contiguous mapped range.
  int segments() const { return segments_; }
  int64_t capacity() const { return capacity_; }
  // Requests that did not fit the capacity at first, so that the cache was released and the
  // request tried again (PyTorch's num_alloc_retries), and those that then failed (num_ooms).
  int retries() const { return retries_; }
  int ooms() const { return ooms_; }

  // Where the live block `handle` lies: its segment (0-based, in the order the segments were
  // reserved, released ones included) and its offset in it. Validate maps segments to real
  // device memory through this.
  struct Location {
    int segment;
    int64_t offset;
  };
  Location Locate(int handle) const;

  // The allocator's state with its internal block ids left out: its totals, its segments and
  // every free and unmapped block where it lies. Two states whose keys are equal, and whose live
  // blocks (AppendBlockKey) are equal and hold the same requests, go the same way from there.
  void AppendStateKey(std::vector<int64_t>* key) const;
  // Where the live block `handle` lies and what it is: segment, offset, size, stream, pool.
  void AppendBlockKey(int handle, std::vector<int64_t>* key) const;
  // The bytes segment `segment` holds now: a segment's size (0 once released), or what is
  // mapped of an expandable one.
  int64_t SegmentBytes(int segment) const { return segment_bytes_[segment]; }

 private:
  // Free mapped blocks of one pool, ordered for best fit: by stream, size, then address (the
  // segment's, then the offset); the id locates the block.
  using FreeSet = std::set<std::tuple<int, int64_t, int64_t, int64_t, int>>;
  // Unmapped ranges of one pool's expandable segments: by stream, then address.
  using UnmappedSet = std::set<std::tuple<int, int64_t, int64_t, int>>;
  struct Block {
    int64_t offset = 0;  // in its segment
    int64_t size = 0;
    int stream = 0;
    int segment = 0;
    bool small = false;
    bool allocated = false;
    bool mapped = true;        // false: unmapped address space of an expandable segment
    int prev = -1, next = -1;  // neighbours in the same segment
    // Where the block's entry lies in its pool's free or unmapped set, while it has one: taken
    // out without a search.
    bool in_free = false, in_unmapped = false;
    FreeSet::iterator free_at{};  // value-initialized while in no set: a copy copies no dead node
    UnmappedSet::iterator unmapped_at{};
  };

  static int64_t Page(bool small) { return small ? kSmallBuffer : kLargeBuffer; }
  int NewBlock(const Block& b);
  void DeleteBlock(int id);
  void InsertFree(int id);
  void EraseFree(int id);
  void InsertUnmapped(int id);
  void EraseUnmapped(int id);
  bool TryMerge(int dst, int src);

  int GetFreeBlock(bool small, int stream, int64_t size) const;
  int64_t ExpandableSize(int id) const;
  int AllocBlock(bool small, int stream, int64_t size, int64_t limit, int64_t address);
  int AllocExpandable(bool small, int stream, int64_t size, int64_t limit, int64_t address);
  int NewSegment(int64_t address, int64_t mapped);
  int FindExpandableBlock(bool small, int stream, int64_t size) const;
  int64_t MapGrowth(int candidate, int64_t size) const;
  int MapBlock(int id, int64_t bytes);
  void UnmapBlock(int id);
  void ReleaseCachedBlocks();
  void ReleaseSegment(int id);

  bool expandable_;
  int64_t capacity_;
  std::vector<Block> blocks_;
  std::vector<int> free_ids_;
  FreeSet free_[2];  // [small]
  std::vector<FreeSet::node_type> spare_free_;  // nodes taken out of free_, for reuse
  UnmappedSet unmapped_[2];
  std::vector<int64_t> segment_bytes_;    // in the order reserved
  std::vector<int64_t> segment_address_;  // given, or the segment's index
  int64_t next_segment_address_ = -1;
  int64_t allocated_ = 0;
  int64_t reserved_ = 0;
  int segments_ = 0;
  int retries_ = 0;
  int ooms_ = 0;
};

}  // namespace memest

#endif  // MEMEST_ENGINE_STEP_ALLOCATOR_H_
