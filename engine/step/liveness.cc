#include "engine/step/liveness.h"

#include "engine/step/allocator.h"

namespace memest {

namespace {

// CachingAllocatorModel's interface, counting each allocation's own bytes.
class ExactCounter {
 public:
  int Malloc(int64_t bytes) {
    if (bytes < 0 || !AddBytes(&allocated_, bytes)) return -1;
    sizes_.push_back(bytes);
    return static_cast<int>(sizes_.size()) - 1;
  }
  void Free(int h) { allocated_ -= sizes_[h]; }
  int64_t allocated() const { return allocated_; }
  int64_t reserved() const { return allocated_; }
  static int64_t RoundSize(int64_t bytes) { return bytes; }

 private:
  std::vector<int64_t> sizes_;
  int64_t allocated_ = 0;
};

// The per-category sums below cannot overflow: every live buffer's rounded bytes lie inside the
// allocator's allocated total, which Malloc keeps within kMaxBytes.
template <typename Allocator>
StatusOr<Liveness> Walk(const Schedule& s, const Graph& g, Allocator& allocator) {
  std::vector<int> handle(s.num_buffers, -1);
  std::vector<Category> category(s.num_buffers, Category::kTemporaries);
  std::vector<int64_t> rounded(s.num_buffers, 0);
  CategoryBytes live{};
  Liveness out;
  std::vector<int> phase_slot(kNumPhases, -1);
  int context = -1;

  auto point = [&](PeakPoint* p) {
    const StepContext* c = context >= 0 ? &s.contexts[context] : nullptr;
    p->phase = c ? c->phase : Phase::kData;
    p->allocated_bytes = allocator.allocated();
    p->by_category = live;
    p->micro_batch = c ? c->micro_batch : 0;
    p->recompute = c && c->recompute;
    if (c && c->op >= 0) {
      p->op = g.ops[c->op].kind;
      p->scope = g.ops[c->op].scope;
    } else {
      p->op.clear();
      p->scope.clear();
    }
  };
  auto phase_entry = [&]() -> PeakPoint& {
    const Phase ph = context >= 0 ? s.contexts[context].phase : Phase::kData;
    int& slot = phase_slot[static_cast<int>(ph)];
    if (slot < 0) {
      slot = static_cast<int>(out.phases.size());
      out.phases.emplace_back();
      out.phases.back().phase = ph;
      out.phases.back().allocated_bytes = -1;
    }
    return out.phases[slot];
  };

  for (const Event& e : s.events) {
    switch (e.kind) {
      case EventKind::kContext: {
        context = e.buffer;
        // A phase that ran appears even if it only frees: its peak is at least its start.
        PeakPoint& ph = phase_entry();
        if (allocator.allocated() > ph.allocated_bytes) point(&ph);
        if (allocator.reserved() > ph.reserved_bytes) ph.reserved_bytes = allocator.reserved();
        break;
      }
      case EventKind::kAlloc: {
        // An empty tensor holds no memory: PyTorch's allocators return a null pointer for 0
        // bytes and make no block.
        if (e.bytes == 0) break;
        handle[e.buffer] = allocator.Malloc(e.bytes);
        if (handle[e.buffer] < 0) {
          return ByteCountTooLarge(context >= 0 ? &s.contexts[context] : nullptr, g,
                                   "the bytes reserved at once");
        }
        rounded[e.buffer] = Allocator::RoundSize(e.bytes);
        category[e.buffer] = e.category;
        live[static_cast<int>(e.category)] += rounded[e.buffer];
        if (allocator.allocated() > out.peak.allocated_bytes) {
          point(&out.peak);
          out.reserved_at_peak = allocator.reserved();
        }
        PeakPoint& ph = phase_entry();
        if (allocator.allocated() > ph.allocated_bytes) point(&ph);
        if (allocator.reserved() > ph.reserved_bytes) ph.reserved_bytes = allocator.reserved();
        if (allocator.reserved() > out.peak_reserved) out.peak_reserved = allocator.reserved();
        break;
      }
      case EventKind::kFree:
        if (handle[e.buffer] < 0) break;
        allocator.Free(handle[e.buffer]);
        handle[e.buffer] = -1;
        live[static_cast<int>(category[e.buffer])] -= rounded[e.buffer];
        break;
      case EventKind::kRetag:
        if (handle[e.buffer] < 0) break;
        live[static_cast<int>(category[e.buffer])] -= rounded[e.buffer];
        category[e.buffer] = e.category;
        live[static_cast<int>(e.category)] += rounded[e.buffer];
        break;
    }
  }
  out.peak.reserved_bytes = out.peak_reserved;
  out.at_end = live;
  return out;
}

}  // namespace

StatusOr<Liveness> WalkSchedule(const Schedule& s, const Graph& g, bool expandable,
                                Accounting accounting) {
  if (accounting == Accounting::kExact) {
    ExactCounter exact;
    return Walk(s, g, exact);
  }
  CachingAllocatorModel allocator(expandable);
  return Walk(s, g, allocator);
}

}  // namespace memest
