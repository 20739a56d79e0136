#include "server/work_pool.h"

#include <sched.h>

#include <algorithm>
#include <exception>
#include <fstream>
#include <string>
#include <utility>

namespace memest {

WorkPool::WorkPool(int threads, int max_queued) : max_queued_(std::max(0, max_queued)) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Work(); });
}

WorkPool::~WorkPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

bool WorkPool::TrySubmit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A job is taken at once when a thread is idle; it waits only behind running ones.
    const int idle = static_cast<int>(threads_.size()) - load_.running - load_.queued;
    if (idle <= 0 && load_.queued >= max_queued_) {
      ++load_.refused;
      return false;
    }
    queue_.push_back(std::move(job));
    ++load_.queued;
  }
  wake_.notify_one();
  return true;
}

WorkPool::Load WorkPool::load() const {
  std::lock_guard<std::mutex> lock(mu_);
  return load_;
}

void WorkPool::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    --load_.queued;
    ++load_.running;
    lock.unlock();
    try {
      job();  // the service's jobs catch their own (CatchAll); this keeps the thread regardless
    } catch (...) {
    }
    job = nullptr;  // what the job holds is freed before it counts as done
    lock.lock();
    --load_.running;
  }
}

// The cores a cgroup v2 CPU limit allows (a Kubernetes pod's `limits.cpu`), rounded up; 0 when
// there is none. A pod limited to 2 CPUs on a 64-core node still sees 64 cores by affinity.
int CgroupCpuLimit(const std::string& cpu_max_path) {
  std::ifstream file(cpu_max_path);
  std::string quota;
  int64_t period = 0;
  if (!(file >> quota >> period) || quota == "max" || period <= 0) return 0;
  int64_t q = 0;
  try {
    q = std::stoll(quota);
  } catch (const std::exception&) {
    return 0;
  }
  if (q <= 0) return 0;
  return static_cast<int>(std::min<int64_t>((q + period - 1) / period, 1 << 16));
}

int DefaultWorkThreads() {
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0) cores = CPU_COUNT(&cpus);
  const int limit = CgroupCpuLimit("/sys/fs/cgroup/cpu.max");
  if (limit > 0) cores = std::min(cores, limit);
  return std::max(1, cores);
}

}  // namespace memest
