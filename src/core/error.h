// core/error.h — the exception type Loom throws, and its one refinement.
//
// Every error names what was wrong (file, field, tensor, op), the value seen and
// what was expected, so the one-line message printed by the CLI is actionable.
#pragma once

#include <concepts>
#include <stdexcept>
#include <string>
#include <utility>

namespace loom {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// The device a run asked for is not built in or not present on this host: a scheduler can
// place the job elsewhere (`loom` exits with contract::ExitCode::device_unavailable).
class DeviceUnavailable : public Error {
 public:
  using Error::Error;
};

// Throws loom::Error with `message` when `condition` is false.
inline void check(bool condition, const std::string& message) {
  if (!condition)
    throw Error(message);
}

// A fixed message: no std::string is made unless the check fails (a literal passed to the
// overload above would allocate one on every call).
inline void check(bool condition, const char* message) {
  if (!condition)
    throw Error(message);
}

// The same, with the message built only when the check fails: for checks on hot paths
// (a tensor's data pointer, its dimensions), where building the text every time costs more
// than the work the check guards.
template <std::invocable MakeMessage>
inline void check(bool condition, MakeMessage&& make_message) {
  if (!condition)
    throw Error(std::forward<MakeMessage>(make_message)());
}

}  // namespace loom
