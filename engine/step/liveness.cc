#include "engine/step/liveness.h"

#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

#include "engine/step/allocator.h"

namespace memest {

namespace {

// CachingAllocatorModel's interface, counting each allocation's own bytes.
class ExactCounter {
 public:
  int Malloc(int64_t bytes, int /*stream*/ = 0) {
    if (bytes < 0 || !AddBytes(&allocated_, bytes)) return -1;
    sizes_.push_back(bytes);
    return static_cast<int>(sizes_.size()) - 1;
  }
  void Free(int h) { allocated_ -= sizes_[h]; }
  int64_t allocated() const { return allocated_; }
  int64_t reserved() const { return allocated_; }
  static int64_t RoundSize(int64_t bytes) { return bytes; }
  void AppendStateKey(std::vector<int64_t>* key) const { key->push_back(allocated_); }
  void AppendBlockKey(int /*handle*/, std::vector<int64_t>* /*key*/) const {}

 private:
  std::vector<int64_t> sizes_;
  int64_t allocated_ = 0;
};

// The walk of one schedule through one allocator. The per-category sums cannot overflow: every
// live buffer's rounded bytes lie inside the allocator's allocated total, which Malloc keeps
// within kMaxBytes.
template <typename Allocator>
class Walker {
 public:
  Walker(const Schedule& s, const Graph& g, Allocator& allocator, Budget* budget)
      : s_(s), g_(g), allocator_(allocator), phase_slot_(kNumPhases, -1), budget_(budget) {
    Grow(s.num_buffers);
  }

  StatusOr<Liveness> Run() {
    const int n = static_cast<int>(s_.events.size());
    const RepeatedSpan* r = s_.repeat ? &*s_.repeat : nullptr;
    if (r == nullptr) {
      MEMEST_RETURN_IF_ERROR(Walk(0, n, 0));
      return Finish();
    }
    // The period once as simulated; then each copy the real step runs after it, until the
    // allocator is where an earlier copy (of the last kWindow) left it: from there the copies
    // repeat that cycle, so only the copies that finish the last turn of it are walked.
    MEMEST_RETURN_IF_ERROR(Walk(0, r->begin_event, 0));
    std::deque<std::pair<int64_t, std::vector<int64_t>>> window;
    window.emplace_back(-1, Key(-1));
    MEMEST_RETURN_IF_ERROR(Walk(r->begin_event, r->end_event, 0));
    int64_t copy = 0, last = r->copies;
    std::vector<int64_t> key = Key(0);
    while (copy < last) {
      for (const auto& [earlier, seen] : window) {
        if (seen == key) {
          last = copy + (r->copies - copy) % (copy - earlier);
          break;
        }
      }
      if (copy == last) break;
      if (window.size() == kWindow) window.pop_front();
      window.emplace_back(copy, std::move(key));
      ++copy;
      mb_shift_ = static_cast<int>(copy) * r->micro_batch_stride;
      MEMEST_RETURN_IF_ERROR(Walk(r->begin_event, r->end_event, copy));
      key = Key(copy);
    }
    mb_shift_ = static_cast<int>(r->copies) * r->micro_batch_stride;
    MEMEST_RETURN_IF_ERROR(Walk(r->end_event, n, copy));
    return Finish();
  }

 private:
  void Grow(size_t n) {
    if (handle_.size() >= n) return;
    handle_.resize(n, -1);
    category_.resize(n, Category::kTemporaries);
    rounded_.resize(n, 0);
    if (s_.repeat) live_at_.resize(n, -1);
  }

  // The buffer an event names in the `copy`th copy of the repeated period (0: as simulated).
  int Id(int buffer, int64_t copy) const {
    if (copy == 0 || buffer < s_.repeat->first_id) return buffer;
    return buffer + static_cast<int>(copy) * s_.repeat->ids;
  }

  // The state after the `copy`th copy (-1: before the period as simulated), its buffers numbered
  // as after the period as simulated.
  std::vector<int64_t> Key(int64_t copy) {
    std::vector<int64_t> key;
    allocator_.AppendStateKey(&key);
    std::vector<int> ids = live_;
    std::sort(ids.begin(), ids.end());
    const RepeatedSpan& r = *s_.repeat;
    for (int id : ids) {
      key.push_back(id < r.first_id ? id : id - (copy * r.ids));
      key.push_back(static_cast<int64_t>(category_[id]));
      key.push_back(rounded_[id]);
      allocator_.AppendBlockKey(handle_[id], &key);
    }
    return key;
  }

  // Records the moment in `p`; its op's kind and scope are named once the walk ends (Finish),
  // from the context kept in `op_of`: a forward sets a new peak at nearly every allocation.
  void Point(PeakPoint* p, int* op_of) const {
    const StepContext* c = context_ >= 0 ? &s_.contexts[context_] : nullptr;
    p->phase = c ? c->phase : Phase::kData;
    p->allocated_bytes = allocator_.allocated();
    p->by_category = live_bytes_;
    p->micro_batch = c ? c->micro_batch + mb_shift_ : 0;
    p->recompute = c && c->recompute;
    *op_of = c ? c->op : -1;
  }

  static void NameOp(PeakPoint* p, int op, const Graph& g) {
    if (op >= 0) {
      p->op = g.ops[op].kind;
      p->scope = g.ops[op].scope;
    }
  }

  // The index in out_.phases of the phase the walk is in, made on its first event.
  size_t PhaseEntry() {
    const Phase ph = context_ >= 0 ? s_.contexts[context_].phase : Phase::kData;
    int& slot = phase_slot_[static_cast<int>(ph)];
    if (slot < 0) {
      slot = static_cast<int>(out_.phases.size());
      out_.phases.emplace_back();
      out_.phases.back().phase = ph;
      out_.phases.back().allocated_bytes = -1;
      phase_op_.push_back(-1);
    }
    return static_cast<size_t>(slot);
  }

  Status Walk(int first, int last, int64_t copy) {
    for (int i = first; i < last; ++i) {
      const Event& e = s_.events[static_cast<size_t>(i)];
      if (e.kind == EventKind::kContext) {
        context_ = e.buffer;
        if (budget_ != nullptr && ++contexts_ % Budget::kCheckEvery == 0) {
          MEMEST_RETURN_IF_ERROR(budget_->Check());  // a long walk stops for a gone caller
        }
        // A phase that ran appears even if it only frees: its peak is at least its start.
        const size_t slot = PhaseEntry();
        PeakPoint& ph = out_.phases[slot];
        if (allocator_.allocated() > ph.allocated_bytes) Point(&ph, &phase_op_[slot]);
        if (allocator_.reserved() > ph.reserved_bytes) ph.reserved_bytes = allocator_.reserved();
        continue;
      }
      const int id = Id(e.buffer, copy);
      Grow(static_cast<size_t>(id) + 1);
      switch (e.kind) {
        case EventKind::kAlloc: {
          // An empty tensor holds no memory: PyTorch's allocators return a null pointer for 0
          // bytes and make no block.
          if (e.bytes == 0) break;
          handle_[id] = allocator_.Malloc(e.bytes, e.stream);
          if (handle_[id] < 0) {
            return ByteCountTooLarge(context_ >= 0 ? &s_.contexts[context_] : nullptr, g_,
                                     "the bytes reserved at once");
          }
          rounded_[id] = Allocator::RoundSize(e.bytes);
          category_[id] = e.category;
          live_bytes_[static_cast<int>(e.category)] += rounded_[id];
          if (s_.repeat) {
            live_at_[id] = static_cast<int>(live_.size());
            live_.push_back(id);
          }
          if (allocator_.allocated() > out_.peak.allocated_bytes) {
            Point(&out_.peak, &peak_op_);
            out_.reserved_at_peak = allocator_.reserved();
          }
          const size_t slot = PhaseEntry();
          PeakPoint& ph = out_.phases[slot];
          if (allocator_.allocated() > ph.allocated_bytes) Point(&ph, &phase_op_[slot]);
          if (allocator_.reserved() > ph.reserved_bytes) ph.reserved_bytes = allocator_.reserved();
          if (allocator_.reserved() > out_.peak_reserved) out_.peak_reserved = allocator_.reserved();
          break;
        }
        case EventKind::kFree: {
          if (handle_[id] < 0) break;
          allocator_.Free(handle_[id]);
          handle_[id] = -1;
          live_bytes_[static_cast<int>(category_[id])] -= rounded_[id];
          if (!s_.repeat) break;
          const int moved = live_.back();
          live_[static_cast<size_t>(live_at_[id])] = moved;
          live_at_[moved] = live_at_[id];
          live_.pop_back();
          live_at_[id] = -1;
          break;
        }
        case EventKind::kRetag:
          if (handle_[id] < 0) break;
          live_bytes_[static_cast<int>(category_[id])] -= rounded_[id];
          category_[id] = e.category;
          live_bytes_[static_cast<int>(e.category)] += rounded_[id];
          break;
        case EventKind::kContext:
          break;
      }
    }
    return Status();
  }

  Liveness Finish() {
    NameOp(&out_.peak, peak_op_, g_);
    for (size_t k = 0; k < out_.phases.size(); ++k) NameOp(&out_.phases[k], phase_op_[k], g_);
    out_.peak.reserved_bytes = out_.peak_reserved;
    out_.at_end = live_bytes_;
    return std::move(out_);
  }

  static constexpr size_t kWindow = 16;  // states a copy's is compared with

  const Schedule& s_;
  const Graph& g_;
  Allocator& allocator_;
  // Per buffer: its allocator handle (-1: not live), category, rounded bytes, place in live_.
  std::vector<int> handle_;
  std::vector<Category> category_;
  std::vector<int64_t> rounded_;
  std::vector<int> live_at_;  // kept only for a repeated span, whose states are compared
  std::vector<int> live_;     // the live buffers, in no order (the same)
  CategoryBytes live_bytes_{};
  Liveness out_;
  std::vector<int> phase_slot_;
  int peak_op_ = -1;           // the op at the peak (-1: none), named by Finish
  std::vector<int> phase_op_;  // per entry of out_.phases, the same
  int context_ = -1;
  Budget* budget_;
  int64_t contexts_ = 0;  // context events walked, for the budget's checks
  int mb_shift_ = 0;  // added to the micro-batches of the contexts: a copy of the period's
};

}  // namespace

StatusOr<Liveness> WalkSchedule(const Schedule& s, const Graph& g, bool expandable,
                                Accounting accounting, Budget* budget) {
  if (accounting == Accounting::kExact) {
    ExactCounter exact;
    return Walker<ExactCounter>(s, g, exact, budget).Run();
  }
  CachingAllocatorModel allocator(expandable);
  return Walker<CachingAllocatorModel>(s, g, allocator, budget).Run();
}

}  // namespace memest
