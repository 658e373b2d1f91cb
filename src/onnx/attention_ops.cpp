// onnx/attention_ops.cpp — ONNX Attention (opset 23) as catalog calls: scaled
// products, the bias from the mask, causality and padding, softcap, softmax, and grouped
// key/value heads; and the ops that pick elements by index (GatherElements, TopK) or
// build one-hot tensors (OneHot, Hardmax, EyeLike).
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "core/checked.h"
#include "onnx/runner.h"

namespace loom::nn::onnx_import {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// [B, L, H*D] -> [B, H, L, D]
ag::Var split_heads(Runner& r, const ag::Var& x, std::int64_t heads, const std::string& where) {
  const Shape& s = x.shape();
  check(heads > 0 && s[2] % heads == 0, where + ": hidden size " + std::to_string(s[2]) +
                                            " does not divide into " + std::to_string(heads) +
                                            " heads");
  return ag::permute(r.tape, ag::reshape(r.tape, x, {s[0], s[1], heads, s[2] / heads}),
                     {0, 2, 1, 3});
}

void attention(Runner& r, const io::OnnxNode& n) {
  ag::Var q = r.var(n, 0), k = r.var(n, 1), v = r.var(n, 2);
  const bool three_d = q.shape().size() == 3;
  check(q.shape().size() == k.shape().size() && q.shape().size() == v.shape().size() &&
            (three_d || q.shape().size() == 4),
        r.where(n) + ": Q, K and V must all be 3-D or all 4-D");
  if (three_d) {
    const std::int64_t q_heads = r.attr_int(n, "q_num_heads", 0);
    const std::int64_t kv_heads = r.attr_int(n, "kv_num_heads", 0);
    check(q_heads > 0 && kv_heads > 0,
          r.where(n) + ": 3-D inputs need q_num_heads and kv_num_heads");
    q = split_heads(r, q, q_heads, r.where(n));
    k = split_heads(r, k, kv_heads, r.where(n));
    v = split_heads(r, v, kv_heads, r.where(n));
  }
  const std::int64_t batch = q.dim(0), q_heads = q.dim(1), length = q.dim(2);
  const double scale = r.attr_float(n, "scale", 1.0 / std::sqrt(static_cast<double>(q.dim(3))));
  std::int64_t past = 0;
  if (r.has_input(n, 4)) {
    past = r.var(n, 4).dim(2);
    k = ag::concat(r.tape, {r.var(n, 4), k}, 2);
  }
  if (r.has_input(n, 5))
    v = ag::concat(r.tape, {r.var(n, 5), v}, 2);
  if (n.outputs.size() > 1 && !n.outputs[1].empty())
    r.set(n, 1, k);
  if (n.outputs.size() > 2 && !n.outputs[2].empty())
    r.set(n, 2, v);
  const std::int64_t total = k.dim(2);

  // The additive bias [L, total] (or the mask's broadcast shape): the mask (a boolean one
  // as 0 / -inf), padded with -inf up to the key length, plus -inf above the causal
  // diagonal (offset by the past length).
  std::optional<ag::Var> bias;
  if (r.has_input(n, 3)) {
    const Value& mask = r.value(n, 3);
    ag::Var m;
    if (mask.host.defined()) {
      std::vector<std::int64_t> keep = host_values(r.host, mask.host);
      std::vector<float> f(keep.size());
      for (std::size_t i = 0; i < keep.size(); ++i)
        f[i] = keep[i] != 0 ? 0.0f : kMinusInf;
      m = r.constant(Tensor::from_floats(mask.host.shape(), f, r.host));
    } else {
      m = mask.var;
    }
    // The spec's mask broadcasts to [B, heads, L, total]: a scalar has no key axis to pad.
    check(!m.shape().empty(), r.where(n) +
                                  ": attn_mask is a scalar; expected a tensor whose "
                                  "last dimension runs over the keys");
    const std::int64_t short_by = total - m.shape().back();
    check(short_by >= 0, r.where(n) + ": the mask's last dimension " +
                             std::to_string(m.shape().back()) + " exceeds the key length " +
                             std::to_string(total));
    if (short_by > 0) {
      Shape pad = m.shape();
      pad.back() = short_by;
      m = ag::concat(
          r.tape,
          {m, r.constant(Tensor::from_floats(
                  pad, std::vector<float>(static_cast<std::size_t>(shape_numel(pad)), kMinusInf),
                  r.host))},
          static_cast<int>(pad.size()) - 1);
    }
    bias = m;
  }
  if (r.attr_int(n, "is_causal", 0) != 0) {
    std::vector<float> causal(static_cast<std::size_t>(length * total), 0.0f);
    for (std::int64_t i = 0; i < length; ++i)
      for (std::int64_t j = 0; j < total; ++j)
        if (j > past + i)
          causal[static_cast<std::size_t>(i * total + j)] = kMinusInf;
    ag::Var c = r.constant(Tensor::from_floats({length, total}, causal, r.host));
    bias = bias ? ag::add(r.tape, *bias, c) : c;
  }
  if (r.has_input(n, 6)) {  // nonpad_kv_seqlen [B]: keys at or beyond it are padding
    const std::vector<std::int64_t> valid = r.ints(n, 6);
    check(static_cast<std::int64_t>(valid.size()) == batch,
          r.where(n) + ": nonpad_kv_seqlen has " + std::to_string(valid.size()) +
              " entries for a batch of " + std::to_string(batch));
    std::vector<float> pad(static_cast<std::size_t>(batch * total), 0.0f);
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t j = std::max<std::int64_t>(valid[static_cast<std::size_t>(b)], 0);
           j < total; ++j)
        pad[static_cast<std::size_t>(b * total + j)] = kMinusInf;
    ag::Var p = r.constant(Tensor::from_floats({batch, 1, 1, total}, pad, r.host));
    bias = bias ? ag::add(r.tape, *bias, p) : p;
  }

  // Grouped keys and values: each of kv_heads serves q_heads / kv_heads query heads,
  // interleaved (h0, h0, h1, h1, ...).
  const std::int64_t kv_heads = k.dim(1);
  check(kv_heads > 0 && q_heads % kv_heads == 0, r.where(n) + ": " + std::to_string(q_heads) +
                                                     " query heads do not group over " +
                                                     std::to_string(kv_heads) + " key/value heads");
  if (kv_heads != q_heads) {
    const std::int64_t reps = q_heads / kv_heads;
    auto repeat = [&](const ag::Var& x) {
      const Shape& s = x.shape();
      ag::Var wide = ag::expand(r.tape, ag::reshape(r.tape, x, {s[0], s[1], 1, s[2], s[3]}),
                                {s[0], s[1], reps, s[2], s[3]});
      return ag::reshape(r.tape, wide, {s[0], s[1] * reps, s[2], s[3]});
    };
    k = repeat(k);
    v = repeat(v);
  }
  // As the reference: sqrt(scale) on each side of the product.
  const double root = std::sqrt(scale);
  ag::Var scores =
      ag::matmul(r.tape, ag::scale(r.tape, q, root), ag::scale(r.tape, k, root), false, true);
  const double softcap = r.attr_float(n, "softcap", 0.0);
  if (softcap > 0)
    scores = ag::scale(r.tape, ag::tanh(r.tape, ag::scale(r.tape, scores, 1.0 / softcap)), softcap);
  ag::Var biased = bias ? ag::add(r.tape, scores, *bias) : scores;
  ag::Var probs = ag::softmax(r.tape, biased);
  ag::Var y = ag::matmul(r.tape, probs, v);
  if (three_d) {
    const Shape& s = y.shape();
    y = ag::reshape(r.tape, ag::permute(r.tape, y, {0, 2, 1, 3}), {s[0], s[2], s[1] * s[3]});
  }
  r.set(n, 0, y);
  if (n.outputs.size() > 3 && !n.outputs[3].empty()) {
    const std::int64_t mode = r.attr_int(n, "qk_matmul_output_mode", 0);
    check(mode >= 0 && mode <= 3,
          r.where(n) + ": qk_matmul_output_mode " + std::to_string(mode) + " is not 0, 1, 2 or 3");
    r.set(n, 3, mode == 2 ? biased : mode == 3 ? probs : scores);
  }
}

}  // namespace

std::vector<std::int32_t> linear_indices(const Shape& data, const Shape& out,
                                         const std::vector<std::int64_t>& index, int axis,
                                         const std::string& where) {
  const Strides strides = contiguous_strides(data);
  std::vector<std::int32_t> linear(index.size());
  const std::int64_t dim = data[static_cast<std::size_t>(axis)];
  check(shape_numel(data) < (std::int64_t{1} << 31),
        where + ": the data holds more than 2^31 elements");
  std::vector<std::int64_t> at(out.size(), 0);
  for (std::size_t e = 0; e < index.size(); ++e) {
    std::int64_t i = index[e];
    check(i >= -dim && i < dim, where + ": index " + std::to_string(i) + " is outside [" +
                                    std::to_string(-dim) + ", " + std::to_string(dim) + ")");
    std::int64_t offset = 0;
    for (std::size_t d = 0; d < out.size(); ++d)
      offset += (static_cast<int>(d) == axis ? (i < 0 ? i + dim : i) : at[d]) * strides[d];
    linear[e] = static_cast<std::int32_t>(offset);
    for (std::size_t d = out.size(); d-- > 0;) {
      if (++at[d] < out[d])
        break;
      at[d] = 0;
    }
  }
  return linear;
}

// Elements of x at linear positions, shaped `out`: an embedding lookup of x as a column,
// so the gradient scatters back to the positions picked.
ag::Var pick_elements(Runner& r, const ag::Var& x, const std::vector<std::int32_t>& linear,
                      const Shape& out) {
  ag::Var column = ag::reshape(r.tape, x, {x.value().numel(), 1});
  Tensor ids =
      Tensor::from_ints({static_cast<std::int64_t>(linear.size())}, linear, r.host).to(r.backend);
  return ag::reshape(r.tape, ag::embedding(r.tape, column, ids), out);
}

namespace {

void gather_elements(Runner& r, const io::OnnxNode& n) {
  const Shape data = r.shape_of(n, 0);
  const Tensor& indices = r.value(n, 1).host;
  check(indices.defined(), r.where(n) + ": indices must be an integer tensor");
  const int rank = static_cast<int>(data.size());
  check(indices.rank() == rank, r.where(n) + ": indices and data differ in rank");
  const int axis = axis_of(r.attr_int(n, "axis", 0), rank, r.where(n));
  for (int d = 0; d < rank; ++d)
    check(
        d == axis || indices.shape()[d] <= data[static_cast<std::size_t>(d)],
        r.where(n) + ": indices " + shape_str(indices.shape()) + " exceed data " + shape_str(data));
  const std::vector<std::int32_t> linear =
      linear_indices(data, indices.shape(), host_values(r.host, indices), axis, r.where(n));
  if (is_host(r, n, 0)) {
    const std::vector<std::int64_t> values = r.ints(n, 0);
    std::vector<std::int64_t> out(linear.size());
    for (std::size_t i = 0; i < linear.size(); ++i)
      out[i] = values[static_cast<std::size_t>(linear[i])];
    r.set_host(n, 0, host_ints(r.host, indices.shape(), out));
    return;
  }
  r.set(n, 0, pick_elements(r, r.var(n, 0), linear, indices.shape()));
}

// TopK: the k largest (or smallest) along `axis`, sorted (ties by lower index); the
// indices come from the values read on the host, the values are picked from x on the
// device, so their gradient reaches x.
void top_k(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const Shape& s = x.shape();
  const int rank = static_cast<int>(s.size());
  const int axis = axis_of(r.attr_int(n, "axis", -1), rank, r.where(n));
  const bool largest = r.attr_int(n, "largest", 1) != 0;
  const std::int64_t k = r.ints(n, 1).at(0), dim = s[static_cast<std::size_t>(axis)];
  check(k >= 0 && k <= dim,
        r.where(n) + ": k " + std::to_string(k) + " is outside [0, " + std::to_string(dim) + "]");
  const std::vector<float> v = r.read_on_host(n, x.value()).to_floats();
  const std::int64_t inner = shape_numel(Shape(s.begin() + axis + 1, s.end()));
  const std::int64_t outer = shape_numel(Shape(s.begin(), s.begin() + axis));
  Shape out = s;
  out[static_cast<std::size_t>(axis)] = k;
  std::vector<std::int64_t> chosen(static_cast<std::size_t>(shape_numel(out)));
  std::vector<std::int64_t> order(static_cast<std::size_t>(dim));
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      auto at = [&](std::int64_t j) {
        return v[static_cast<std::size_t>((o * dim + j) * inner + i)];
      };
      std::iota(order.begin(), order.end(), std::int64_t{0});
      std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
        return largest ? at(a) > at(b) : at(a) < at(b);
      });
      for (std::int64_t j = 0; j < k; ++j)
        chosen[static_cast<std::size_t>((o * k + j) * inner + i)] =
            order[static_cast<std::size_t>(j)];
    }
  r.set(n, 0, pick_elements(r, x, linear_indices(s, out, chosen, axis, r.where(n)), out));
  if (n.outputs.size() > 1 && !n.outputs[1].empty())
    r.set_host(n, 1, host_ints(r.host, out, chosen));
}

// OneHot(indices, depth, values [off, on]): one more axis of `depth` (at `axis`), on at
// each index (negative ones count from the end), off elsewhere.
void one_hot(Runner& r, const io::OnnxNode& n) {
  const Tensor& indices_t = r.value(n, 0).host;
  check(indices_t.defined() || r.value(n, 0).var.defined(), r.where(n) + ": no indices");
  std::vector<std::int64_t> indices;
  Shape in_shape;
  if (indices_t.defined()) {
    indices = host_values(r.host, indices_t);
    in_shape = indices_t.shape();
  } else {  // float indices: truncated, as the reference casts them
    const std::vector<float> f = r.read_on_host(n, r.var(n, 0).value()).to_floats();
    indices.assign(f.begin(), f.end());
    in_shape = r.var(n, 0).shape();
  }
  std::int64_t depth = 0;
  if (is_host(r, n, 1))
    depth = r.ints(n, 1).at(0);
  else
    depth = static_cast<std::int64_t>(r.read_on_host(n, r.var(n, 1).value()).to_floats().at(0));
  check(depth > 0, r.where(n) + ": depth " + std::to_string(depth) + " is not positive");
  const int rank = static_cast<int>(in_shape.size()) + 1;
  const int axis = axis_of(r.attr_int(n, "axis", -1), rank, r.where(n));
  Shape out = in_shape;
  out.insert(out.begin() + axis, depth);
  const std::int64_t inner = shape_numel(Shape(in_shape.begin() + axis, in_shape.end()));
  const std::int64_t outer = shape_numel(Shape(in_shape.begin(), in_shape.begin() + axis));
  std::vector<std::uint8_t> on(static_cast<std::size_t>(shape_numel(out)), 0);
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      std::int64_t c = indices[static_cast<std::size_t>(o * inner + i)];
      if (c < 0)
        c += depth;
      if (c >= 0 && c < depth)
        on[static_cast<std::size_t>((o * depth + c) * inner + i)] = 1;
    }
  Tensor mask = Tensor::from_host(out, DType::u8, on.data(), r.host);
  if (is_host(r, n, 2)) {
    const std::vector<std::int64_t> values = r.ints(n, 2);
    check(values.size() == 2, r.where(n) + ": values must hold [off, on]");
    std::vector<std::int64_t> result(on.size());
    for (std::size_t e = 0; e < on.size(); ++e)
      result[e] = on[e] != 0 ? values[1] : values[0];
    r.set_host(n, 0, host_ints(r.host, out, result));
    return;
  }
  const ag::Var& values = r.var(n, 2);
  check(values.value().numel() == 2, r.where(n) + ": values must hold [off, on]");
  r.set(n, 0,
        ag::where(r.tape, mask.to(r.backend), ag::slice(r.tape, values, 0, 1, 2),
                  ag::slice(r.tape, values, 0, 0, 1)));
}

// Hardmax: 1 at the first largest element along `axis`, 0 elsewhere (no gradient).
void hardmax(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const Shape& s = x.shape();
  const int axis = axis_of(r.attr_int(n, "axis", -1), static_cast<int>(s.size()), r.where(n));
  const std::vector<float> v = r.read_on_host(n, x.value()).to_floats();
  const std::int64_t dim = s[static_cast<std::size_t>(axis)];
  const std::int64_t inner = shape_numel(Shape(s.begin() + axis + 1, s.end()));
  const std::int64_t outer = shape_numel(Shape(s.begin(), s.begin() + axis));
  std::vector<float> out(v.size(), 0.0f);
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner && dim > 0; ++i) {
      std::int64_t best = 0;
      for (std::int64_t j = 1; j < dim; ++j)
        if (v[static_cast<std::size_t>((o * dim + j) * inner + i)] >
            v[static_cast<std::size_t>((o * dim + best) * inner + i)])
          best = j;
      out[static_cast<std::size_t>((o * dim + best) * inner + i)] = 1.0f;
    }
  r.set(n, 0, r.constant(Tensor::from_floats(s, out, r.host)));
}

// EyeLike: ones on diagonal k of a matrix shaped like the input, in its type (or dtype).
void eye_like(Runner& r, const io::OnnxNode& n) {
  const Shape s = r.shape_of(n, 0);
  check(s.size() == 2, r.where(n) + ": the input must be a matrix");
  const std::int64_t k = r.attr_int(n, "k", 0);
  std::vector<std::int64_t> ones(static_cast<std::size_t>(shape_numel(s)), 0);
  for (std::int64_t i = 0; i < s[0]; ++i)
    if (i + k >= 0 && i + k < s[1])
      ones[static_cast<std::size_t>(i * s[1] + i + k)] = 1;
  const std::int64_t dtype = r.attr_int(n, "dtype", is_host(r, n, 0) ? 7 : 1);
  if (dtype == 1 || dtype == 10 || dtype == 11 || dtype == 16) {
    std::vector<float> f(ones.begin(), ones.end());
    r.set(n, 0, r.constant(Tensor::from_floats(s, f, r.host)));
  } else {
    r.set_host(n, 0, host_ints(r.host, s, ones));
  }
}

}  // namespace

void add_attention_ops(OpTable& table) {
  table["Attention"] = attention;
  table["EyeLike"] = eye_like;
  table["GatherElements"] = gather_elements;
  table["Hardmax"] = hardmax;
  table["OneHot"] = one_hot;
  table["TopK"] = top_k;
}

}  // namespace loom::nn::onnx_import
