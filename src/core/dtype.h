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
