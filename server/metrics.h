// Prometheus metrics of memest-server (prometheus-cpp), served over HTTP at /metrics on
// --metrics-address:
//
//   memest_requests_total{method,code}            calls finished, by method and status code
//   memest_request_duration_seconds{method}       their latency, arrival to reply (histogram)
//   memest_request_bytes{method}                  request sizes (histogram)
//   memest_queue_wait_seconds                     how long estimates and plans waited for a thread
//   memest_engine_seconds                         an estimate's time once it had a thread:
//   conversion,
//                                                 engine and advice (histogram)
//   memest_work_running, memest_work_queued       estimates and plans running and waiting now
//   memest_work_threads, memest_work_queue_limit  the pool's size and queue bound
//   memest_work_refused_total                     calls refused because the queue was full
//   memest_validations_in_queue                   validations running or waiting now
//   memest_build_info{version}                    1
//
// The gauges are read from the pool and the validation queue when Prometheus scrapes.
#ifndef MEMEST_SERVER_METRICS_H_
#define MEMEST_SERVER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "engine/ir/status.h"
#include "server/work_pool.h"

namespace memest {

class Metrics {
 public:
  // What the gauges read at each scrape.
  struct Sources {
    std::function<WorkPool::Load()> work;
    int threads = 0, max_queued = 0;
    std::function<int()> validations_in_queue;
    std::string version;  // memest_build_info's label
  };

  // Serves /metrics on `address` (HOST:PORT; port 0: any free port). UNAVAILABLE when it
  // cannot be bound.
  static StatusOr<std::unique_ptr<Metrics>> Start(const std::string& address, Sources sources);
  ~Metrics();

  int port() const { return port_; }

  // One finished call: its method ("Estimate"), status code, seconds from arrival to reply, and
  // the request's size in bytes (negative: not known).
  void Finished(const char* method, StatusCode code, double seconds, int64_t request_bytes);
  // An estimate's or plan's wait for a thread, and an estimate's time once it had one.
  void Waited(double seconds);
  void Engine(double seconds);

 private:
  Metrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> gauges_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Histogram>* durations_ = nullptr;
  prometheus::Family<prometheus::Histogram>* sizes_ = nullptr;
  prometheus::Histogram* wait_ = nullptr;
  prometheus::Histogram* engine_ = nullptr;
  int port_ = 0;
};

}  // namespace memest

#endif  // MEMEST_SERVER_METRICS_H_
