#include "mapped_file_guard.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>

namespace kvlm::cli {
namespace {

// Everything the handler reads is written before `num_guarded` counts it, in fixed static
// storage: a signal handler may not allocate, lock or format.
constexpr int kMaxGuarded = 4;
constexpr size_t kMaxMessage = 4096;

struct GuardedRange {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  char message[kMaxMessage] = {};  // the whole line, written as is
  size_t message_size = 0;
};

GuardedRange g_ranges[kMaxGuarded];
std::atomic<int> g_num_guarded{0};
std::mutex g_install_mutex;

void write_all(const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(STDERR_FILENO, data, size);
    if (n <= 0) return;  // nothing else can be done from here
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void on_sigbus(int signal_number, siginfo_t* info, void*) {
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  const int n = g_num_guarded.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    const GuardedRange& r = g_ranges[i];
    if (address >= r.begin && address < r.end) {
      write_all(r.message, r.message_size);
      _exit(kExitModelFileChanged);  // no atexit handlers, no stdio flush: nothing half-written follows
    }
  }
  // Not ours: the default action, as if no handler were installed.
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
}

}  // namespace

void guard_mapped_file(const GgufFile& file) {
  if (!file.is_mapped()) return;
  std::lock_guard<std::mutex> lock(g_install_mutex);
  const int n = g_num_guarded.load(std::memory_order_relaxed);
  if (n == kMaxGuarded) return;  // kvlm maps at most two files at once; beyond, the default action
  GuardedRange& r = g_ranges[n];
  r.begin = reinterpret_cast<uintptr_t>(file.bytes().data());
  r.end = r.begin + file.bytes().size();
  std::error_code ec;
  std::filesystem::path path = std::filesystem::absolute(file.name(), ec);
  if (ec) path = file.name();
  std::string message = "kvlm: error: the model file was truncated or changed on disk while mapped: " +
                        path.string() +
                        " (SIGBUS reading its weights); kvlm cannot go on. Replace a model by writing a new file "
                        "and renaming it over the old one, never by writing into it.\n";
  if (message.size() > kMaxMessage) message.resize(kMaxMessage);
  std::memcpy(r.message, message.data(), message.size());
  r.message_size = message.size();
  g_num_guarded.store(n + 1, std::memory_order_release);
  if (n == 0) {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, nullptr);
  }
}

}  // namespace kvlm::cli
