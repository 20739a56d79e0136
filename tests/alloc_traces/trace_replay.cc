#include "tests/alloc_traces/trace_replay.h"

#include <algorithm>
#include <sstream>

#include "engine/step/allocator.h"

namespace memest {
namespace {

// Reads "<prefix><int64>" (e.g. "r123"), as the event lines write their optional fields.
bool Tagged(const std::string& token, char prefix, int64_t* value) {
  if (token.size() < 2 || token[0] != prefix) return false;
  try {
    size_t used = 0;
    *value = std::stoll(token.substr(1), &used);
    return used == token.size() - 1;
  } catch (...) {
    return false;
  }
}

}  // namespace

bool ParseAllocTrace(const std::string& name, const std::string& text, AllocTrace* t,
                     std::string* error) {
  *t = AllocTrace();
  t->name = name;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  bool in_events = false, ended = false;
  int64_t reserved = 0;
  auto fail = [&](const std::string& why) {
    *error = name + ":" + std::to_string(line_no) + ": " + why + ": " + line;
    return false;
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    if (ended) return fail("text after end");
    std::istringstream ls(line);
    std::string word;
    ls >> word;
    if (!in_events) {
      if (word == "expandable") {
        int v = 0;
        if (!(ls >> v)) return fail("bad expandable");
        t->expandable = v != 0;
      } else if (word == "capacity") {
        if (!(ls >> t->capacity_lo >> t->capacity_hi)) return fail("bad capacity");
      } else if (word == "segment") {
        AllocTrace::Segment s;
        if (!(ls >> s.stream >> s.bytes >> s.address) || s.bytes <= 0) return fail("bad segment");
        t->segments.push_back(s);
        t->start_reserved += s.bytes;
      } else if (word == "block") {
        AllocTrace::Block b;
        if (!(ls >> b.segment >> b.offset >> b.bytes) || b.segment < 0 ||
            b.segment >= static_cast<int>(t->segments.size())) {
          return fail("bad block");
        }
        t->blocks.push_back(b);
      } else if (word == "events") {
        in_events = true;
        reserved = t->start_reserved;
      } else {
        return fail("unknown line");
      }
      continue;
    }
    if (word == "end") {
      if (!(ls >> t->peak_reserved >> t->end_reserved >> t->end_segments)) return fail("bad end");
      ended = true;
      continue;
    }
    AllocTrace::Event e;
    std::string token;
    if (word == "f") {
      e.kind = AllocTrace::Kind::kFree;
      if (!(ls >> e.handle)) return fail("bad free");
      e.reserved = reserved;
      t->events.push_back(e);
      continue;
    }
    if (word == "a" || word == "o") {
      e.kind = word == "a" ? AllocTrace::Kind::kAlloc : AllocTrace::Kind::kOom;
      if (!(ls >> e.bytes)) return fail("bad request");
    } else if (word == "e") {
      e.kind = AllocTrace::Kind::kEmptyCache;
    } else {
      return fail("unknown event");
    }
    while (ls >> token) {
      int64_t v = 0;
      if (Tagged(token, 'r', &v)) {
        reserved = v;
      } else if (Tagged(token, 's', &v)) {
        e.stream = static_cast<int>(v);
      } else if (Tagged(token, 'g', &v)) {
        e.new_segment = v;
      } else {
        return fail("bad field " + token);
      }
    }
    e.reserved = reserved;
    t->events.push_back(e);
  }
  if (!ended) {
    *error = name + ": no end line";
    return false;
  }
  return true;
}

namespace {

// Rebuilds the start state with the model's own requests: each segment, in address order, is
// reserved whole by one request and freed (a 2 MiB small segment by its first block instead),
// then carved block by block, the free gaps as stand-ins that are freed at the end. Best fit
// has no other choice while every earlier segment is full. Returns the handles of the start
// blocks, or an error when the model did not place a block where the trace has it.
bool RebuildStart(const AllocTrace& t, const ReplayOptions& o, CachingAllocatorModel* m,
                  std::vector<int>* handles, std::string* error) {
  std::vector<int> gaps;
  std::vector<std::vector<int>> by_segment(t.segments.size());
  for (int i = 0; i < static_cast<int>(t.blocks.size()); ++i) {
    by_segment[t.blocks[i].segment].push_back(i);
  }
  handles->assign(t.blocks.size(), -1);
  for (int s = 0; s < static_cast<int>(t.segments.size()); ++s) {
    const AllocTrace::Segment& seg = t.segments[s];
    const bool small = seg.bytes == CachingAllocatorModel::kSmallBuffer;
    const int64_t before = m->reserved();
    const int stream = o.streams ? seg.stream : 0;
    if (o.addresses) m->SetNextSegmentAddress(seg.address);
    if (!small) m->Free(m->Malloc(seg.bytes, stream));
    // (piece bytes, start block index or -1 for a gap)
    std::vector<std::pair<int64_t, int>> pieces;
    auto add_gap = [&](int64_t bytes) {
      const int64_t most = small ? CachingAllocatorModel::kSmallSize : bytes;
      for (; bytes > 0; bytes -= std::min(bytes, most)) {
        pieces.push_back({std::min(bytes, most), -1});
      }
    };
    int64_t at = 0;
    for (int i : by_segment[s]) {
      add_gap(t.blocks[i].offset - at);
      pieces.push_back({t.blocks[i].bytes, i});
      at = t.blocks[i].offset + t.blocks[i].bytes;
    }
    add_gap(seg.bytes - at);
    for (const auto& [bytes, index] : pieces) {
      const int h = m->Malloc(bytes, stream);
      if (h < 0) {
        *error = "the model refused a start block";
        return false;
      }
      if (index < 0) {
        gaps.push_back(h);
      } else {
        (*handles)[index] = h;
      }
    }
    if (m->reserved() != before + seg.bytes) {
      *error = "start segment " + std::to_string(s) + " reserved " +
               std::to_string(m->reserved() - before) + " bytes, not " + std::to_string(seg.bytes);
      return false;
    }
    for (int i : by_segment[s]) {
      const auto where = m->Locate((*handles)[i]);
      if (where.segment != s || where.offset != t.blocks[i].offset) {
        *error = "start block " + std::to_string(i) + " not at its place";
        return false;
      }
    }
  }
  for (int h : gaps) m->Free(h);
  return true;
}

}  // namespace

ReplayResult ReplayAllocTrace(const AllocTrace& t, int64_t capacity, const ReplayOptions& o) {
  ReplayResult r;
  if (t.expandable && !t.segments.empty()) {
    r.error = "an expandable-segments trace must start empty";
    return r;
  }
  CachingAllocatorModel m(t.expandable, capacity);
  std::vector<int> handles;
  if (!RebuildStart(t, o, &m, &handles, &r.error)) return r;
  r.peak_reserved = m.reserved();
  for (int i = 0; i < static_cast<int>(t.events.size()); ++i) {
    const AllocTrace::Event& e = t.events[i];
    switch (e.kind) {
      case AllocTrace::Kind::kFree:
        if (e.handle < 0 || e.handle >= static_cast<int>(handles.size())) {
          r.error = "free of an unknown handle";
          return r;
        }
        if (handles[e.handle] >= 0) m.Free(handles[e.handle]);
        handles[e.handle] = -1;
        continue;
      case AllocTrace::Kind::kAlloc:
        if (o.addresses && e.new_segment >= 0) m.SetNextSegmentAddress(e.new_segment);
        handles.push_back(m.Malloc(e.bytes, o.streams ? e.stream : 0));
        if (handles.back() < 0) ++r.refused;
        break;
      case AllocTrace::Kind::kOom: {
        // The request failed on the GPU: the model must refuse it too.
        const int ooms = m.ooms();
        const int h = m.Malloc(e.bytes, o.streams ? e.stream : 0);
        if (h >= 0) {
          ++r.granted;
          m.Free(h);
        } else if (m.ooms() != ooms + 1) {
          ++r.refused;
        }
        break;
      }
      case AllocTrace::Kind::kEmptyCache:
        m.EmptyCache();
        break;
    }
    ++r.events;
    r.peak_reserved = std::max(r.peak_reserved, m.reserved());
    if (m.reserved() == e.reserved) {
      ++r.events_matching;
    } else if (r.first_mismatch < 0) {
      r.first_mismatch = i;
    }
  }
  r.replayed = true;
  r.ooms = m.ooms();
  r.end_reserved = m.reserved();
  r.end_segments = m.segments();
  return r;
}

}  // namespace memest
