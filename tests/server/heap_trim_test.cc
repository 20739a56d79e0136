// The heap is given back once, when the last request in flight ends after a large one.
#include "server/heap_trim.h"

#include <gtest/gtest.h>

#include <optional>

namespace memest {
namespace {

TEST(HeapTrimmerTest, TrimsWhenTheLastRequestEndsAfterALargeOne) {
  HeapTrimmer trimmer;
  std::optional<HeapTrimmer::Request> small(std::in_place, trimmer);
  {
    HeapTrimmer::Request large(trimmer);
    large.MarkLarge();
  }
  EXPECT_EQ(trimmer.trims(), 0) << "trimmed while a request still held its memory";
  small.reset();
  EXPECT_EQ(trimmer.trims(), 1);
  { HeapTrimmer::Request later(trimmer); }
  EXPECT_EQ(trimmer.trims(), 1) << "small requests alone do not trim";
}

TEST(HeapTrimmerTest, OneTrimForLargeRequestsSideBySide) {
  HeapTrimmer trimmer;
  {
    HeapTrimmer::Request a(trimmer), b(trimmer), c(trimmer);
    a.MarkLarge();
    b.MarkLarge();
    c.MarkLarge();
  }
  EXPECT_EQ(trimmer.trims(), 1);
}

}  // namespace
}  // namespace memest
