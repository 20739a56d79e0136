// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp), replaying
// the allocations and frees of a step to predict what torch.cuda.memory_allocated and
// memory_reserved report.
//
// As the real allocator does: every request is rounded up to a multiple of 512 bytes;
// requests up to 1 MiB come from the small pool, carved out of 2 MiB segments; larger ones
// from the large pool, out of 20 MiB segments below 10 MiB and segments rounded up to 2 MiB
// above; a request takes the smallest free block that fits (best fit, lowest address on ties),
// which is split when the rest is at least 512 bytes (small pool, or any pool with expandable
// segments) or more than 1 MiB (large pool); a freed block merges with free neighbours in its segment; segments are cached, never
// returned. "Allocated" counts whole blocks, so an unsplit block counts in full. With
// expandable_segments each pool is one segment that grows by whole pages (2 MiB small,
// 20 MiB large) instead of taking new segments.
//
// Allocated and reserved bytes stay within kMaxBytes (engine/shape.h): a request that would
// take either past it is refused (Malloc returns -1) and changes nothing.
#ifndef MEMEST_ENGINE_ALLOCATOR_H_
#define MEMEST_ENGINE_ALLOCATOR_H_

#include <cstdint>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace memest {

class CachingAllocatorModel {
 public:
  static constexpr int64_t kMinBlockSize = 512;
  static constexpr int64_t kSmallSize = 1 << 20;        // 1 MiB: small pool limit
  static constexpr int64_t kSmallBuffer = 2 << 20;      // 2 MiB small segments
  static constexpr int64_t kLargeBuffer = 20 << 20;     // 20 MiB segments for 1-10 MiB
  static constexpr int64_t kMinLargeAlloc = 10 << 20;   // 10 MiB
  static constexpr int64_t kRoundLarge = 2 << 20;       // larger segments round to 2 MiB

  explicit CachingAllocatorModel(bool expandable_segments = false)
      : expandable_(expandable_segments) {}

  // The size a request of `bytes` is rounded to (at least 512).
  static int64_t RoundSize(int64_t bytes);
  // The size of the segment a request of rounded `size` would make the allocator reserve.
  static int64_t SegmentSize(int64_t size);

  // Allocates `bytes`; returns a handle for Free(), or -1 (nothing allocated) when `bytes` is
  // negative or the allocated or reserved total would pass kMaxBytes.
  int Malloc(int64_t bytes);
  void Free(int handle);

  int64_t allocated() const { return allocated_; }
  int64_t reserved() const { return reserved_; }
  int segments() const { return segments_; }

  // Where the live block `handle` lies: its segment (0-based, in the order the segments were
  // reserved) and its offset in it. Validate maps segments to real device memory through this.
  struct Location {
    int segment;
    int64_t offset;
  };
  Location Locate(int handle) const;
  // The size of segment `segment` as reserved (expandable segments grow after the fact).
  int64_t SegmentBytes(int segment) const { return segment_size_[segment]; }

 private:
  struct Block {
    int64_t addr = 0;
    int64_t size = 0;
    bool allocated = false;
    bool small = false;
    int segment = 0;           // index into segment_start_ / segment_size_
    int prev = -1, next = -1;  // neighbours in the same segment
  };
  // Free blocks ordered for best fit: by size, then address; the id locates the block.
  using FreeSet = std::set<std::tuple<int64_t, int64_t, int>>;

  FreeSet& Pool(bool small) { return small ? small_free_ : large_free_; }
  int NewBlock(const Block& b);
  // The bytes a request of rounded `size` would add to the reserved total.
  int64_t GrowthFor(bool small, int64_t size) const;
  int Grow(bool small, int64_t size);
  void InsertFree(int id);
  void EraseFree(int id);

  bool expandable_;
  std::vector<Block> blocks_;
  std::vector<int> free_ids_;
  FreeSet small_free_, large_free_;
  int last_block_[2] = {-1, -1};  // expandable: the block at the end of each pool's segment
  // Addresses order blocks for best fit: segments are laid out in the order reserved, each
  // from the end of the one before (blocks of different segments never merge: neighbours are
  // linked, not found by address). An expandable segment grows past its start's neighbour
  // without harm, as its addresses are compared only within its own pool.
  int64_t next_addr_ = 0;
  std::vector<int64_t> segment_start_, segment_size_;  // in the order reserved
  int64_t allocated_ = 0;
  int64_t reserved_ = 0;
  int segments_ = 0;
};

}  // namespace memest

#endif  // MEMEST_ENGINE_ALLOCATOR_H_
