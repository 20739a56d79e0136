// The caching allocator model against sequences worked by hand from
// c10/cuda/CUDACachingAllocator.cpp (round to 512 B; <= 1 MiB from 2 MiB segments; < 10 MiB
// from 20 MiB segments; larger rounded to 2 MiB; split when the rest is >= 512 B (small) or
// > 1 MiB (large); best fit; free blocks merge; segments are kept).
#include "engine/allocator.h"

#include <gtest/gtest.h>

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
  a.Malloc(1);          // 512 B from a new 2 MiB segment
  a.Malloc(kMiB);       // fits in the rest of it
  EXPECT_EQ(a.allocated(), 512 + kMiB);
  EXPECT_EQ(a.reserved(), 2 * kMiB);
  a.Malloc(kMiB);       // 1 MiB - 512 B left: a second segment
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
  a.Free(a.Malloc(5 * kMiB));  // leaves a cached 20 MiB block
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
