// Status and StatusOr<T>: expected failures as values (absl-style). Every fallible core call
// returns one of these; exceptions are reserved for the edges (CLI, torch).
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace vtoken {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // Bad input from the caller: unknown id, malformed option.
  kNotFound,            // A named thing (sequence, token, file, policy) does not exist.
  kFailedPrecondition,  // The call is not allowed in the current state (dead token, stale plan).
  kResourceExhausted,   // Out of blocks (or another bounded resource).
  kDataLoss,            // Corrupt or truncated input data.
  kInternal,            // An invariant was found broken.
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CODE: message", or "OK".
  std::string ToString() const;

  // Marks an intentionally ignored status.
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgumentError(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status NotFoundError(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
inline Status FailedPreconditionError(std::string m) {
  return Status(StatusCode::kFailedPrecondition, std::move(m));
}
inline Status ResourceExhaustedError(std::string m) {
  return Status(StatusCode::kResourceExhausted, std::move(m));
}
inline Status DataLossError(std::string m) { return Status(StatusCode::kDataLoss, std::move(m)); }
inline Status InternalError(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }

// Holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : rep_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  StatusOr(Status status) : rep_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(rep_).ok() && "StatusOr built from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(rep_); }
  // Returns the error, or OK when a value is held.
  Status status() const { return ok() ? Status() : std::get<Status>(rep_); }

  // REQUIRES: ok().
  T& value() & { return std::get<T>(rep_); }
  const T& value() const& { return std::get<T>(rep_); }
  T&& value() && { return std::get<T>(std::move(rep_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> rep_;
};

}  // namespace vtoken

// Propagates a non-OK Status from an expression returning Status.
#define VTOKEN_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::vtoken::Status _vtoken_status = (expr);        \
    if (!_vtoken_status.ok()) return _vtoken_status; \
  } while (0)

#define VTOKEN_CONCAT_INNER(a, b) a##b
#define VTOKEN_CONCAT(a, b) VTOKEN_CONCAT_INNER(a, b)
// Assigns the value of a StatusOr expression to `lhs`, or returns its error.
#define VTOKEN_ASSIGN_OR_RETURN(lhs, expr)                \
  auto VTOKEN_CONCAT(_vtoken_or_, __LINE__) = (expr);     \
  if (!VTOKEN_CONCAT(_vtoken_or_, __LINE__).ok())         \
    return VTOKEN_CONCAT(_vtoken_or_, __LINE__).status(); \
  lhs = std::move(VTOKEN_CONCAT(_vtoken_or_, __LINE__)).value()
