// core/checked.h — arithmetic on sizes, counts and offsets that come from outside Loom
// (model and data files, YAML catalogs, command-line flags).
//
// A signed product that overflows is undefined behaviour, and a size that wraps quietly
// allocates too little; casting a double that is NaN, infinite or out of range to an
// integer is undefined too. Every routine here checks before it computes or casts, and
// throws a loom::Error that names where the number came from, the value and what was
// expected. Header-only on purpose: the planning column (src/cluster) uses it without
// linking the engine, as it does core/error.h.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace loom {

// The most elements a tensor described by a file may hold: 2^48 (far beyond any real
// model), so that elements x an 8-byte dtype, and the strides of the shape, stay far
// inside int64 and size_t.
inline constexpr std::int64_t kMaxFileElements = std::int64_t{1} << 48;

// The shortest text that reads back as `value`: "1e+30", "2.5", "inf", "nan".
inline std::string number_text(double value) {
  char text[32];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, value);
  return ec == std::errc() ? std::string(text, end) : std::to_string(value);
}

// a + b, or an error naming `what` when the sum does not fit in int64.
inline std::int64_t checked_add(std::int64_t a, std::int64_t b, const std::string& what) {
  std::int64_t sum = 0;
  check(!__builtin_add_overflow(a, b, &sum), [&] {
    return what + ": " + std::to_string(a) + " + " + std::to_string(b) +
           " overflows int64 (expected a sum below 2^63)";
  });
  return sum;
}

// a * b, or an error naming `what` when the product does not fit in int64.
inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& what) {
  std::int64_t product = 0;
  check(!__builtin_mul_overflow(a, b, &product), [&] {
    return what + ": " + std::to_string(a) + " x " + std::to_string(b) +
           " overflows int64 (expected a product below 2^63)";
  });
  return product;
}

// The element count of a shape read from a file (`where` names the file and the tensor):
// every dimension must be >= 0, and the product of the non-zero dimensions at most
// kMaxFileElements, so that neither the count nor the strides of the shape can overflow.
inline std::int64_t checked_numel(const std::vector<std::int64_t>& shape,
                                  const std::string& where) {
  auto shape_text = [&] {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i)
      s += (i ? "," : "") + std::to_string(shape[i]);
    return s + "]";
  };
  std::int64_t product = 1;  // of the non-zero dimensions
  bool empty = false;
  for (std::size_t axis = 0; axis < shape.size(); ++axis) {
    const std::int64_t d = shape[axis];
    check(d >= 0, [&] {
      return where + ": shape " + shape_text() + " has dimension " + std::to_string(d) +
             " at axis " + std::to_string(axis) + ", expected >= 0";
    });
    if (d == 0) {
      empty = true;
      continue;
    }
    check(!__builtin_mul_overflow(product, d, &product), [&] {
      return where + ": the element count of shape " + shape_text() +
             " overflows int64 (expected at most 2^48 elements)";
    });
    check(product <= kMaxFileElements, [&] {
      return where + ": shape " + shape_text() + " has more than " +
             std::to_string(kMaxFileElements) + " elements (2^48), the most Loom reads";
    });
  }
  return empty ? 0 : product;
}

// A number read as a double (YAML, JSON, a flag) that must be a whole number in [lo, hi];
// `where` names the file and the field. NaN, infinities, fractions and values out of range
// are rejected before the cast, which would be undefined behaviour for them. The bounds
// are clamped to +-2^53, where every integer is exactly a double, so the comparisons are
// exact.
inline std::int64_t whole_number(double value, std::int64_t lo, std::int64_t hi,
                                 const std::string& where) {
  constexpr std::int64_t kExact = std::int64_t{1} << 53;
  lo = std::max(lo, -kExact);
  hi = std::min(hi, kExact);
  check(std::isfinite(value) && value == std::floor(value) && value >= static_cast<double>(lo) &&
            value <= static_cast<double>(hi),
        [&] {
          return where + " is " + number_text(value) + ", expected a whole number in " +
                 std::to_string(lo) + ".." + std::to_string(hi);
        });
  return static_cast<std::int64_t>(value);
}

}  // namespace loom
