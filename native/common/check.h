// Errors for the native core: a typed exception carrying file and line.
// Library code throws; only a tool's main() turns an exception into an exit code
// (rank contract: 2 = bad input, anything else non-zero = retryable).
#pragma once

#include <sstream>    // std::ostringstream for message building
#include <stdexcept>  // std::runtime_error base
#include <string>

namespace moerl {

// Kind tells the tool's main() which exit code the failure maps to.
enum class ErrorKind { Internal, BadInput, PeerFailure, Timeout };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {
template <typename... Args>
[[noreturn]] void throw_error(ErrorKind kind, const char* file, int line, const char* cond,
                              const Args&... args) {
  std::ostringstream os;
  os << file << ":" << line << ": ";
  (os << ... << args);
  if (cond != nullptr) os << " (check failed: " << cond << ")";
  throw Error(kind, os.str());
}
}  // namespace detail

}  // namespace moerl

// MOERL_CHECK(cond, parts...) throws moerl::Error(Internal) naming file, line and cond.
#define MOERL_CHECK(cond, ...)                                                                 \
  do {                                                                                         \
    if (!(cond))                                                                               \
      ::moerl::detail::throw_error(::moerl::ErrorKind::Internal, __FILE__, __LINE__, #cond,    \
                                   __VA_ARGS__);                                               \
  } while (0)

// MOERL_FAIL(kind, parts...) throws unconditionally with the given kind.
#define MOERL_FAIL(kind, ...) \
  ::moerl::detail::throw_error(::moerl::ErrorKind::kind, __FILE__, __LINE__, nullptr, __VA_ARGS__)

// MOERL_CHECK_INPUT(cond, parts...) for user-supplied data: maps to exit code 2.
#define MOERL_CHECK_INPUT(cond, ...)                                                           \
  do {                                                                                         \
    if (!(cond))                                                                               \
      ::moerl::detail::throw_error(::moerl::ErrorKind::BadInput, __FILE__, __LINE__, nullptr,  \
                                   __VA_ARGS__);                                               \
  } while (0)
