#include "engine/step/fold.h"

namespace memest {

std::optional<RepeatedSpan> FindRepeatedSpan(const Schedule& s,
                                             const std::vector<int>& action_event,
                                             const std::vector<int>& action_id,
                                             const PipelineFold& fold) {
  const size_t end = static_cast<size_t>(fold.end);
  const size_t period = static_cast<size_t>(fold.period);
  if (end + 1 > action_event.size() || end < 2 * period || fold.zone < 0 ||
      static_cast<size_t>(fold.zone) >= action_id.size()) {
    return std::nullopt;
  }
  const int before = action_event[end - 2 * period];
  const int begin = action_event[end - period];
  const int finish = action_event[end];
  const int ids = action_id[end] - action_id[end - period];
  const int first_id = action_id[static_cast<size_t>(fold.zone)];
  if (begin - before != finish - begin || action_id[end - period] - action_id[end - 2 * period] != ids) {
    return std::nullopt;
  }
  for (int k = 0; k < finish - begin; ++k) {
    const Event& was = s.events[static_cast<size_t>(before + k)];
    const Event& now = s.events[static_cast<size_t>(begin + k)];
    if (was.kind != now.kind || was.category != now.category || was.bytes != now.bytes) {
      return std::nullopt;
    }
    const int x = was.buffer, y = now.buffer;
    switch (now.kind) {
      case EventKind::kAlloc:
        if (y != x + ids) return std::nullopt;
        break;
      case EventKind::kFree:
      case EventKind::kRetag:
        if (!(x >= first_id && y == x + ids) && !(y < first_id && y == x)) return std::nullopt;
        break;
      case EventKind::kContext: {
        const StepContext& a = s.contexts[static_cast<size_t>(x)];
        const StepContext& b = s.contexts[static_cast<size_t>(y)];
        if (a.phase != b.phase || a.op != b.op || a.recompute != b.recompute ||
            b.micro_batch != a.micro_batch + fold.stride) {
          return std::nullopt;
        }
        break;
      }
    }
  }
  RepeatedSpan r;
  r.begin_event = begin;
  r.end_event = finish;
  r.first_id = first_id;
  r.ids = ids;
  r.copies = fold.copies;
  r.micro_batch_stride = static_cast<int>(fold.stride);
  return r;
}

}  // namespace memest
