// core/error.h — the one exception type Loom throws.
//
// Every error names what was wrong (file, field, tensor, op), the value seen and
// what was expected, so the one-line message printed by the CLI is actionable.
#pragma once

#include <stdexcept>
#include <string>

namespace loom {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws loom::Error with `message` when `condition` is false.
inline void check(bool condition, const std::string& message) {
  if (!condition) throw Error(message);
}

}  // namespace loom
