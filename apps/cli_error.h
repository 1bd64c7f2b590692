// CliError: a user-facing failure; main prints its message as one line and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

#include "core/status.h"

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

}  // namespace kvlm::cli
