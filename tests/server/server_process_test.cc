// Runs the memest-server binary as a subprocess: it prints the port it chose, serves health,
// and exits 0 soon after SIGTERM.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "health_client.h"
#include "memest/v1/memest.grpc.pb.h"
#include "tests/server/test_server.h"

extern char** environ;

namespace memest {
namespace {

using Clock = std::chrono::steady_clock;

// A child process whose stdout we read; killed (SIGKILL) and reaped if still running at the end.
class ServerProcess {
 public:
  explicit ServerProcess(const std::vector<std::string>& args) {
    int fds[2];
    if (pipe(fds) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    posix_spawn_file_actions_addclose(&actions, fds[1]);
    std::vector<char*> argv;
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    stdout_ = fds[0];
  }

  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (stdout_ >= 0) close(stdout_);
  }

  bool started() const { return pid_ > 0; }

  // The next line of the child's stdout, or nullopt at EOF or after `timeout`.
  std::optional<std::string> ReadLine(std::chrono::milliseconds timeout) {
    const Clock::time_point deadline = Clock::now() + timeout;
    while (true) {
      const size_t newline = buffer_.find('\n');
      if (newline != std::string::npos) {
        std::string line = buffer_.substr(0, newline);
        buffer_.erase(0, newline + 1);
        return line;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd fd{stdout_, POLLIN, 0};
      if (poll(&fd, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[256];
      const ssize_t n = read(stdout_, chunk, sizeof(chunk));
      if (n <= 0) return std::nullopt;
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

  bool Signal(int signal) { return kill(pid_, signal) == 0; }

  // The wait status once the child has exited, or nullopt if it is still running after
  // `timeout`.
  std::optional<int> WaitForExit(std::chrono::milliseconds timeout) {
    const Clock::time_point deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return std::nullopt;
  }

 private:
  pid_t pid_ = -1;
  int stdout_ = -1;
  std::string buffer_;
};

// Starts memest-server on port 0 and returns the "HOST:PORT" it printed ("" on failure).
std::string StartAndReadAddress(ServerProcess& process) {
  if (!process.started()) return "";
  std::optional<std::string> line = process.ReadLine(std::chrono::seconds(20));
  if (!line.has_value()) return "";
  std::smatch match;
  static const std::regex kListening(R"(^memest-server listening on (127\.0\.0\.1:(\d+))$)");
  if (!std::regex_match(*line, match, kListening)) {
    ADD_FAILURE() << "unexpected first line: " << *line;
    return "";
  }
  EXPECT_NE(match[2].str(), "0");
  return match[1].str();
}

void ExpectCleanExitOn(int signal) {
  // A connected but idle client keeps its connection open until it next polls, so shutdown
  // takes the grace period; a short one keeps the test fast.
  ServerProcess process({MEMEST_SERVER_BINARY, "--address", "127.0.0.1:0", "--log-level", "warn",
                         "--grace-seconds", "1"});
  ASSERT_TRUE(process.started()) << "cannot run " << MEMEST_SERVER_BINARY;
  const std::string address = StartAndReadAddress(process);
  ASSERT_FALSE(address.empty());

  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  EXPECT_EQ(testing::CheckHealth(channel, ""), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(testing::CheckHealth(channel, "memest.v1.MemoryEstimator"),
            grpc::health::v1::HealthCheckResponse::SERVING);

  ASSERT_TRUE(process.Signal(signal));
  const Clock::time_point signalled = Clock::now();
  std::optional<int> status = process.WaitForExit(std::chrono::seconds(10));
  ASSERT_TRUE(status.has_value()) << "still running 10 s after signal " << signal;
  EXPECT_LT(Clock::now() - signalled, std::chrono::seconds(4)) << "the grace period is 1 s";
  ASSERT_TRUE(WIFEXITED(*status)) << "killed by signal " << WTERMSIG(*status);
  EXPECT_EQ(WEXITSTATUS(*status), 0);
}

TEST(ServerProcessTest, ServesHealthAndExitsCleanlyOnSigterm) { ExpectCleanExitOn(SIGTERM); }

TEST(ServerProcessTest, ExitsCleanlyOnSigint) { ExpectCleanExitOn(SIGINT); }

v1::EstimateRequest Gpt2(int64_t layers) { return testing::Gpt2Request(layers); }

// `count` Estimate calls of `request` started at once on `channel`, each with a 60 s deadline.
std::vector<std::future<grpc::Status>> StartCalls(const std::shared_ptr<grpc::Channel>& channel,
                                                  const v1::EstimateRequest& request, int count) {
  std::vector<std::future<grpc::Status>> calls;
  for (int i = 0; i < count; ++i) {
    calls.push_back(std::async(std::launch::async, [channel, request] {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      v1::EstimateResponse response;
      return v1::MemoryEstimator::NewStub(channel)->Estimate(&context, request, &response);
    }));
  }
  return calls;
}

// SIGTERM with calls running and queued: health says NOT_SERVING at once while calls are still
// taken for the drain delay (4 s); then every call in flight or queued finishes, and the exit is
// 0, after the delay.
TEST(ServerProcessTest, DrainsTheCallsInFlightAndQueuedOnSigterm) {
  ServerProcess process({MEMEST_SERVER_BINARY, "--address", "127.0.0.1:0", "--log-level", "warn",
                         "--work-threads", "1", "--drain-delay-seconds", "4", "--grace-seconds",
                         "30"});
  const std::string address = StartAndReadAddress(process);
  ASSERT_FALSE(address.empty());
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  ASSERT_EQ(testing::CheckHealth(channel, ""), grpc::health::v1::HealthCheckResponse::SERVING);
  // gpt2-small with 300 layers and advice: about 0.6 s each, one at a time.
  auto calls = StartCalls(channel, Gpt2(300), 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // all four reach the server
  ASSERT_TRUE(process.Signal(SIGTERM));
  const Clock::time_point signalled = Clock::now();
  // NOT_SERVING as soon as the signal is taken (within 2 s on a loaded machine).
  bool not_serving = false;
  while (!not_serving && Clock::now() - signalled < std::chrono::seconds(2)) {
    not_serving =
        testing::CheckHealth(channel, "") == grpc::health::v1::HealthCheckResponse::NOT_SERVING;
  }
  EXPECT_TRUE(not_serving);
  // A new call well after the signal, within the drain delay: taken (the listener would be
  // closed already without the delay).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto late = StartCalls(channel, Gpt2(2), 1);
  for (auto& call : calls) {
    const grpc::Status status = call.get();
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  const grpc::Status late_status = late[0].get();
  EXPECT_TRUE(late_status.ok()) << late_status.error_message();
  std::optional<int> status = process.WaitForExit(std::chrono::seconds(30));
  ASSERT_TRUE(status.has_value()) << "still running 30 s after SIGTERM";
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  // The four calls take about 2.4 s; the exit waits for the drain delay.
  EXPECT_GE(Clock::now() - signalled, std::chrono::seconds(4)) << "the drain delay is 4 s";
}

// Calls that outlast the grace period are cancelled, the engine stops, and the process exits
// soon after the grace period, not when the calls would have ended.
TEST(ServerProcessTest, CancelsWhatIsLeftWhenTheGracePeriodEnds) {
  ServerProcess process({MEMEST_SERVER_BINARY, "--address", "127.0.0.1:0", "--log-level", "warn",
                         "--work-threads", "1", "--grace-seconds", "1", "--max-op-steps",
                         "1000000000000"});
  const std::string address = StartAndReadAddress(process);
  ASSERT_FALSE(address.empty());
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  ASSERT_EQ(testing::CheckHealth(channel, ""), grpc::health::v1::HealthCheckResponse::SERVING);
  // gpt2-small with 4,000 layers and advice: several seconds each.
  auto calls = StartCalls(channel, Gpt2(4000), 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(process.Signal(SIGTERM));
  const Clock::time_point signalled = Clock::now();
  std::optional<int> status = process.WaitForExit(std::chrono::seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_LT(Clock::now() - signalled, std::chrono::seconds(3)) << "the grace period is 1 s";
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  for (auto& call : calls) EXPECT_FALSE(call.get().ok());
}

TEST(ServerProcessTest, RefusesAnAddressInUse) {
  ServerProcess first({MEMEST_SERVER_BINARY, "--address", "127.0.0.1:0", "--log-level", "off"});
  const std::string address = StartAndReadAddress(first);
  ASSERT_FALSE(address.empty());
  ServerProcess second({MEMEST_SERVER_BINARY, "--address", address, "--log-level", "off"});
  std::optional<int> status = second.WaitForExit(std::chrono::seconds(20));
  ASSERT_TRUE(status.has_value()) << "second server on " << address << " did not exit";
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_NE(WEXITSTATUS(*status), 0);
}

}  // namespace
}  // namespace memest
