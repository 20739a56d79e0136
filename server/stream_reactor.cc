#include "server/stream_reactor.h"

#include <spdlog/spdlog.h>

#include <thread>
#include <utility>

#include "engine/ir/text.h"
#include "server/request_id.h"
#include "server/status_conversion.h"
#include "server/wire.h"

namespace memest {
namespace {

// The most bytes of an error a log line repeats (as in estimator_service.cc).
constexpr size_t kMaxLoggedError = 1024;

}  // namespace

StreamReactor::StreamReactor(grpc::CallbackServerContext* context, std::string method,
                             std::string model, Work work, WorkPool* pool,
                             const std::function<Status()>& busy)
    : context_(context),
      start_(std::chrono::steady_clock::now()),
      method_(std::move(method)),
      model_(std::move(model)),
      id_(TagRequest(context)) {
  auto run = [this, work = std::move(work)] {
    Complete(work([this](const google::protobuf::Message& m) { return Send(m); },
                  [this] { return Stopped(); }));
    Release();
  };
  if (pool == nullptr) {
    std::thread(std::move(run)).detach();
  } else if (!pool->TrySubmit(std::move(run))) {
    Complete(busy());
    Release();
  }
}

void StreamReactor::OnWriteDone(bool ok) {
  const grpc::ByteBuffer* next = nullptr;
  bool finish = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.pop_front();
    if (!ok) broken_ = true;  // the client went away; the work notices through Stopped()
    if (!pending_.empty() && !broken_) {
      next = &pending_.front();  // deque: stays put while later replies are pushed
    } else {
      finish = TakeFinishLocked();
    }
  }
  if (next != nullptr) StartWrite(next);
  if (finish) Finish(status_);
}

void StreamReactor::Release() {
  if (owners_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

bool StreamReactor::Stopped() {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_ || broken_;
}

bool StreamReactor::Send(const google::protobuf::Message& reply) {
  const grpc::ByteBuffer* first = nullptr;
  grpc::ByteBuffer bytes;
  if (!SerializeReply(reply, &bytes).ok()) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_ || broken_) return false;
    pending_.push_back(std::move(bytes));
    if (pending_.size() == 1) first = &pending_.front();  // nothing in flight: start it
  }
  if (first != nullptr) StartWrite(first);
  return true;
}

void StreamReactor::Complete(const Status& status) {
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now() - start_)
                          .count();
  if (status.ok()) {
    spdlog::info("rpc={} id={} model={} code=OK us={} peer={}", method_, id_, model_, micros,
                 context_->peer());
  } else {
    spdlog::info("rpc={} id={} model={} code={} us={} peer={} error=\"{}\"", method_, id_, model_,
                 StatusCodeName(status.code()), micros, context_->peer(),
                 BoundMessage(status.message(), kMaxLoggedError));
  }
  bool finish = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = ToGrpcStatus(status);
    finish_ = true;
    if (pending_.empty() || broken_) finish = TakeFinishLocked();
  }
  if (finish) Finish(status_);
}

// True once: when the work is complete and the last write is done (or never will be).
bool StreamReactor::TakeFinishLocked() {
  if (!finish_ || finished_) return false;
  finished_ = true;
  return true;
}

}  // namespace memest
