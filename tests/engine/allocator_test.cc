// The caching allocator model against sequences worked by hand from
// c10/cuda/CUDACachingAllocator.cpp (round to 512 B; <= 1 MiB from 2 MiB segments; < 10 MiB
// from 20 MiB segments; larger rounded to 2 MiB; split when the rest is >= 512 B (small) or
// > 1 MiB (large); best fit; free blocks merge; segments are kept).
#include "engine/step/allocator.h"

#include <gtest/gtest.h>

#include "engine/ir/shape.h"

namespace memest {
namespace {

constexpr int64_t kMiB = 1 << 20;

TEST(AllocatorTest, RoundsToMultiplesOf512) {
  EXPECT_EQ(CachingAllocatorModel::RoundSize(1), 512);
  EXPECT_EQ(CachingAllocatorModel::RoundSize(512), 512);
  EXPECT_EQ(CachingAllocatorModel::RoundSize(513), 1024);
  EXPECT_EQ(CachingAllocatorModel::RoundSize(0), 512);
}

TEST(AllocatorTest, SegmentSizesFollowThePools) {
  EXPECT_EQ(CachingAllocatorModel::SegmentSize(512), 2 * kMiB);
  EXPECT_EQ(CachingAllocatorModel::SegmentSize(kMiB), 2 * kMiB);
  EXPECT_EQ(CachingAllocatorModel::SegmentSize(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(CachingAllocatorModel::SegmentSize(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(CachingAllocatorModel::SegmentSize(10 * kMiB + 512), 12 * kMiB);
}

TEST(AllocatorTest, SmallRequestsShareA2MiBSegment) {
  CachingAllocatorModel a;
  a.Malloc(1);     // 512 B from a new 2 MiB segment
  a.Malloc(kMiB);  // fits in the rest of it
  EXPECT_EQ(a.allocated(), 512 + kMiB);
  EXPECT_EQ(a.reserved(), 2 * kMiB);
  a.Malloc(kMiB);  // 1 MiB - 512 B left: a second segment
  EXPECT_EQ(a.reserved(), 4 * kMiB);
  EXPECT_EQ(a.segments(), 2);
}

TEST(AllocatorTest, LargeRequestsSplitAndReuse) {
  CachingAllocatorModel a;
  const int h1 = a.Malloc(kMiB + 1);  // 1 MiB + 512 B from a new 20 MiB segment, split
  EXPECT_EQ(a.reserved(), 20 * kMiB);
  const int h2 = a.Malloc(12 * kMiB);  // best fit in the 19 MiB - 512 B remainder
  EXPECT_EQ(a.reserved(), 20 * kMiB);
  EXPECT_EQ(a.allocated(), kMiB + 512 + 12 * kMiB);
  a.Free(h1);
  a.Free(h2);  // everything merges back into one 20 MiB free block
  EXPECT_EQ(a.allocated(), 0);
  a.Malloc(30 * kMiB);  // does not fit: a new 30 MiB segment
  EXPECT_EQ(a.reserved(), 50 * kMiB);
  a.Malloc(20 * kMiB);  // the cached 20 MiB block, whole
  EXPECT_EQ(a.reserved(), 50 * kMiB);
  EXPECT_EQ(a.allocated(), 50 * kMiB);
}

TEST(AllocatorTest, UnsplitBlockCountsInFull) {
  CachingAllocatorModel a;
  a.Free(a.Malloc(5 * kMiB));      // leaves a cached 20 MiB block
  a.Malloc(19 * kMiB + kMiB / 2);  // 512 KiB would remain: not split (needs > 1 MiB)
  EXPECT_EQ(a.allocated(), 20 * kMiB);
  EXPECT_EQ(a.reserved(), 20 * kMiB);
}

TEST(AllocatorTest, FragmentationReservesMore) {
  // Two 6 MiB blocks in one 20 MiB segment, the first freed: an 8 MiB request cannot use the
  // freed 6 MiB hole, but fits the 8 MiB tail.
  CachingAllocatorModel a;
  const int h1 = a.Malloc(6 * kMiB);
  a.Malloc(6 * kMiB);
  a.Free(h1);
  a.Malloc(8 * kMiB);
  EXPECT_EQ(a.reserved(), 20 * kMiB);
  a.Malloc(7 * kMiB);  // neither the 6 MiB hole nor anything else: a new segment
  EXPECT_EQ(a.reserved(), 40 * kMiB);
}

TEST(AllocatorTest, ExpandableSegmentsGrowInsteadOfAdding) {
  CachingAllocatorModel plain, expandable(true);
  for (CachingAllocatorModel* a : {&plain, &expandable}) {
    a->Malloc(5 * kMiB);
    a->Malloc(30 * kMiB);
  }
  EXPECT_EQ(plain.reserved(), 50 * kMiB);       // 20 MiB + 30 MiB segments
  EXPECT_EQ(expandable.reserved(), 40 * kMiB);  // one segment: 20 MiB, grown by 20 MiB pages
  EXPECT_EQ(expandable.segments(), 1);
}

}  // namespace
}  // namespace memest

namespace memest {
namespace {

// With expandable segments, should_split splits any remainder of at least 512 B, in the large
// pool too: a 2.5 MiB request in a freed 3 MiB hole counts 2.5 MiB, not the whole 3 MiB.
TEST(AllocatorTest, ExpandableSegmentsSplitLargeBlocksFinely) {
  constexpr int64_t kMiB = 1 << 20;
  for (bool expandable : {false, true}) {
    CachingAllocatorModel a(expandable);
    const int three = a.Malloc(3 * kMiB);
    a.Malloc(17 * kMiB);
    a.Free(three);
    a.Malloc(5 * kMiB / 2);
    EXPECT_EQ(a.allocated(), expandable ? 17 * kMiB + 5 * kMiB / 2 : 20 * kMiB) << expandable;
  }
}

}  // namespace
}  // namespace memest

namespace memest {
namespace {

// Blocks are reused only on the stream that allocated them (BlockComparatorSize orders by
// stream first): a freed block of stream 0 does not serve stream 1.
TEST(AllocatorStreamsTest, EachStreamHasItsOwnBlocks) {
  CachingAllocatorModel a;
  a.Free(a.Malloc(5 * kMiB));            // a cached 20 MiB segment of stream 0
  const int h1 = a.Malloc(5 * kMiB, 1);  // stream 1 cannot use it
  EXPECT_EQ(a.reserved(), 40 * kMiB);
  EXPECT_EQ(a.Locate(h1).segment, 1);
  EXPECT_EQ(a.Locate(a.Malloc(5 * kMiB)).segment, 0);  // stream 0 can
  EXPECT_EQ(a.reserved(), 40 * kMiB);
  a.Malloc(512, 2);
  a.Malloc(512, 3);  // small blocks too: two 2 MiB segments
  EXPECT_EQ(a.reserved(), 44 * kMiB);
  EXPECT_EQ(a.segments(), 4);
}

// Past the capacity, every cached segment with nothing allocated is released and the request
// tried again (release_cached_blocks); a request that still does not fit is out of memory.
TEST(AllocatorCapacityTest, ReleasesCachedSegmentsThenRunsOutOfMemory) {
  CachingAllocatorModel a(false, 40 * kMiB);
  EXPECT_EQ(a.capacity(), 40 * kMiB);
  a.Free(a.Malloc(5 * kMiB));             // a cached 20 MiB segment
  const int split = a.Malloc(12 * kMiB);  // fits it: no new segment
  a.Free(split);
  const int kept = a.Malloc(2 * kMiB);  // a segment split by a live block is not released
  EXPECT_EQ(a.reserved(), 20 * kMiB);
  EXPECT_EQ(a.retries(), 0);
  EXPECT_LT(a.Malloc(30 * kMiB), 0);  // 20 + 30 > 40, and the only segment is in use
  EXPECT_EQ(a.retries(), 1);
  EXPECT_EQ(a.ooms(), 1);
  EXPECT_EQ(a.reserved(), 20 * kMiB);
  a.Free(kept);
  EXPECT_GE(a.Malloc(30 * kMiB), 0);  // now the 20 MiB segment is released for it
  EXPECT_EQ(a.retries(), 2);
  EXPECT_EQ(a.ooms(), 1);
  EXPECT_EQ(a.reserved(), 30 * kMiB);
  EXPECT_EQ(a.segments(), 1);
}

TEST(AllocatorCapacityTest, UnlimitedByDefaultAndBoundedByTheByteLimit) {
  EXPECT_EQ(CachingAllocatorModel().capacity(), 0);
  EXPECT_EQ(CachingAllocatorModel(false, -5).capacity(), 0);
  EXPECT_EQ(CachingAllocatorModel(false, kMaxBytes + 1).capacity(), kMaxBytes);
}

// torch.cuda.empty_cache(): whole free segments go, segments in use stay.
TEST(AllocatorTest, EmptyCacheReleasesWholeFreeSegments) {
  CachingAllocatorModel a;
  const int h = a.Malloc(5 * kMiB);
  a.Free(a.Malloc(5 * kMiB));   // same 20 MiB segment as h
  a.Free(a.Malloc(30 * kMiB));  // a free 30 MiB segment
  a.Free(a.Malloc(512));        // a free 2 MiB small segment
  EXPECT_EQ(a.reserved(), 52 * kMiB);
  a.EmptyCache();
  EXPECT_EQ(a.reserved(), 20 * kMiB);
  EXPECT_EQ(a.segments(), 1);
  EXPECT_EQ(a.SegmentBytes(1), 0);
  a.Free(h);
  a.EmptyCache();
  EXPECT_EQ(a.reserved(), 0);
  EXPECT_EQ(a.allocated(), 0);
}

// Best fit with expandable segments: the free block at the end of the mapped range counts as
// able to grow into the unmapped space after it, so another fitting block is taken first, even
// a larger one (get_free_block's expandable_size).
TEST(AllocatorExpandableTest, TheGrowableEndIsTakenLast) {
  CachingAllocatorModel a(true);
  const int first = a.Malloc(8 * kMiB);  // maps one 20 MiB page: [0, 8) [8, 16) [16, 20) free
  a.Malloc(8 * kMiB);
  a.Free(first);                         // free: an 8 MiB hole at 0 and the 4 MiB end at 16
  const int three = a.Malloc(3 * kMiB);  // plain best fit would take the 4 MiB end
  EXPECT_EQ(a.Locate(three).offset, 0);
  // The 8 MiB that would have fit the hole now needs the end to grow by a page.
  EXPECT_EQ(a.Locate(a.Malloc(8 * kMiB)).offset, 16 * kMiB);
  EXPECT_EQ(a.reserved(), 40 * kMiB);
  EXPECT_EQ(a.segments(), 1);
}

// A release unmaps the whole free pages of an expandable segment (unmap_block), which leaves
// mapped ranges apart; a new page goes to the lowest unmapped address where the request fits
// (find_expandable_block).
TEST(AllocatorExpandableTest, ReleaseUnmapsFreePagesAndGrowthFillsTheLowestHole) {
  CachingAllocatorModel a(true);
  a.Malloc(20 * kMiB);
  const int middle = a.Malloc(20 * kMiB);
  a.Malloc(20 * kMiB);
  a.Free(middle);
  a.EmptyCache();
  EXPECT_EQ(a.reserved(), 40 * kMiB);
  EXPECT_EQ(a.segments(), 2);  // [0, 20) and [40, 60) mapped
  const int again = a.Malloc(20 * kMiB);
  EXPECT_EQ(a.Locate(again).offset, 20 * kMiB);
  EXPECT_EQ(a.reserved(), 60 * kMiB);
  EXPECT_EQ(a.segments(), 1);
  // A partly used page stays mapped: 1 MiB live in the second page keeps it.
  CachingAllocatorModel b(true);
  const int big = b.Malloc(30 * kMiB);  // two pages, [30, 40) free
  b.Malloc(2 * kMiB);                   // [30, 32)
  b.Free(big);                          // [0, 30) free: only [0, 20) is a whole page
  b.EmptyCache();
  EXPECT_EQ(b.reserved(), 20 * kMiB);
  EXPECT_EQ(b.segments(), 1);
}

// Out of memory with expandable segments: the release unmaps the free page and the request
// maps above the live block; the next one fits nowhere.
TEST(AllocatorExpandableTest, CapacityUnmapsThenRunsOutOfMemory) {
  CachingAllocatorModel a(true, 60 * kMiB);
  const int first = a.Malloc(20 * kMiB);
  a.Malloc(20 * kMiB);
  a.Free(first);
  const int h = a.Malloc(30 * kMiB);  // 40 + 40 > 60: [0, 20) is unmapped, then [40, 80) mapped
  EXPECT_GE(h, 0);
  EXPECT_EQ(a.Locate(h).offset, 40 * kMiB);
  EXPECT_EQ(a.retries(), 1);
  EXPECT_EQ(a.reserved(), 60 * kMiB);
  EXPECT_LT(a.Malloc(20 * kMiB), 0);  // the hole at 0 would need a page past 60 MiB
  EXPECT_EQ(a.ooms(), 1);
  EXPECT_EQ(a.reserved(), 60 * kMiB);
}

// Best fit breaks ties by address, which the driver chooses: a replay can say where each new
// segment lies.
TEST(AllocatorTest, TiesGoToTheLowerSegmentAddress) {
  for (bool lower_second : {false, true}) {
    CachingAllocatorModel a;
    a.SetNextSegmentAddress(2000);
    const int h1 = a.Malloc(20 * kMiB);
    a.SetNextSegmentAddress(lower_second ? 1000 : 3000);
    const int h2 = a.Malloc(20 * kMiB);
    a.Free(h1);
    a.Free(h2);
    EXPECT_EQ(a.Locate(a.Malloc(20 * kMiB)).segment, lower_second ? 1 : 0);
  }
}

// Device addresses are 64-bit (a real one is above 2^32): ties still go to the lower one.
TEST(AllocatorTest, TiesGoToTheLowerOf64BitAddresses) {
  CachingAllocatorModel a;
  a.SetNextSegmentAddress((int64_t{1} << 32) + 5);  // an int would keep 5 of it
  const int h1 = a.Malloc(20 * kMiB);
  a.SetNextSegmentAddress(1000);
  const int h2 = a.Malloc(20 * kMiB);
  a.Free(h1);
  a.Free(h2);
  EXPECT_EQ(a.Locate(a.Malloc(20 * kMiB)).segment, 1);
}

}  // namespace
}  // namespace memest
