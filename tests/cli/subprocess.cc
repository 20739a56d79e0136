#include "tests/cli/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

namespace memest::testing {
namespace {

std::string TempPath() {
  char path[] = "/tmp/memest-cli-test.XXXXXX";
  const int fd = mkstemp(path);
  if (fd >= 0) close(fd);
  return path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// Forks and execs `argv` with stdout and stderr redirected to the given files.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& out_path,
            const std::string& err_path) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int out = open(out_path.c_str(), O_WRONLY | O_TRUNC);
    const int err = err_path == out_path ? out : open(err_path.c_str(), O_WRONLY | O_TRUNC);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

}  // namespace

RunResult Run(const std::vector<std::string>& argv) {
  const std::string out_path = TempPath();
  const std::string err_path = TempPath();
  RunResult result;
  const pid_t pid = Spawn(argv, out_path, err_path);
  int status = 0;
  if (pid > 0 && waitpid(pid, &status, 0) == pid) result.exit_code = DecodeStatus(status);
  result.out = ReadFile(out_path);
  result.err = ReadFile(err_path);
  unlink(out_path.c_str());
  unlink(err_path.c_str());
  return result;
}

Child::Child(const std::vector<std::string>& argv) : log_path_(TempPath()) {
  pid_ = Spawn(argv, log_path_, log_path_);
}

Child::~Child() {
  if (pid_ > 0) Stop(SIGKILL);
  unlink(log_path_.c_str());
}

std::string Child::Output() const { return ReadFile(log_path_); }

std::string Child::WaitForLine(const std::string& prefix, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    std::istringstream lines(Output());
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
    }
    int status = 0;
    if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;  // exited before printing the line
      return "";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return "";
}

int Child::Stop(int signal) {
  if (pid_ <= 0) return -1;
  kill(pid_, signal);
  int status = 0;
  const int result = waitpid(pid_, &status, 0) == pid_ ? DecodeStatus(status) : -1;
  pid_ = -1;
  return result;
}

}  // namespace memest::testing
