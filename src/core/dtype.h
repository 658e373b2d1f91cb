// core/dtype.h — element types. f32 is the compute type; bf16 and f16 are storage
// types (weights on disk, future low-precision backends); i32 holds token ids and labels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace loom {

enum class DType : std::uint8_t { f32, bf16, f16, i32, i64, u8 };

std::size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);        // "f32", "bf16", ...
std::string_view safetensors_name(DType dtype);  // "F32", "BF16", ...
// Parses a safetensors dtype string; returns false for one Loom does not store.
bool parse_safetensors_dtype(std::string_view text, DType& out);

// bf16 keeps the top 16 bits of an IEEE float; conversion rounds to nearest even.
std::uint16_t float_to_bf16(float value);
float bf16_to_float(std::uint16_t bits);
std::uint16_t float_to_f16(float value);
float f16_to_float(std::uint16_t bits);

}  // namespace loom

namespace loom {

// The 8-, 4- and 2-bit element types of ONNX (FP8 training, quantised models). Loom does
// not compute in them: their values are held in f32 (every one of them is exactly a
// float), decoded when read and rounded when a cast produces them.
enum class NarrowFloat : std::uint8_t {
  e4m3fn,    // 4 exponent bits (bias 7), 3 mantissa; no infinity, NaN S.1111.111; max 448
  e4m3fnuz,  // bias 8; no infinity, no -0, NaN 0x80; max 240
  e5m2,      // bias 15, IEEE-like with infinities; max 57344
  e5m2fnuz,  // bias 16; no infinity, no -0, NaN 0x80; max 57344
  e2m1fn,    // FP4: 2 exponent bits (bias 1), 1 mantissa; no infinity or NaN; max 6
};

float narrow_float_max(NarrowFloat format);
// The value of `bits` (the low 8 bits; the low 4 for e2m1fn).
float narrow_float_decode(std::uint8_t bits, NarrowFloat format);
// `value` rounded to the nearest value of `format` (ties to even). With `saturate`,
// values beyond the largest (infinities included) become the largest; without it they
// become infinity where the format has one, else NaN. e2m1fn always saturates, and
// holds no NaN (a NaN gives -0, as ml_dtypes, the ONNX reference, does).
float narrow_float_round(float value, NarrowFloat format, bool saturate);

}  // namespace loom
