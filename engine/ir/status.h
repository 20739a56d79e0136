// Status and StatusOr: errors as values across the engine's boundary.
//
// The engine never throws and never exits. A function that can fail returns a Status (or a
// StatusOr<T> holding either a value or an error). Messages name the offending field in the
// form the user wrote it, e.g. "model.layers[3].attrs.out_features: must be positive, got -4".
// Exactly one place (server/status_conversion) maps these codes to gRPC codes.
#ifndef MEMEST_ENGINE_IR_STATUS_H_
#define MEMEST_ENGINE_IR_STATUS_H_

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace memest {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // the request is malformed: a bad field, shape, reference or value
  kNotFound,           // a named thing (preset, device, op kind) does not exist
  kResourceExhausted,  // the request is larger than the service accepts
  kFailedPrecondition, // the request is well formed but cannot be answered as asked
  kUnavailable,        // a capability is missing here (e.g. no GPU for validation)
  kInternal,           // a bug in memest: an invariant did not hold
  kCancelled,          // the caller cancelled (a validation stopped between ops)
  kDeadlineExceeded,   // the caller's deadline passed first
  kUnauthenticated,    // the server asks for a token the call did not carry (server/auth.h)
};

class Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns a copy whose message is "<prefix><message>"; used to qualify a field path as an
  // error travels outwards, e.g. Prefixed("model.") turns "layers[2]: ..." into
  // "model.layers[2]: ...".
  Status Prefixed(const std::string& prefix) const {
    return ok() ? *this : Status(code_, prefix + message_);
  }
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status Unauthenticated(std::string m) { return {StatusCode::kUnauthenticated, std::move(m)}; }

const char* StatusCodeName(StatusCode code);

// Either a T or a non-OK Status. Accessing value() of an error is a programming error.
template <typename T>
class StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT
  StatusOr(T value) : value_(std::move(value)) {}                                // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  const T& value() const& { assert(ok()); return *value_; }
  T& value() & { assert(ok()); return *value_; }
  // By value, so that `for (x : F().value())` never refers into a destroyed temporary.
  T value() && { assert(ok()); return std::move(*value_); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace memest

// Returns early from the enclosing function if `expr` (a Status) is not OK.
#define MEMEST_RETURN_IF_ERROR(expr)             \
  do {                                           \
    ::memest::Status _memest_st = (expr);        \
    if (!_memest_st.ok()) return _memest_st;     \
  } while (0)

#define MEMEST_CONCAT_INNER_(a, b) a##b
#define MEMEST_CONCAT_(a, b) MEMEST_CONCAT_INNER_(a, b)
// Declares `lhs` from a StatusOr expression, or returns its error. It declares a variable, so
// under a `case:` label it needs braces.
#define MEMEST_ASSIGN_OR_RETURN(lhs, expr)                                   \
  auto MEMEST_CONCAT_(_memest_so_, __LINE__) = (expr);                       \
  if (!MEMEST_CONCAT_(_memest_so_, __LINE__).ok())                           \
    return MEMEST_CONCAT_(_memest_so_, __LINE__).status();                   \
  lhs = std::move(MEMEST_CONCAT_(_memest_so_, __LINE__)).value()

#endif  // MEMEST_ENGINE_IR_STATUS_H_
