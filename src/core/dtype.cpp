#include "core/dtype.h"

#include <bit>
#include <cmath>
#include <limits>

namespace loom {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
  }
  return "?";
}

std::string_view safetensors_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::u8:
      return "U8";
  }
  return "?";
}

bool parse_safetensors_dtype(std::string_view text, DType& out) {
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8}) {
    if (text == safetensors_name(d)) {
      out = d;
      return true;
    }
  }
  return false;
}

std::uint16_t float_to_bf16(float value) {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if (std::isnan(value))
    return static_cast<std::uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit.
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<std::uint16_t>(bits >> 16);
}

float bf16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

std::uint16_t float_to_f16(float value) {
  // IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; round to nearest even.
  std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  std::uint32_t sign = (x >> 16) & 0x8000;
  std::uint32_t mantissa = x & 0x7fffff;
  int exponent = static_cast<int>((x >> 23) & 0xff);
  if (exponent == 0xff)
    return static_cast<std::uint16_t>(sign | 0x7c00 | (mantissa ? 0x200 : 0));
  int e = exponent - 127 + 15;
  if (e >= 0x1f)
    return static_cast<std::uint16_t>(sign | 0x7c00);  // overflow to inf
  if (e <= 0) {                                        // subnormal or zero
    if (e < -10)
      return static_cast<std::uint16_t>(sign);
    mantissa |= 0x800000;
    int shift = 14 - e;
    std::uint32_t half = mantissa >> shift;
    std::uint32_t rest = mantissa & ((1u << shift) - 1);
    std::uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1)))
      ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = sign | (static_cast<std::uint32_t>(e) << 10) | (mantissa >> 13);
  std::uint32_t rest = mantissa & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1)))
    ++half;  // may carry into exponent: fine
  return static_cast<std::uint16_t>(half);
}

float f16_to_float(std::uint16_t bits) {
  std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000) << 16;
  int exponent = (bits >> 10) & 0x1f;
  std::uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0) {
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f)
    return std::bit_cast<float>(sign | 0x7f800000 | (mantissa << 13));
  return std::bit_cast<float>(sign | (static_cast<std::uint32_t>(exponent - 15 + 127) << 23) |
                              (mantissa << 13));
}

}  // namespace loom

namespace loom {
namespace {

struct NarrowLayout {
  int exponent_bits, mantissa_bits, bias;
  bool infinities, negative_zero, nan;
};

NarrowLayout layout_of(NarrowFloat format) {
  switch (format) {
    case NarrowFloat::e4m3fn:
      return {4, 3, 7, false, true, true};
    case NarrowFloat::e4m3fnuz:
      return {4, 3, 8, false, false, true};
    case NarrowFloat::e5m2:
      return {5, 2, 15, true, true, true};
    case NarrowFloat::e5m2fnuz:
      return {5, 2, 16, false, false, true};
    case NarrowFloat::e2m1fn:
      return {2, 1, 1, false, true, false};
  }
  return {4, 3, 7, false, true, true};
}

}  // namespace

float narrow_float_max(NarrowFloat format) {
  switch (format) {
    case NarrowFloat::e4m3fn:
      return 448.0f;
    case NarrowFloat::e4m3fnuz:
      return 240.0f;
    case NarrowFloat::e5m2:
    case NarrowFloat::e5m2fnuz:
      return 57344.0f;
    case NarrowFloat::e2m1fn:
      return 6.0f;
  }
  return 0.0f;
}

float narrow_float_decode(std::uint8_t bits, NarrowFloat format) {
  const NarrowLayout l = layout_of(format);
  const int width = 1 + l.exponent_bits + l.mantissa_bits;
  bits = static_cast<std::uint8_t>(bits & ((1u << width) - 1));
  const bool negative = (bits >> (width - 1)) & 1;
  const int exponent = (bits >> l.mantissa_bits) & ((1 << l.exponent_bits) - 1);
  const int mantissa = bits & ((1 << l.mantissa_bits) - 1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (!l.negative_zero && bits == (1u << (width - 1)))
    return nan;  // fnuz: the pattern of -0 is the NaN
  const int top = (1 << l.exponent_bits) - 1;
  if (l.infinities && exponent == top)
    return mantissa == 0 ? (negative ? -1.0f : 1.0f) * std::numeric_limits<float>::infinity() : nan;
  if (format == NarrowFloat::e4m3fn && exponent == top && mantissa == (1 << l.mantissa_bits) - 1)
    return nan;
  const float magnitude =
      exponent == 0 ? std::ldexp(static_cast<float>(mantissa), 1 - l.bias - l.mantissa_bits)
                    : std::ldexp(static_cast<float>(mantissa + (1 << l.mantissa_bits)),
                                 exponent - l.bias - l.mantissa_bits);
  return negative ? -magnitude : magnitude;
}

float narrow_float_round(float value, NarrowFloat format, bool saturate) {
  const NarrowLayout l = layout_of(format);
  const float max = narrow_float_max(format);
  if (std::isnan(value))
    return l.nan ? value : -0.0f;
  if (format == NarrowFloat::e2m1fn)
    saturate = true;
  double a = std::fabs(static_cast<double>(value));
  const bool negative = std::signbit(value);
  if (saturate && a > max)
    a = max;
  // The spacing of the format's values around a: that of its binade, or the subnormals'.
  const int min_exponent = 1 - l.bias;
  const int e = a == 0 ? min_exponent : std::max(std::ilogb(a), min_exponent);
  const double spacing = std::ldexp(1.0, e - l.mantissa_bits);
  double rounded = std::nearbyint(a / spacing) * spacing;  // ties to even (default mode)
  if (rounded > max)
    rounded = l.infinities ? std::numeric_limits<double>::infinity()
                           : std::numeric_limits<double>::quiet_NaN();
  if (std::isinf(a) && !saturate)
    rounded = l.infinities ? a : std::numeric_limits<double>::quiet_NaN();
  if (rounded == 0 && !l.negative_zero)
    return 0.0f;
  return static_cast<float>(negative ? -rounded : rounded);
}

}  // namespace loom
