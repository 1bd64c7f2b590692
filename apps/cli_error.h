// CliError: a user-facing failure; main prints its message as one line and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "core/status.h"
#include "core/thread_pool.h"

namespace kvlm::cli {

class CliError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Unwraps a Result or throws its message as a CliError.
template <typename T>
T value_or_throw(Result<T> result) {
  if (!result.ok()) throw CliError(result.status().message());
  return std::move(result).value();
}

inline void throw_if_error(const Status& status) {
  if (!status.ok()) throw CliError(status.message());
}

// --threads: 0 means every core; more than a few hundred is surely a typo.
inline int resolve_threads(int requested) {
  constexpr int kMaxThreads = 512;
  if (requested < 0 || requested > kMaxThreads) {
    throw CliError(fmt::format("--threads {} must be in [0, {}] (0 = all cores)", requested, kMaxThreads));
  }
  return requested > 0 ? requested : ThreadPool::default_num_threads();
}

}  // namespace kvlm::cli
