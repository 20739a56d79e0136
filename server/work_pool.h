// WorkPool: the threads that run estimates, and the bound on how many may wait.
//
// gRPC's callback threads also answer health checks and accept calls: work that holds one for
// seconds starves them (measured before this pool: with 16 callers, health checks took 0.8 s at
// the median; with 64 expensive ones every check missed its 2 s deadline). Estimates and plans
// therefore run here, on a fixed number of threads (a core each), and wait in a bounded queue;
// a call that finds the queue full is refused at once (RESOURCE_EXHAUSTED) instead of waiting
// minutes behind the others.
//
// Jobs run in the order they came. The destructor runs the jobs still queued, then joins.
#ifndef MEMEST_SERVER_WORK_POOL_H_
#define MEMEST_SERVER_WORK_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace memest {

class WorkPool {
 public:
  // `threads` >= 1 run jobs; at most `max_queued` >= 0 wait for one.
  WorkPool(int threads, int max_queued);
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // Queues `job`, or returns false (and drops it) when `max_queued` jobs wait already.
  bool TrySubmit(std::function<void()> job);

  struct Load {
    int running = 0;      // jobs running now
    int queued = 0;       // jobs waiting now
    int64_t refused = 0;  // TrySubmit calls that found the queue full, since the start
  };
  Load load() const;
  int threads() const { return static_cast<int>(threads_.size()); }
  int max_queued() const { return max_queued_; }

 private:
  void Work();

  const int max_queued_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  Load load_;                                // guarded by mu_ (queued mirrors queue_.size())
  bool stopping_ = false;                    // guarded by mu_
  std::vector<std::thread> threads_;
};

// The threads a pool gets by default: one per core this process may use (its CPU affinity, and
// its cgroup's CPU limit rounded up), at least 1.
int DefaultWorkThreads();
// The cores a cgroup v2 `cpu.max` file ("200000 100000": 2) allows, rounded up; 0 for "max",
// a missing file or one that does not parse.
int CgroupCpuLimit(const std::string& cpu_max_path);

}  // namespace memest

#endif  // MEMEST_SERVER_WORK_POOL_H_
