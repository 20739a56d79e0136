#include "server/metrics.h"

#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <exception>
#include <utility>
#include <vector>

#include "engine/ir/text.h"

namespace memest {
namespace {

// Latencies from 1 ms (a small estimate) to the 30 s of a deadline.
const prometheus::Histogram::BucketBoundaries kSeconds = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
// Request sizes from 100 bytes (a preset) to 64 MiB (the default --max-message-bytes).
const prometheus::Histogram::BucketBoundaries kBytes = {100, 1e3, 1e4, 1e5, 1e6, 4e6, 16e6, 64e6};

prometheus::MetricFamily Gauge(const char* name, const char* help, double value,
                               prometheus::MetricType type = prometheus::MetricType::Gauge) {
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  return {name, help, type, {metric}};
}

// The gauges read at each scrape.
class LoadGauges : public prometheus::Collectable {
 public:
  explicit LoadGauges(Metrics::Sources sources) : sources_(std::move(sources)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    const WorkPool::Load load = sources_.work ? sources_.work() : WorkPool::Load{};
    std::vector<prometheus::MetricFamily> families = {
        Gauge("memest_work_running", "Estimates and plans running now", load.running),
        Gauge("memest_work_queued", "Estimates and plans waiting for a thread now", load.queued),
        Gauge("memest_work_threads", "Threads that run estimates and plans", sources_.threads),
        Gauge("memest_work_queue_limit", "The most estimates and plans that may wait",
              sources_.max_queued),
        Gauge("memest_work_refused_total", "Calls refused because the queue was full",
              static_cast<double>(load.refused), prometheus::MetricType::Counter),
        Gauge("memest_validations_in_queue", "Validations running or waiting now",
              sources_.validations_in_queue ? sources_.validations_in_queue() : 0),
    };
    prometheus::MetricFamily info = Gauge("memest_build_info", "The build, as --version", 1);
    info.metric[0].label.push_back({"version", sources_.version});
    families.push_back(std::move(info));
    return families;
  }

 private:
  const Metrics::Sources sources_;
};

}  // namespace

StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& address, Sources sources) {
  std::unique_ptr<Metrics> metrics(new Metrics());
  metrics->registry_ = std::make_shared<prometheus::Registry>();
  prometheus::Registry& registry = *metrics->registry_;
  metrics->requests_ = &prometheus::BuildCounter()
                            .Name("memest_requests_total")
                            .Help("Calls finished, by method and status code")
                            .Register(registry);
  metrics->durations_ = &prometheus::BuildHistogram()
                             .Name("memest_request_duration_seconds")
                             .Help("Latency of a call, from its arrival to its reply")
                             .Register(registry);
  metrics->sizes_ = &prometheus::BuildHistogram()
                         .Name("memest_request_bytes")
                         .Help("Size of a request, in bytes")
                         .Register(registry);
  metrics->wait_ = &prometheus::BuildHistogram()
                        .Name("memest_queue_wait_seconds")
                        .Help("How long an estimate or plan waited for a thread")
                        .Register(registry)
                        .Add({}, kSeconds);
  metrics->engine_ =
      &prometheus::BuildHistogram()
           .Name("memest_engine_seconds")
           .Help("Time an estimate took once it had a thread: conversion, engine and advice")
           .Register(registry)
           .Add({}, kSeconds);
  metrics->gauges_ = std::make_shared<LoadGauges>(std::move(sources));
  try {
    metrics->exposer_ = std::make_unique<prometheus::Exposer>(address, 1);
  } catch (const std::exception& error) {
    return Unavailable("metrics_address: could not listen on " + Quote(address) + ": " +
                       Escape(error.what()));
  }
  const std::vector<int> ports = metrics->exposer_->GetListeningPorts();
  metrics->port_ = ports.empty() ? 0 : ports[0];
  metrics->exposer_->RegisterCollectable(metrics->registry_);
  metrics->exposer_->RegisterCollectable(metrics->gauges_);
  return metrics;
}

Metrics::~Metrics() = default;

void Metrics::Finished(const char* method, StatusCode code, double seconds, int64_t request_bytes) {
  requests_->Add({{"method", method}, {"code", StatusCodeName(code)}}).Increment();
  durations_->Add({{"method", method}}, kSeconds).Observe(seconds);
  if (request_bytes >= 0) {
    sizes_->Add({{"method", method}}, kBytes).Observe(static_cast<double>(request_bytes));
  }
}

void Metrics::Waited(double seconds) { wait_->Observe(seconds); }

void Metrics::Engine(double seconds) { engine_->Observe(seconds); }

}  // namespace memest
