// The pipe to the validation worker: a write to a worker that is gone fails with EPIPE instead
// of killing the server, without changing the process's SIGPIPE disposition.
#include "server/worker_protocol.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace memest::worker {
namespace {

TEST(WorkerProtocolTest, WriteToAGoneReaderFailsWithEpipeAndLeavesSigpipeAlone) {
  // The test needs SIGPIPE's default, which kills (another test's metrics server ignores it).
  struct sigaction dfl {
  }, before{};
  dfl.sa_handler = SIG_DFL;
  ASSERT_EQ(sigaction(SIGPIPE, &dfl, &before), 0);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  close(fds[0]);  // the reader is gone
  const std::string data(100, 'x');
  errno = 0;
  EXPECT_EQ(WriteWithoutSigpipe(fds[1], data.data(), data.size()), -1);
  EXPECT_EQ(errno, EPIPE);
  close(fds[1]);
  // Still alive, nothing pending, the mask and the disposition as they were.
  sigset_t pending, mask;
  sigpending(&pending);
  EXPECT_FALSE(sigismember(&pending, SIGPIPE));
  pthread_sigmask(SIG_SETMASK, nullptr, &mask);
  EXPECT_FALSE(sigismember(&mask, SIGPIPE));
  struct sigaction after {};
  sigaction(SIGPIPE, &before, &after);  // and restored
  EXPECT_EQ(after.sa_handler, SIG_DFL);
}

// The worker starts with nothing blocked and SIGTERM, SIGINT and SIGPIPE at their defaults,
// although the thread that spawns it blocks SIGTERM (as every memest-server thread does) and the
// process ignores SIGPIPE: the child reports its own /proc/self/status.
TEST(WorkerProtocolTest, TheWorkerStartsWithDefaultSignals) {
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, &old);
  struct sigaction ignore {
  }, before{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &before);

  const std::string out = ::testing::TempDir() + "/worker-signals.txt";
  const std::string script = "grep -E '^Sig(Blk|Ign)' /proc/self/status > " + out;
  std::vector<std::string> args = {"/bin/sh", "-c", script};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  ASSERT_EQ(SpawnWithDefaultSignals(&pid, "/bin/sh", nullptr, argv.data()), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  sigaction(SIGPIPE, &before, nullptr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);

  std::ifstream file(out);
  std::string line;
  uint64_t blocked = ~0ull, ignored = ~0ull;
  while (std::getline(file, line)) {
    const uint64_t bits = std::stoull(line.substr(line.find(':') + 1), nullptr, 16);
    (line.rfind("SigBlk", 0) == 0 ? blocked : ignored) = bits;
  }
  EXPECT_EQ(blocked, 0u) << "the child inherited a blocked signal";
  const uint64_t mask = (1ull << (SIGTERM - 1)) | (1ull << (SIGINT - 1)) | (1ull << (SIGPIPE - 1));
  EXPECT_EQ(ignored & mask, 0u) << "the child ignores SIGTERM, SIGINT or SIGPIPE";
}

TEST(WorkerProtocolTest, WriteToALiveReaderWrites) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  EXPECT_EQ(WriteWithoutSigpipe(fds[1], "abc", 3), 3);
  char got[3];
  EXPECT_EQ(read(fds[0], got, 3), 3);
  EXPECT_EQ(std::string(got, 3), "abc");
  close(fds[0]);
  close(fds[1]);
}

}  // namespace
}  // namespace memest::worker
