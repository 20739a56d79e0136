// Giving the heap back after large requests. glibc keeps freed pages in its arenas; a server that
// answered one big model would stay that size. Two things keep it near its idle size:
// - blocks of 4 MiB and more (a large model's op and schedule arrays) get pages of their own
//   (mmap), returned when freed. glibc's default threshold starts at 128 KiB but rises to the
//   largest block freed so far, after which such blocks land in the arenas between small ones
//   that pin their pages: measured, three 27,000-op requests side by side left 15 to 29 MiB
//   resident over idle, 4 to 5 MiB with the fixed threshold, and the same requests per second;
// - the free pages left are given back (malloc_trim) when the last request in flight ends after
//   a large one: not when each large request ends, which with requests side by side trims while
//   the others still hold their graphs.
// With tcmalloc linked (CMakeLists.txt, MEMEST_TCMALLOC) the threshold does not apply (tcmalloc
// keeps large blocks in spans of their own) and the trim is tcmalloc's ReleaseFreeMemory, which
// returns every free page of its page heap.
// Constructing a HeapTrimmer sets the threshold for the whole process (the server's).
#ifndef MEMEST_SERVER_HEAP_TRIM_H_
#define MEMEST_SERVER_HEAP_TRIM_H_

#include <mutex>

namespace memest {

class HeapTrimmer {
 public:
  HeapTrimmer();

  // One request in flight: made before the request's memory, destroyed after it is freed.
  class Request {
   public:
    explicit Request(HeapTrimmer& trimmer) : trimmer_(trimmer) { trimmer_.Begin(); }
    ~Request() { trimmer_.End(); }
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;

    // This request was large: trim once no request is in flight.
    void MarkLarge() { trimmer_.MarkLarge(); }

   private:
    HeapTrimmer& trimmer_;
  };

  // How many times the heap was trimmed (for tests).
  int trims() const;

 private:
  void Begin();
  void MarkLarge();
  void End();

  mutable std::mutex mutex_;
  int in_flight_ = 0;     // guarded by mutex_
  bool pending_ = false;  // a large request ended since the last trim; guarded by mutex_
  int trims_ = 0;         // guarded by mutex_
};

}  // namespace memest

#endif  // MEMEST_SERVER_HEAP_TRIM_H_
