// core/broadcast.h — how one operand of a broadcasting binary op repeats inside the
// output. Backends use it to pick fast kernels (and to say what they support).
#pragma once

#include <cstdint>

#include <utility>
#include <vector>

#include "core/op_catalog.h"
#include "core/reference_util.h"
#include "core/tensor.h"

namespace loom {

struct Repeat {
  enum Kind { same, scalar, trailing, per_row, other } kind;
  std::int64_t period = 0;  // trailing: block length; per_row: how often each value repeats
};

// same: equal shapes; scalar: one element; trailing: `in` equals the trailing dims of
// `out` (a bias); per_row: `in` equals the leading dims of `out` and is 1 on the rest
// ([rows,1] against [rows,C]); other: anything else.
inline Repeat classify_broadcast(const Shape& in, const Shape& out) {
  if (in == out)
    return {Repeat::same};
  std::int64_t n = shape_numel(in);
  if (n == 1)
    return {Repeat::scalar};
  if (n == 0)  // an empty operand (so an empty output): no period to repeat
    return {Repeat::other};
  std::size_t first = 0;
  while (first < in.size() && in[first] == 1)
    ++first;
  std::size_t len = in.size() - first;
  if (len > out.size())
    return {Repeat::other};
  bool trailing = true;
  for (std::size_t i = 0; i < len; ++i)
    trailing = trailing && in[first + i] == out[out.size() - len + i];
  if (trailing)
    return {Repeat::trailing, n};
  if (in.size() == out.size()) {
    std::size_t k = 0;
    while (k < in.size() && in[k] == out[k])
      ++k;
    bool ones = k > 0;
    for (std::size_t i = k; i < in.size(); ++i)
      ones = ones && in[i] == 1;
    if (ones)
      return {Repeat::per_row, shape_numel(out) / n};
  }
  return {Repeat::other};
}

// For a batched matmul c[..., M, N] = a[..., M|K, K|M] b[..., K|N, N|K] with numpy-broadcast
// batch dims: the element offset of each batch's a and b matrix, in c's batch order.
inline std::vector<std::pair<std::int64_t, std::int64_t>> matmul_batch_offsets(const Shape& a,
                                                                               const Shape& b,
                                                                               const Shape& c) {
  Shape batch(c.begin(), c.end() - 2);
  Strides as = broadcast_strides(Shape(a.begin(), a.end() - 2), batch);  // in matrices
  Strides bs = broadcast_strides(Shape(b.begin(), b.end() - 2), batch);
  std::int64_t a_mat = a[a.size() - 2] * a.back(), b_mat = b[b.size() - 2] * b.back();
  std::vector<std::pair<std::int64_t, std::int64_t>> offsets;
  offsets.reserve(static_cast<std::size_t>(shape_numel(batch)));
  for_each_index(batch, [&](std::int64_t, const std::vector<std::int64_t>& idx) {
    offsets.emplace_back(offset_of(idx, as) * a_mat, offset_of(idx, bs) * b_mat);
  });
  return offsets;
}

// How a reduction over `axes` (empty: all) of x lies in memory: over a suffix of the dims
// (each output element sums one contiguous row), a prefix (each output element sums one
// column of a [rows, cols] view), or neither. Device backends reduce the first two natively.
enum class ReduceShape { rows, cols, unsupported };
inline ReduceShape classify_reduction(const Tensor& x, const std::vector<std::int64_t>& axes) {
  if (x.rank() == 0)
    return ReduceShape::unsupported;
  std::vector<bool> reduce(x.rank(), axes.empty());
  for (auto a : axes)
    reduce[normalize_axis(a, x.rank(), "sum")] = true;
  int split = 0;
  while (split < x.rank() && reduce[split])
    ++split;
  bool prefix = split > 0;
  for (int d = split; d < x.rank(); ++d)
    prefix = prefix && !reduce[d];
  int kept = 0;
  while (kept < x.rank() && !reduce[kept])
    ++kept;
  bool suffix = kept < x.rank();
  for (int d = kept; d < x.rank(); ++d)
    suffix = suffix && reduce[d];
  if (suffix)
    return ReduceShape::rows;
  if (prefix)
    return ReduceShape::cols;
  return ReduceShape::unsupported;
}

}  // namespace loom
