// A server-streaming call whose work runs on a thread of its own (never on gRPC's callback
// threads): Validate waits for its turn and its worker, Plan searches for seconds.
//
// The work gets `send` (queue one reply; false once the client went away or cancelled) and
// `stopped` (true once it did), and returns the call's status; the reactor writes the replies
// one at a time (a write reactor allows one outstanding write), finishes after the last, and
// logs the call as one line (method, model, code, microseconds, peer, error).
#ifndef MEMEST_SERVER_STREAM_REACTOR_H_
#define MEMEST_SERVER_STREAM_REACTOR_H_

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "engine/ir/status.h"

namespace memest {

class StreamReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  using SendFn = std::function<bool(const google::protobuf::Message&)>;
  using StoppedFn = std::function<bool()>;
  using Work = std::function<Status(const SendFn& send, const StoppedFn& stopped)>;

  // Starts `work` on its thread. `method` and `model` name the call in its log line.
  StreamReactor(grpc::CallbackServerContext* context, std::string method, std::string model,
                Work work);

  void OnWriteDone(bool ok) override;
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override;

 private:
  bool Stopped();
  bool Send(const google::protobuf::Message& reply);
  void Complete(const Status& status);
  bool TakeFinishLocked();

  grpc::CallbackServerContext* context_;
  const std::chrono::steady_clock::time_point start_;
  const std::string method_, model_;
  const std::string id_;  // server/request_id.h
  std::thread thread_;
  std::mutex mu_;
  std::deque<grpc::ByteBuffer> pending_;  // front: being written
  std::atomic<bool> cancelled_{false};
  bool broken_ = false, finish_ = false, finished_ = false;
  grpc::Status status_;
};

}  // namespace memest

#endif  // MEMEST_SERVER_STREAM_REACTOR_H_
