// core/reference_util.h — index helpers shared by the reference kernels (and tests).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace loom {

// Strides (in elements, contiguous layout of `in`) that read `in` broadcast to `out`:
// 0 along broadcast dimensions. `in` aligns with the trailing dimensions of `out`.
inline Strides broadcast_strides(const Shape& in, const Shape& out) {
  Strides dense = contiguous_strides(in);
  Strides s(out.size(), 0);
  std::size_t lead = out.size() - in.size();
  for (std::size_t i = 0; i < in.size(); ++i) s[lead + i] = in[i] == 1 ? 0 : dense[i];
  return s;
}

inline std::int64_t offset_of(const std::vector<std::int64_t>& index, const Strides& strides) {
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < index.size(); ++i) offset += index[i] * strides[i];
  return offset;
}

// Calls f(linear_index, multi_index) for every element of `shape`, in row-major order.
template <class F>
void for_each_index(const Shape& shape, F f) {
  std::int64_t total = shape_numel(shape);
  std::vector<std::int64_t> index(shape.size(), 0);
  for (std::int64_t n = 0; n < total; ++n) {
    f(n, index);
    for (std::size_t i = shape.size(); i-- > 0;) {
      if (++index[i] < shape[i]) break;
      index[i] = 0;
    }
  }
}

}  // namespace loom
