// alloc_trace_replay FILE...: replays allocator event files (tests/alloc_traces/data/) through
// CachingAllocatorModel and prints one Markdown table row per file: the peak and end reserved
// bytes recorded and modelled, and how many events leave reserved as recorded. A trace whose
// recording needed a device capacity is replayed at both ends of the capacities it allows.
// Exits 1 unless every trace is reproduced exactly.
//
// To measure what each rule and piece of information is needed for, these options leave one
// out: --no-capacity (replays with no device capacity), --no-streams (every request on the
// default stream), --no-addresses (each new segment above the others).
#include <fstream>
#include <iostream>
#include <sstream>

#include "tests/alloc_traces/trace_replay.h"

int main(int argc, char** argv) {
  memest::ReplayOptions options;
  bool capacity = true;
  int first = 1;
  for (; first < argc && std::string(argv[first]).rfind("--", 0) == 0; ++first) {
    const std::string flag = argv[first];
    if (flag == "--no-capacity") {
      capacity = false;
    } else if (flag == "--no-streams") {
      options.streams = false;
    } else if (flag == "--no-addresses") {
      options.addresses = false;
    } else {
      std::cerr << "unknown option " << flag << "\n";
      return 2;
    }
  }
  int exact = 0, total = 0, fine = 0;
  std::cout << "| trace | events | peak reserved | model | end reserved | model | events exact |"
               " exact | at the highest capacity |\n"
               "|---|---:|---:|---:|---:|---:|---:|---|---|\n";
  for (int i = first; i < argc; ++i) {
    std::ifstream f(argv[i]);
    std::stringstream text;
    text << f.rdbuf();
    std::string name = argv[i], error;
    name = name.substr(name.find_last_of('/') + 1);
    memest::AllocTrace t;
    if (!f || !memest::ParseAllocTrace(name, text.str(), &t, &error)) {
      std::cerr << (f ? error : "cannot read " + name) << "\n";
      return 2;
    }
    ++total;
    if (!capacity) t.capacity_lo = t.capacity_hi = 0;
    const memest::ReplayResult r = memest::ReplayAllocTrace(t, t.capacity_lo, options);
    bool ok = r.Exact(t);
    std::string at_hi = "-";
    if (t.capacity_hi != t.capacity_lo) {
      const bool hi_ok = memest::ReplayAllocTrace(t, t.capacity_hi, options).Exact(t);
      at_hi = hi_ok ? "yes" : "no";
      ok = ok && hi_ok;
    }
    std::cout << "| " << name << " | " << r.events << " | " << t.peak_reserved << " | "
              << (r.replayed ? std::to_string(r.peak_reserved) : r.error) << " | " << t.end_reserved
              << " | " << r.end_reserved << " | " << r.events_matching << " | "
              << (r.Exact(t) ? "yes" : "no") << " | " << at_hi << " |\n";
    if (r.replayed && r.events_matching == r.events) ++fine;
    if (ok) ++exact;
  }
  std::cout << "\n"
            << exact << " of " << total << " traces exact (peak and end reserved); " << fine
            << " match after every event\n";
  return exact == total ? 0 : 1;
}
