// A `kvlm serve` child process for the CLI tests: its log in a file, its port read from the log.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace kvlm::testing {

class ServeProcess {
 public:
  // Starts `kvlm serve --port 0 <args>`, stdout and stderr into <scratch_dir(scratch)>/serve.log.
  ServeProcess(const std::string& scratch, const std::vector<std::string>& args);
  ~ServeProcess();  // SIGKILLs it when it is still running
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  // Waits for "ready: http://127.0.0.1:PORT" (up to ~10 s); the port, or 0 when it never came.
  int wait_ready();
  // Sends SIGTERM and waits for the exit: the exit code, or 128 + the signal that killed it.
  int terminate_and_wait();
  void send_signal(int signal_number);
  // Waits up to `timeout` for the exit: its code as terminate_and_wait says it, or -1 when it
  // is still running.
  int wait_exit(std::chrono::milliseconds timeout);
  std::string log() const;

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int exit_code_ = -1;
  std::filesystem::path log_;
};

}  // namespace kvlm::testing
