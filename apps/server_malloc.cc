#include "server_malloc.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

namespace kvlm::cli {
namespace {

std::string tunable_name(const std::string& setting) { return setting.substr(0, setting.find('=') + 1); }

// This process's arguments as the kernel holds them (NUL-separated).
std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t begin = 0; begin < all.size();) {
    const size_t end = all.find('\0', begin);
    args.push_back(all.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return args;
}

}  // namespace

std::optional<std::string> reexec_with_server_malloc_settings() {
#if !defined(__GLIBC__)
  return std::nullopt;  // another C library: these tunables mean nothing to it
#else
  const char* current = std::getenv("GLIBC_TUNABLES");
  std::string tunables = current != nullptr ? current : "";
  if (tunables.find("glibc.malloc.tcache_count=") != std::string::npos) return std::nullopt;
  for (const char* setting : kServerMallocTunables) {
    if (tunables.find(tunable_name(setting)) != std::string::npos) continue;
    if (!tunables.empty()) tunables += ':';
    tunables += setting;
  }
  std::vector<std::string> args = own_arguments();
  if (args.empty()) return "cannot read /proc/self/cmdline to restart with server malloc settings; RSS may creep";
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string previous = tunables;
  ::setenv("GLIBC_TUNABLES", tunables.c_str(), 1);
  ::execv("/proc/self/exe", argv.data());
  // Still here: the exec failed. Put the environment back and go on with glibc's defaults.
  const int error = errno;
  if (current != nullptr) {
    ::setenv("GLIBC_TUNABLES", current, 1);
  } else {
    ::unsetenv("GLIBC_TUNABLES");
  }
  return "cannot restart with GLIBC_TUNABLES=" + previous + " (" + std::strerror(error) +
         "): glibc's malloc defaults let a long-running server's RSS creep";
#endif
}

}  // namespace kvlm::cli
