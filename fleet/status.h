// Status and Result<T>: errors as values.
//
// A Status is a code and a message that names the thing and the rule that
// was broken ("slot range '9-1': the first slot must not be above the last").
// errno becomes a Status once, at the system-call layer (ErrnoStatus), and a
// Status becomes an errno or an exit code once, at the edge (FUSE adapter,
// command line). No exception crosses a module boundary.
//
// Thread-safety: values; safe to copy between threads.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace fleetfs {

enum class Code {
  kOk = 0,
  kInvalidArgument,     // bad input: the message names the thing and the rule
  kNotFound,            // a file, row or key that is not there
  kAlreadyExists,       // refusing to overwrite
  kFailedPrecondition,  // the world is not in the state the call needs
  kUnavailable,         // a store or destination that does not answer
  kDeadlineExceeded,    // a call that ran past its time limit
  kDataLoss,            // corrupt or foreign data (a file that is not ours)
  kIoError,             // an operating-system call failed
  kInternal,            // a broken invariant of our own
};

// The name used in messages and JSON ("invalid_argument").
std::string_view CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

  // "what went wrong: the message"; used where the context adds a prefix.
  Status WithContext(std::string_view context) const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// Shorthands for the common codes.
inline Status InvalidArgument(std::string message) {
  return Status(Code::kInvalidArgument, std::move(message));
}
inline Status NotFound(std::string message) { return Status(Code::kNotFound, std::move(message)); }
inline Status Unavailable(std::string message) {
  return Status(Code::kUnavailable, std::move(message));
}
inline Status DataLoss(std::string message) { return Status(Code::kDataLoss, std::move(message)); }
inline Status Internal(std::string message) { return Status(Code::kInternal, std::move(message)); }

// An operating-system failure: "<what>: <strerror(err)>".
Status ErrnoStatus(std::string_view what, int err);

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : value_(std::move(status)) {  // NOLINT: implicit by design
    assert(!std::get<Status>(value_).ok() && "a Result holds a value or an error");
  }

  bool ok() const { return std::holds_alternative<T>(value_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(value_);
  }
  T& value() & { return std::get<T>(value_); }
  const T& value() const& { return std::get<T>(value_); }
  T&& value() && { return std::get<T>(std::move(value_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> value_;
};

}  // namespace fleetfs

// Returns the Status of `expr` from the enclosing function when it is an error.
#define FLEETFS_RETURN_IF_ERROR(expr)         \
  do {                                        \
    ::fleetfs::Status fleetfs_status_ = (expr); \
    if (!fleetfs_status_.ok()) return fleetfs_status_; \
  } while (0)

#define FLEETFS_CONCAT_INNER(a, b) a##b
#define FLEETFS_CONCAT(a, b) FLEETFS_CONCAT_INNER(a, b)
#define FLEETFS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

// `lhs = value of expr`, or return its Status from the enclosing function.
#define FLEETFS_ASSIGN_OR_RETURN(lhs, expr) \
  FLEETFS_ASSIGN_OR_RETURN_IMPL(FLEETFS_CONCAT(fleetfs_result_, __LINE__), lhs, expr)
