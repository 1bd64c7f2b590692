// Status and Result<T>: how kvlm reports bad input and "no room" without exceptions.
#pragma once

#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace kvlm {

// An error message with context, or success. Errors are for user input and
// environment problems (files, flags, sizes); broken invariants use KVLM_CHECK.
class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok_status() { return Status(); }
  static Status error(std::string message) { return Status(std::move(message), true); }
  template <typename... Args>
  static Status errorf(fmt::format_string<Args...> f, Args&&... args) {
    return error(fmt::format(f, std::forward<Args>(args)...));
  }

  bool ok() const { return !failed_; }
  const std::string& message() const { return message_; }

  // Prefixes the message with more context: "reading x.gguf: " + message.
  Status with_context(std::string_view context) const {
    if (ok()) return *this;
    return error(fmt::format("{}: {}", context, message_));
  }

 private:
  Status(std::string message, bool failed) : message_(std::move(message)), failed_(failed) {}
  std::string message_;
  bool failed_ = false;
};

// A value or the Status explaining why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(data_).ok()) std::abort();  // a Result holding "ok" but no value is a bug
  }

  bool ok() const { return std::holds_alternative<T>(data_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(data_);
  }
  T& value() & { return std::get<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace kvlm

#define KVLM_STATUS_CONCAT_INNER(a, b) a##b
#define KVLM_STATUS_CONCAT(a, b) KVLM_STATUS_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` failed.
#define KVLM_RETURN_IF_ERROR(expr)                  \
  do {                                              \
    ::kvlm::Status kvlm_status_ = (expr);           \
    if (!kvlm_status_.ok()) return kvlm_status_;    \
  } while (0)

// `KVLM_ASSIGN_OR_RETURN(auto x, make_x());` declares x from a Result or returns its error.
#define KVLM_ASSIGN_OR_RETURN(lhs, expr) \
  KVLM_ASSIGN_OR_RETURN_IMPL(KVLM_STATUS_CONCAT(kvlm_result_, __LINE__), lhs, expr)
#define KVLM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
