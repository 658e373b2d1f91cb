// core/reference_util.h — index helpers shared by the reference kernels (and tests).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/tensor.h"

namespace loom {

// Strides (in elements, contiguous layout of `in`) that read `in` broadcast to `out`:
// 0 along broadcast dimensions. `in` aligns with the trailing dimensions of `out`.
inline Strides broadcast_strides(const Shape& in, const Shape& out) {
  Strides dense = contiguous_strides(in);
  Strides s(out.size(), 0);
  std::size_t lead = out.size() - in.size();
  for (std::size_t i = 0; i < in.size(); ++i)
    s[lead + i] = in[i] == 1 ? 0 : dense[i];
  return s;
}

inline std::int64_t offset_of(const std::vector<std::int64_t>& index, const Strides& strides) {
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < index.size(); ++i)
    offset += index[i] * strides[i];
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
      if (++index[i] < shape[i])
        break;
      index[i] = 0;
    }
  }
}

// top_k of one row of `width` values: the k largest, larger first, equal values by the lower
// index (a strict total order: any correct selection gives these indices). `order` is
// scratch of at least `width` entries.
inline void top_k_row(const float* row, std::int64_t width, std::int64_t k, float* values,
                      std::int32_t* indices, std::vector<std::int32_t>& order) {
  order.resize(static_cast<std::size_t>(width));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.begin() + width,
                    [&](std::int32_t a, std::int32_t b) {
                      return row[a] > row[b] || (row[a] == row[b] && a < b);
                    });
  for (std::int64_t j = 0; j < k; ++j) {
    indices[j] = order[static_cast<std::size_t>(j)];
    values[j] = row[indices[j]];
  }
}

}  // namespace loom
