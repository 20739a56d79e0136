#include "server/stream_reactor.h"

#include <thread>
#include <utility>

#include "server/request_id.h"
#include "server/status_conversion.h"
#include "server/wire.h"

namespace memest {

StreamReactor::StreamReactor(grpc::CallbackServerContext* context, CallRecord call,
                             Metrics* metrics, Work work, WorkPool* pool,
                             const std::function<Status()>& busy,
                             std::chrono::milliseconds max_stall)
    : context_(context), call_(std::move(call)), metrics_(metrics), max_stall_(max_stall) {
  call_.id = TagRequest(context);
  call_.start = std::chrono::steady_clock::now();
  auto run = [this, work = std::move(work), pooled = pool != nullptr] {
    if (pooled && metrics_ != nullptr) {
      metrics_->Waited(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - call_.start).count());
    }
    Complete(CatchAll([&] {
      return work([this](const google::protobuf::Message& m) { return Send(m); },
                  [this] { return Stopped(); });
    }));
    Release();
  };
  if (pool == nullptr) {
    std::thread(std::move(run)).detach();
  } else if (!pool->TrySubmit(std::move(run))) {
    Complete(busy());
    Release();
  }
}

StreamReactor::StreamReactor(grpc::CallbackServerContext* context, CallRecord call,
                             Metrics* metrics, const Status& refusal)
    : context_(context), call_(std::move(call)), metrics_(metrics) {
  call_.id = TagRequest(context);
  call_.start = std::chrono::steady_clock::now();
  Complete(refusal);
  Release();  // no work holds it
}

void StreamReactor::OnCancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
  }
  drained_.notify_all();
}

void StreamReactor::OnWriteDone(bool ok) {
  const grpc::ByteBuffer* next = nullptr;
  bool finish = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_bytes_ -= pending_.front().Length();
    pending_.pop_front();
    if (!ok) broken_ = true;  // the client went away; the work notices through Stopped()
    if (!pending_.empty() && !broken_) {
      next = &pending_.front();  // deque: stays put while later replies are pushed
    } else {
      finish = TakeFinishLocked();
    }
  }
  drained_.notify_all();
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
    std::unique_lock<std::mutex> lock(mu_);
    // A slow reader: wait for its writes (a cancellation, the deadline's too, wakes this). A
    // reader that takes nothing for max_stall_ is dropped: the call is cancelled, which ends the
    // write and wakes this.
    auto ready = [this] { return cancelled_ || broken_ || pending_bytes_ < kMaxQueuedBytes; };
    if (!drained_.wait_for(lock, max_stall_, ready)) {
      lock.unlock();  // OnCancel takes the lock
      context_->TryCancel();
      lock.lock();
      drained_.wait(lock, ready);
    }
    if (cancelled_ || broken_) return false;
    pending_bytes_ += bytes.Length();
    pending_.push_back(std::move(bytes));
    if (pending_.size() == 1) first = &pending_.front();  // nothing in flight: start it
  }
  if (first != nullptr) StartWrite(first);
  return true;
}

void StreamReactor::Complete(const Status& status) {
  RecordCall(*context_, call_, status, metrics_);
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
