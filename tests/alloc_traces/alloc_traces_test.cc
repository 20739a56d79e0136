// Replays every committed device trace of tests/alloc_traces/data/ (recorded by PyTorch's CUDA
// caching allocator on real GPUs; README.md cites each) through CachingAllocatorModel: the
// reserved bytes after every allocation, the peak and the end, and the segments held at the
// end, must be the recorded ones exactly. A trace that needed a device capacity is replayed at
// both ends of the capacities it allows.
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/alloc_traces/trace_replay.h"

namespace memest {
namespace {

std::vector<std::string> TraceFiles() {
  std::vector<std::string> names;
  if (DIR* dir = opendir(MEMEST_ALLOC_TRACES_DIR)) {
    while (const dirent* e = readdir(dir)) {
      const std::string name = e->d_name;
      if (name.size() > 4 && name.compare(name.size() - 4, 4, ".txt") == 0) names.push_back(name);
    }
    closedir(dir);
  }
  std::sort(names.begin(), names.end());
  return names;
}

AllocTrace Load(const std::string& name) {
  std::ifstream f(std::string(MEMEST_ALLOC_TRACES_DIR) + "/" + name);
  std::stringstream text;
  text << f.rdbuf();
  AllocTrace t;
  std::string error;
  EXPECT_TRUE(f && ParseAllocTrace(name, text.str(), &t, &error)) << name << " " << error;
  return t;
}

TEST(AllocTracesTest, AllFiftyDeviceTracesAreThere) {
  // 48 snapshots; one holds three devices.
  EXPECT_EQ(TraceFiles().size(), 50u) << MEMEST_ALLOC_TRACES_DIR;
}

class AllocTraceReplay : public ::testing::TestWithParam<std::string> {};

TEST_P(AllocTraceReplay, ReservesExactlyWhatTheGpuReserved) {
  const AllocTrace t = Load(GetParam());
  ASSERT_FALSE(t.events.empty());
  std::vector<int64_t> capacities = {t.capacity_lo};
  if (t.capacity_hi != t.capacity_lo) capacities.push_back(t.capacity_hi);
  for (int64_t capacity : capacities) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    const ReplayResult r = ReplayAllocTrace(t, capacity);
    ASSERT_TRUE(r.replayed) << r.error;
    EXPECT_EQ(r.peak_reserved, t.peak_reserved);
    EXPECT_EQ(r.end_reserved, t.end_reserved);
    EXPECT_EQ(r.end_segments, t.end_segments);
    EXPECT_EQ(r.refused, 0) << "allocations the GPU served and the model refused";
    EXPECT_EQ(r.granted, 0) << "requests that ran out of memory on the GPU only";
    EXPECT_EQ(r.events_matching, r.events)
        << "first event with other reserved bytes: #" << r.first_mismatch << " of "
        << t.events.size() << ", recorded "
        << (r.first_mismatch >= 0 ? t.events[r.first_mismatch].reserved : 0);
  }
}

std::string TestName(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param.substr(0, info.param.size() - 4);
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Recorded, AllocTraceReplay, ::testing::ValuesIn(TraceFiles()), TestName);

}  // namespace
}  // namespace memest
