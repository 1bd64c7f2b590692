#include "support/serve_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "support/subprocess.h"
#include "support/test_paths.h"

namespace kvlm::testing {
namespace {

int decode_status(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

}  // namespace

ServeProcess::ServeProcess(const std::string& scratch, const std::vector<std::string>& args) {
  log_ = scratch_dir(scratch) / "serve.log";
  // Built before fork: the child only dups, execs or exits.
  std::vector<std::string> all = {kvlm_binary(), "serve", "--port", "0"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log_path = log_.string();
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDERR_FILENO);
    dup2(fd, STDOUT_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
}

ServeProcess::~ServeProcess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

int ServeProcess::wait_ready() {
  const std::regex ready(R"(ready: http://127\.0\.0\.1:(\d+)/v1)");
  for (int i = 0; i < 500; ++i) {
    std::smatch m;
    const std::string text = log();
    if (std::regex_search(text, m, ready)) return std::stoi(m[1]);
    if (wait_exit(std::chrono::milliseconds(0)) >= 0) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

void ServeProcess::send_signal(int signal_number) {
  if (!exited_) kill(pid_, signal_number);
}

int ServeProcess::terminate_and_wait() {
  send_signal(SIGTERM);
  return wait_exit(std::chrono::hours(1));
}

int ServeProcess::wait_exit(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!exited_) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      exit_code_ = decode_status(status);
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return exit_code_;
}

std::string ServeProcess::log() const {
  std::ifstream in(log_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace kvlm::testing
