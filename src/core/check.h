// KVLM_CHECK: always-on invariant checks that abort with the values involved.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

namespace kvlm::detail {
[[noreturn]] inline void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "kvlm: CHECK failed at %s:%d: %s %s\n", file, line, cond, msg.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace kvlm::detail

// A broken invariant is a bug, not bad input: abort with the ids and values.
// Usage: KVLM_CHECK(a == b, "block {} has ref count {}", id, rc);
#define KVLM_CHECK(cond, ...)                                                                 \
  do {                                                                                        \
    if (!(cond)) [[unlikely]]                                                                 \
      ::kvlm::detail::check_failed(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
  } while (0)

// Checks that cost too much inside hot loops: compiled only in debug builds.
#ifdef NDEBUG
#define KVLM_DCHECK(cond, ...) \
  do {                         \
  } while (0)
#else
#define KVLM_DCHECK(cond, ...) KVLM_CHECK(cond, __VA_ARGS__)
#endif
