// A server-streaming call whose work runs on a thread of its own or on the service's WorkPool
// (never on gRPC's callback threads): Validate waits for its turn and its worker on a thread of
// its own; Plan searches for seconds on the pool, refused as busy when its queue is full.
//
// The work gets `send` (queue one reply; false once the client went away or cancelled) and
// `stopped` (true once it did), and returns the call's status; the reactor writes the replies
// one at a time (a write reactor allows one outstanding write), finishes after the last, and
// logs the call as one line (method, model, code, microseconds, peer, error). A client that
// reads slower than the work sends holds the work back: `send` waits while kMaxQueuedBytes of
// replies wait to be written (a Sweep's thousands of results are not all kept in memory), and a
// reader that takes none of them for `max_stall` (kMaxStall unless given) is cancelled (its
// thread goes to other calls).
#ifndef MEMEST_SERVER_STREAM_REACTOR_H_
#define MEMEST_SERVER_STREAM_REACTOR_H_

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>

#include "engine/ir/status.h"
#include "server/call_log.h"
#include "server/work_pool.h"

namespace memest {

class StreamReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  using SendFn = std::function<bool(const google::protobuf::Message&)>;
  using StoppedFn = std::function<bool()>;
  using Work = std::function<Status(const SendFn& send, const StoppedFn& stopped)>;
  static constexpr size_t kMaxQueuedBytes = 4 << 20;
  static constexpr std::chrono::milliseconds kMaxStall{60'000};

  // Starts `work` on a thread of its own (`pool` null) or queues it on `pool`; when the pool is
  // full the call finishes with `busy()`. `call` names the call in its log line (its id and
  // start are filled in here); `metrics` (null: none) counts it.
  StreamReactor(grpc::CallbackServerContext* context, CallRecord call, Metrics* metrics, Work work,
                WorkPool* pool = nullptr, const std::function<Status()>& busy = nullptr,
                std::chrono::milliseconds max_stall = kMaxStall);
  // A call refused before any work (UNAUTHENTICATED, a request that does not parse): finished at
  // once with `refusal`, taking no thread and no place in a queue.
  StreamReactor(grpc::CallbackServerContext* context, CallRecord call, Metrics* metrics,
                const Status& refusal);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override { Release(); }

 private:
  // The work and gRPC (OnDone) each hold the reactor; the last to let go deletes it.
  void Release();
  bool Stopped();
  bool Send(const google::protobuf::Message& reply);
  void Complete(const Status& status);
  bool TakeFinishLocked();

  grpc::CallbackServerContext* context_;
  CallRecord call_;
  Metrics* const metrics_;
  std::atomic<int> owners_{2};
  std::mutex mu_;
  std::chrono::milliseconds max_stall_ = kMaxStall;
  std::condition_variable drained_;       // a write completed, or the call stopped
  std::deque<grpc::ByteBuffer> pending_;  // front: being written
  size_t pending_bytes_ = 0;
  std::atomic<bool> cancelled_{false};
  bool broken_ = false, finish_ = false, finished_ = false;
  grpc::Status status_;
};

}  // namespace memest

#endif  // MEMEST_SERVER_STREAM_REACTOR_H_
