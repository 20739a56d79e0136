// Reads the allocator event files of tests/alloc_traces/data/ (format in
// tests/alloc_traces/README.md) and replays them through CachingAllocatorModel, to compare
// what the model reserves with what PyTorch's caching allocator reserved on a real GPU.
#ifndef MEMEST_TESTS_ALLOC_TRACES_TRACE_REPLAY_H_
#define MEMEST_TESTS_ALLOC_TRACES_TRACE_REPLAY_H_

#include <cstdint>
#include <string>
#include <vector>

namespace memest {

struct AllocTrace {
  struct Segment {
    int stream = 0;
    int64_t bytes = 0;
    int64_t address = 0;  // rank among the trace's segment addresses
  };
  struct Block {
    int segment = 0;
    int64_t offset = 0;
    int64_t bytes = 0;
  };
  enum class Kind { kAlloc, kFree, kEmptyCache, kOom };
  struct Event {
    Kind kind = Kind::kAlloc;
    int64_t bytes = 0;         // kAlloc, kOom: the request
    int stream = 0;            // kAlloc, kOom
    int handle = 0;            // kFree: the block freed (start blocks first, then allocs in order)
    int64_t reserved = 0;      // reserved bytes after the event, as recorded
    int64_t new_segment = -1;  // kAlloc: the address rank of the segment it reserved, or -1
  };

  std::string name;
  bool expandable = false;
  int64_t capacity_lo = 0, capacity_hi = 0;  // 0, 0: no cudaMalloc failed (no limit needed)
  std::vector<Segment> segments;             // at the first event, in address order
  std::vector<Block> blocks;                 // live at the first event
  std::vector<Event> events;
  int64_t start_reserved = 0;
  int64_t peak_reserved = 0, end_reserved = 0;
  int end_segments = 0;
};

// Parses one event file's text; on a malformed file returns false with a message in *error.
bool ParseAllocTrace(const std::string& name, const std::string& text, AllocTrace* trace,
                     std::string* error);

struct ReplayResult {
  bool replayed = false;  // false: the model cannot run this trace (see `error`)
  std::string error;
  int64_t peak_reserved = 0;
  int64_t end_reserved = 0;
  int end_segments = 0;
  int events = 0;           // allocations, empty_cache calls and failed requests
  int events_matching = 0;  // of them, those after which reserved matches the trace
  int first_mismatch = -1;  // index in trace.events of the first that does not, or -1
  int refused = 0;          // allocations the model refused that the GPU served
  int granted = 0;          // requests that failed on the GPU but not in the model
  int ooms = 0;             // the model's out-of-memory failures

  bool Exact(const AllocTrace& t) const {
    return replayed && refused == 0 && granted == 0 && peak_reserved == t.peak_reserved &&
           end_reserved == t.end_reserved;
  }
};

// What the replay tells the model beyond the requests and frees; the tool turns each off to
// measure what it is needed for.
struct ReplayOptions {
  bool streams = true;    // each request's stream (else all on the default stream)
  bool addresses = true;  // each new segment's address (else each lies above the others)
};

// Rebuilds the trace's start state in a fresh model (with the given device capacity, 0 for
// none) and replays its events.
ReplayResult ReplayAllocTrace(const AllocTrace& trace, int64_t capacity,
                              const ReplayOptions& options = {});

}  // namespace memest

#endif  // MEMEST_TESTS_ALLOC_TRACES_TRACE_REPLAY_H_
