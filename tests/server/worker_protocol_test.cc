// The pipe to the validation worker: a write to a worker that is gone fails with EPIPE instead
// of killing the server, without changing the process's SIGPIPE disposition.
#include "server/worker_protocol.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <string>

namespace memest::worker {
namespace {

TEST(WorkerProtocolTest, WriteToAGoneReaderFailsWithEpipeAndLeavesSigpipeAlone) {
  struct sigaction before {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &before), 0);
  ASSERT_EQ(before.sa_handler, SIG_DFL) << "the test needs SIGPIPE's default, which kills";
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
  sigaction(SIGPIPE, nullptr, &after);
  EXPECT_EQ(after.sa_handler, SIG_DFL);
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
