// Runs a binary as a child process for the CLI tests: its exit code, stdout and stderr, or a
// long-running child (memest-server) that is stopped with SIGTERM.
#ifndef MEMEST_TESTS_CLI_SUBPROCESS_H_
#define MEMEST_TESTS_CLI_SUBPROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace memest::testing {

struct RunResult {
  int exit_code = -1;  // the child's exit status; 128 + signal if a signal ended it
  std::string out;     // stdout
  std::string err;     // stderr
};

// Runs `argv` (argv[0] is the binary's path) to completion.
RunResult Run(const std::vector<std::string>& argv);

// A child process that runs until it is stopped; its stdout and stderr go to a file.
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv);
  ~Child();  // SIGKILL if still running
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }  // -1 once stopped
  // Everything the child has written so far (stdout and stderr interleaved).
  std::string Output() const;
  // Polls the output until `prefix` appears at the start of a line, and returns the rest of
  // that line; "" on timeout or if the child exits first.
  std::string WaitForLine(const std::string& prefix, std::chrono::milliseconds timeout);
  // Sends `signal` and waits for the child; returns its exit status as RunResult does.
  int Stop(int signal);

 private:
  pid_t pid_ = -1;
  std::string log_path_;
};

}  // namespace memest::testing

#endif  // MEMEST_TESTS_CLI_SUBPROCESS_H_
