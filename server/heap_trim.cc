#include "server/heap_trim.h"

#include <malloc.h>

// gperftools' tcmalloc, when the server is linked with it (CMakeLists.txt, MEMEST_TCMALLOC): it
// keeps freed pages in its own page heap, which glibc's malloc_trim does not see.
extern "C" void MallocExtension_ReleaseFreeMemory(void) __attribute__((weak));

namespace memest {
namespace {

constexpr int kMmapThreshold = 4 << 20;

void GiveBackFreePages() {
  if (MallocExtension_ReleaseFreeMemory != nullptr) {
    MallocExtension_ReleaseFreeMemory();
  } else {
    malloc_trim(0);
  }
}

}  // namespace

HeapTrimmer::HeapTrimmer() { mallopt(M_MMAP_THRESHOLD, kMmapThreshold); }

void HeapTrimmer::Begin() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++in_flight_;
}

void HeapTrimmer::MarkLarge() {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_ = true;
}

void HeapTrimmer::End() {
  // The request that leaves the server idle trims, once, for every large request before it.
  // Under the lock, so that a request starting meanwhile cannot take the trim meant for it.
  std::lock_guard<std::mutex> lock(mutex_);
  if (--in_flight_ == 0 && pending_) {
    pending_ = false;
    GiveBackFreePages();
    ++trims_;
  }
}

int HeapTrimmer::trims() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return trims_;
}

}  // namespace memest
