// ONNX ops that write or read elements by index (ScatterElements, Scatter, ScatterND,
// GatherND), GroupNormalization and Einsum, as catalog calls.
//
// A scatter is a gather: every output element is either data's own or one update's, so
// the output is one embedding lookup in [data; updates] at the index of the element that
// lands there, and the gradient reaches data and updates through it. With a reduction
// (add, mul, max, min) the updates that meet at one position are applied in rounds: round
// k combines each position's k-th update with the value so far.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/checked.h"
#include "core/reference_util.h"
#include "onnx/runner.h"

namespace loom::nn::onnx_import {

namespace {

// targets[u]: the linear position in data that update element u writes.
void scatter(Runner& r, const io::OnnxNode& n, const std::vector<std::int32_t>& targets,
             const Shape& updates_shape) {
  const std::string reduction =
      n.attributes.count("reduction") ? n.attributes.at("reduction").s : "none";
  check(reduction == "none" || reduction == "add" || reduction == "mul" || reduction == "max" ||
            reduction == "min",
        r.where(n) + ": reduction '" + reduction + "' is not none, add, mul, max or min");
  check(r.shape_of(n, 2) == updates_shape, r.where(n) + ": updates are " +
                                               shape_str(r.shape_of(n, 2)) + ", expected " +
                                               shape_str(updates_shape));
  if (is_host(r, n, 0)) {  // integers (shapes, indices): on the host
    std::vector<std::int64_t> out = r.ints(n, 0);
    const std::vector<std::int64_t> upd = r.ints(n, 2);
    for (std::size_t u = 0; u < targets.size(); ++u) {
      std::int64_t& y = out[static_cast<std::size_t>(targets[u])];
      const std::int64_t v = upd[u];
      y = reduction == "none"  ? v
          : reduction == "add" ? y + v
          : reduction == "mul" ? y * v
          : reduction == "max" ? std::max(y, v)
                               : std::min(y, v);
    }
    r.set_host(n, 0, host_tensor(r.host, r.shape_of(n, 0), out, r.value(n, 0).host.dtype()));
    return;
  }
  const ag::Var data = r.as_float(n, 0), updates = r.as_float(n, 2);
  const std::int64_t size = data.value().numel(), count = updates.value().numel();
  check(size + count < (std::int64_t{1} << 31),
        r.where(n) + ": data and updates hold more than 2^31 elements");
  // The updates meeting at each position, in order.
  std::map<std::int32_t, std::vector<std::int32_t>> writers;
  for (std::size_t u = 0; u < targets.size(); ++u)
    writers[targets[u]].push_back(static_cast<std::int32_t>(u));
  ag::Var both = ag::concat(
      r.tape, {ag::reshape(r.tape, data, {size}), ag::reshape(r.tape, updates, {count})}, 0);
  if (reduction == "none") {  // the last update at a position wins (ONNX Runtime's choice)
    std::vector<std::int32_t> ids(static_cast<std::size_t>(size));
    for (std::int64_t p = 0; p < size; ++p)
      ids[static_cast<std::size_t>(p)] = static_cast<std::int32_t>(p);
    for (const auto& [p, us] : writers)
      ids[static_cast<std::size_t>(p)] = static_cast<std::int32_t>(size + us.back());
    r.set(n, 0, pick_elements(r, both, ids, data.shape()));
    return;
  }
  std::size_t rounds = 0;
  for (const auto& [p, us] : writers)
    rounds = std::max(rounds, us.size());
  // Each round is one pass over data and updates: many updates meeting at one position
  // would cost rounds x (data + updates) on the device and on the tape.
  check(static_cast<double>(rounds) * static_cast<double>(size + count) <= double(1 << 28),
        r.where(n) + ": " + std::to_string(rounds) + " updates meet at one position; with " +
            std::to_string(size + count) +
            " elements that is more work than Loom does for one "
            "scatter (2^28 element passes)");
  ag::Var y = data;
  for (std::size_t k = 0; k < rounds; ++k) {
    // Each position's k-th update, or (where it has none) the value that leaves y as it is.
    std::vector<std::int32_t> ids(static_cast<std::size_t>(size));
    std::vector<std::uint8_t> has(static_cast<std::size_t>(size), 0);
    ag::Var current = ag::concat(
        r.tape, {ag::reshape(r.tape, y, {size}), ag::reshape(r.tape, updates, {count})}, 0);
    for (std::int64_t p = 0; p < size; ++p)
      ids[static_cast<std::size_t>(p)] = static_cast<std::int32_t>(p);
    for (const auto& [p, us] : writers)
      if (k < us.size()) {
        ids[static_cast<std::size_t>(p)] = static_cast<std::int32_t>(size + us[k]);
        has[static_cast<std::size_t>(p)] = 1;
      }
    ag::Var picked = pick_elements(r, current, ids, data.shape());  // y where no update
    Tensor mask = Tensor::from_host(data.shape(), DType::u8, has.data(), r.host).to(r.backend);
    ag::Var combined =
        reduction == "add"   ? ag::add(r.tape, y, picked)
        : reduction == "mul" ? ag::mul(r.tape, y, picked)
        : reduction == "max"
            ? ag::where(r.tape, compare_on_device(y.value(), picked.value(), Comparison::ge), y,
                        picked)
            : ag::where(r.tape, compare_on_device(y.value(), picked.value(), Comparison::le), y,
                        picked);
    y = ag::where(r.tape, mask, combined, y);
  }
  r.set(n, 0, y);
}

// ScatterElements (and Scatter, its older name): updates[e] goes to data at element e's
// coordinates with indices[e] along `axis`.
void scatter_elements(Runner& r, const io::OnnxNode& n) {
  const Shape data = r.shape_of(n, 0);
  const Tensor& indices = r.value(n, 1).host;
  check(indices.defined(), r.where(n) + ": indices must be an integer tensor");
  const int rank = static_cast<int>(data.size());
  check(indices.rank() == rank, r.where(n) + ": indices and data differ in rank");
  const int axis = axis_of(r.attr_int(n, "axis", 0), rank, r.where(n));
  for (int d = 0; d < rank; ++d)
    check(
        d == axis ||
            indices.shape()[static_cast<std::size_t>(d)] <= data[static_cast<std::size_t>(d)],
        r.where(n) + ": indices " + shape_str(indices.shape()) + " exceed data " + shape_str(data));
  scatter(r, n,
          linear_indices(data, indices.shape(), host_values(r.host, indices), axis, r.where(n)),
          indices.shape());
}

// The linear positions that ScatterND and GatherND address: indices [..., k] names the
// first k coordinates of data; each names a slice of the remaining dims. Returns, for each
// index tuple in order, the first linear position of its slice, and the slice's size.
std::pair<std::vector<std::int64_t>, std::int64_t> nd_slices(const Runner& r, const io::OnnxNode& n,
                                                             const Shape& data,
                                                             const Tensor& indices,
                                                             std::int64_t batch_dims) {
  check(indices.rank() >= 1, r.where(n) + ": indices need at least one axis");
  const std::int64_t k = indices.shape().back();
  check(batch_dims >= 0 && batch_dims <= static_cast<std::int64_t>(data.size()) && k >= 1 &&
            batch_dims + k <= static_cast<std::int64_t>(data.size()),
        r.where(n) + ": indices' last dimension " + std::to_string(k) + " with batch_dims " +
            std::to_string(batch_dims) + " does not fit data " + shape_str(data));
  const Strides strides = contiguous_strides(data);
  std::int64_t slice = 1;
  for (std::size_t d = static_cast<std::size_t>(batch_dims + k); d < data.size(); ++d)
    slice *= data[d];
  std::int64_t batch = 1;
  for (std::int64_t d = 0; d < batch_dims; ++d) {
    const auto du = static_cast<std::size_t>(d);
    check(du + 1 < indices.shape().size() && indices.shape()[du] == data[du],
          r.where(n) + ": indices " + shape_str(indices.shape()) + " and data " + shape_str(data) +
              " differ in their first " + std::to_string(batch_dims) + " (batch) dimensions");
    batch *= data[du];
  }
  const std::vector<std::int64_t> idx = host_values(r.host, indices);
  const std::int64_t tuples = static_cast<std::int64_t>(idx.size()) / k;
  check(batch_dims == 0 || (batch > 0 && tuples % batch == 0),
        r.where(n) + ": indices do not split over the " + std::to_string(batch) + " batches");
  std::vector<std::int64_t> starts;
  for (std::int64_t t = 0; t < tuples; ++t) {
    const std::int64_t b = batch_dims == 0 ? 0 : t / (tuples / batch);
    std::int64_t offset =
        b * (batch_dims == 0 ? 0 : strides[static_cast<std::size_t>(batch_dims - 1)]);
    for (std::int64_t j = 0; j < k; ++j) {
      const auto d = static_cast<std::size_t>(batch_dims + j);
      std::int64_t i = idx[static_cast<std::size_t>(t * k + j)];
      check(i >= -data[d] && i < data[d], r.where(n) + ": index " + std::to_string(i) +
                                              " is outside [" + std::to_string(-data[d]) + ", " +
                                              std::to_string(data[d]) + ")");
      offset += (i < 0 ? i + data[d] : i) * strides[d];
    }
    starts.push_back(offset);
  }
  return {starts, slice};
}

// Every linear position in data that ScatterND writes or GatherND reads, in order, and the
// shape they make: indices' leading dims, then the addressed slices' dims.
std::pair<std::vector<std::int32_t>, Shape> nd_positions(const Runner& r, const io::OnnxNode& n,
                                                         std::int64_t batch_dims) {
  const Shape data = r.shape_of(n, 0);
  const Tensor& indices = r.value(n, 1).host;
  check(indices.defined(), r.where(n) + ": indices must be an integer tensor");
  check(shape_numel(data) < (std::int64_t{1} << 31),
        r.where(n) + ": the data holds more than 2^31 elements");
  const auto [starts, slice] = nd_slices(r, n, data, indices, batch_dims);
  check(checked_mul(static_cast<std::int64_t>(starts.size()), slice, r.where(n)) <
            (std::int64_t{1} << 31),
        r.where(n) + ": the indices address more than 2^31 elements");
  std::vector<std::int32_t> linear;
  for (std::int64_t s : starts)
    for (std::int64_t e = 0; e < slice; ++e)
      linear.push_back(static_cast<std::int32_t>(s + e));
  Shape shape(indices.shape().begin(), indices.shape().end() - 1);
  shape.insert(shape.end(), data.begin() + batch_dims + indices.shape().back(), data.end());
  return {linear, shape};
}

void scatter_nd(Runner& r, const io::OnnxNode& n) {
  const auto [targets, updates] = nd_positions(r, n, 0);
  scatter(r, n, targets, updates);
}

void gather_nd(Runner& r, const io::OnnxNode& n) {
  const auto [linear, out] = nd_positions(r, n, r.attr_int(n, "batch_dims", 0));
  if (is_host(r, n, 0)) {
    const std::vector<std::int64_t> values = r.ints(n, 0);
    std::vector<std::int64_t> picked;
    for (std::int32_t i : linear)
      picked.push_back(values[static_cast<std::size_t>(i)]);
    r.set_host(n, 0, host_tensor(r.host, out, picked, r.value(n, 0).host.dtype()));
    return;
  }
  r.set(n, 0, pick_elements(r, r.var(n, 0), linear, out));
}

// GroupNormalization: x [N, C, ...] as [N, G, C/G x spatial], normalised over the last
// axis (biased variance), back to [N, C, ...], then scale and bias per channel (opset 21;
// opset 18's are per group, each group's value used for its channels).
void group_normalization(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const Shape& s = x.shape();
  check(s.size() >= 2, r.where(n) + ": the input needs a channel axis");
  const std::int64_t groups = r.attr_int(n, "num_groups", 0), channels = s[1];
  check(groups >= 1 && channels % groups == 0, r.where(n) + ": num_groups " +
                                                   std::to_string(groups) + " does not divide " +
                                                   std::to_string(channels) + " channels");
  check(shape_numel(s) > 0, r.where(n) + ": the input " + shape_str(s) + " is empty");
  const double eps = r.attr_float(n, "epsilon", 1e-5);
  ag::Var grouped = ag::reshape(r.tape, x, {s[0], groups, shape_numel(s) / (s[0] * groups)});
  ag::Var mean = ag::mean(r.tape, grouped, {2}, true);
  ag::Var centred = ag::sub(r.tape, grouped, mean);
  ag::Var var = ag::mean(r.tape, ag::mul(r.tape, centred, centred), {2}, true);
  ag::Var normed = ag::div(
      r.tape, centred, ag::sqrt(r.tape, ag::add(r.tape, var, r.scalar(static_cast<float>(eps)))));
  Shape per_channel(s.size(), 1);
  per_channel[1] = channels;
  auto affine = [&](std::size_t i) {
    ag::Var v = r.var(n, i);
    if (v.value().numel() == groups && groups != channels) {  // opset 18: one per group
      v = ag::expand(r.tape, ag::reshape(r.tape, v, {groups, 1}), {groups, channels / groups});
    }
    return ag::reshape(r.tape, v, per_channel);
  };
  ag::Var y = ag::reshape(r.tape, normed, s);
  r.set(n, 0, ag::add(r.tape, ag::mul(r.tape, y, affine(1)), affine(2)));
}

// ---- Einsum --------------------------------------------------------------------------

// An operand with one label per axis: letters by their character, the axes an ellipsis
// stands for by 1000 + their position counted from the right (so they line up across
// operands of different ranks, as numpy broadcasts them).
struct Labelled {
  ag::Var value;
  std::vector<int> labels;
};

std::vector<int> parse_term(const std::string& term, int rank, const std::string& where) {
  std::vector<int> labels;
  const std::size_t dots = term.find("...");
  const std::string before = term.substr(0, dots);
  const std::string after = dots == std::string::npos ? "" : term.substr(dots + 3);
  for (char c : before + after)
    check(std::isalpha(static_cast<unsigned char>(c)),
          where + ": '" + std::string(1, c) + "' in the equation is not a letter");
  const int letters = static_cast<int>(before.size() + after.size());
  const int spread = dots == std::string::npos ? 0 : rank - letters;
  check(rank < 0 || (spread >= 0 && (dots != std::string::npos || letters == rank)),
        where + ": the term '" + term + "' does not fit a rank-" + std::to_string(rank) + " input");
  for (char c : before)
    labels.push_back(c);
  for (int i = spread; i-- > 0;)
    labels.push_back(1000 + i);
  for (char c : after)
    labels.push_back(c);
  return labels;
}

// x with the axes of each repeated label reduced to their diagonal (x[i, i] for "ii").
Labelled diagonal(Runner& r, const io::OnnxNode& n, Labelled x) {
  for (;;) {
    std::size_t p = 0, q = 0;
    for (std::size_t a = 0; a < x.labels.size() && q == 0; ++a)
      for (std::size_t b = a + 1; b < x.labels.size(); ++b)
        if (x.labels[a] == x.labels[b]) {
          p = a, q = b;
          break;
        }
    if (q == 0)
      return x;
    const Shape& s = x.value.shape();
    check(s[p] == s[q], r.where(n) + ": a label repeated in one operand spans dimensions " +
                            std::to_string(s[p]) + " and " + std::to_string(s[q]));
    Shape out = s;
    out.erase(out.begin() + static_cast<std::ptrdiff_t>(q));
    const Strides strides = contiguous_strides(s);
    std::vector<std::int32_t> linear;
    for_each_index(out, [&](std::int64_t, const std::vector<std::int64_t>& index) {
      std::int64_t offset = 0;
      for (std::size_t d = 0, o = 0; d < s.size(); ++d)
        offset += (d == q ? index[p] : index[o++]) * strides[d];
      linear.push_back(static_cast<std::int32_t>(offset));
    });
    x.value = pick_elements(r, x.value, linear, out);
    x.labels.erase(x.labels.begin() + static_cast<std::ptrdiff_t>(q));
  }
}

// Sums x over its labels that are not in `keep`.
Labelled sum_out(Runner& r, Labelled x, const std::vector<int>& keep) {
  std::vector<std::int64_t> axes;
  std::vector<int> kept;
  for (std::size_t a = 0; a < x.labels.size(); ++a) {
    if (std::find(keep.begin(), keep.end(), x.labels[a]) == keep.end())
      axes.push_back(static_cast<std::int64_t>(a));
    else
      kept.push_back(x.labels[a]);
  }
  if (!axes.empty())
    x.value = ag::sum(r.tape, x.value, axes, false);
  x.labels = kept;
  return x;
}

// x's axes in the order of `labels` (each of x's labels among them).
ag::Var arrange(Runner& r, const Labelled& x, const std::vector<int>& labels) {
  std::vector<int> order;
  for (int l : labels)
    order.push_back(
        static_cast<int>(std::find(x.labels.begin(), x.labels.end(), l) - x.labels.begin()));
  bool identity = true;
  for (std::size_t i = 0; i < order.size(); ++i)
    identity = identity && order[i] == static_cast<int>(i);
  return identity ? x.value : ag::permute(r.tape, x.value, order);
}

// The product of a and b summed over their shared labels that `keep` lacks, as one
// batched product: a -> [batch, left, summed], b -> [batch, summed, right].
Labelled contract(Runner& r, const io::OnnxNode& n, const Labelled& a, const Labelled& b,
                  const std::vector<int>& keep) {
  auto has = [](const std::vector<int>& v, int l) {
    return std::find(v.begin(), v.end(), l) != v.end();
  };
  std::map<int, std::int64_t> size;
  for (const Labelled* x : {&a, &b})
    for (std::size_t i = 0; i < x->labels.size(); ++i) {
      const std::int64_t d = x->value.shape()[i];
      auto [it, fresh] = size.emplace(x->labels[i], d);
      check(fresh || it->second == d || it->second == 1 || d == 1,
            r.where(n) + ": a label spans dimensions " + std::to_string(it->second) + " and " +
                std::to_string(d));
      it->second = std::max(it->second, d);
    }
  std::vector<int> batch, left, right, summed;
  for (int l : a.labels)
    (has(b.labels, l) ? (has(keep, l) ? batch : summed) : left).push_back(l);
  for (int l : b.labels)
    if (!has(a.labels, l))
      right.push_back(l);
  auto dims = [&](const std::vector<int>& ls) {
    std::int64_t p = 1;
    for (int l : ls)
      p *= size[l];
    return p;
  };
  auto shaped = [&](const Labelled& x, std::vector<int> order) {
    ag::Var v = arrange(r, x, order);
    Shape full;
    for (int l : order)
      full.push_back(size[l]);
    if (v.shape() != full)  // a size-1 ellipsis axis broadcast against the other operand
      v = ag::expand(r.tape, v, full);
    return v;
  };
  std::vector<int> a_order = batch, b_order = batch;
  a_order.insert(a_order.end(), left.begin(), left.end());
  a_order.insert(a_order.end(), summed.begin(), summed.end());
  b_order.insert(b_order.end(), summed.begin(), summed.end());
  b_order.insert(b_order.end(), right.begin(), right.end());
  ag::Var lhs = ag::reshape(r.tape, shaped(a, a_order), {dims(batch), dims(left), dims(summed)});
  ag::Var rhs = ag::reshape(r.tape, shaped(b, b_order), {dims(batch), dims(summed), dims(right)});
  Labelled out;
  out.labels = batch;
  out.labels.insert(out.labels.end(), left.begin(), left.end());
  out.labels.insert(out.labels.end(), right.begin(), right.end());
  Shape out_shape;
  for (int l : out.labels)
    out_shape.push_back(size[l]);
  out.value = ag::reshape(r.tape, ag::matmul(r.tape, lhs, rhs), out_shape);
  return out;
}

void einsum(Runner& r, const io::OnnxNode& n) {
  std::string equation = n.attributes.count("equation") ? n.attributes.at("equation").s : "";
  equation.erase(std::remove(equation.begin(), equation.end(), ' '), equation.end());
  const std::size_t arrow = equation.find("->");
  const std::string lhs = equation.substr(0, arrow);
  std::vector<std::string> terms;
  for (std::size_t start = 0;;) {
    const std::size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma - start));
    if (comma == std::string::npos)
      break;
    start = comma + 1;
  }
  check(terms.size() == n.inputs.size(), r.where(n) + ": the equation '" + equation + "' has " +
                                             std::to_string(terms.size()) + " terms for " +
                                             std::to_string(n.inputs.size()) + " inputs");
  std::vector<Labelled> operands;
  std::map<int, int> uses;
  for (std::size_t i = 0; i < terms.size(); ++i) {
    Labelled x;
    x.value = r.as_float(n, i);
    x.labels = parse_term(terms[i], static_cast<int>(x.value.shape().size()), r.where(n));
    for (int l : x.labels)  // before the diagonal: implicit "ii" is the trace, as numpy's
      ++uses[l];
    x = diagonal(r, n, x);
    operands.push_back(x);
  }
  std::vector<int> output;
  if (arrow != std::string::npos) {
    int widest = 0;  // the ellipsis in the output spans the widest of the inputs'
    for (const Labelled& x : operands)
      for (int l : x.labels)
        widest = std::max(widest, l >= 1000 ? l - 999 : 0);
    output = parse_term(equation.substr(arrow + 2), -1, r.where(n));
    std::vector<int> expanded;
    for (int l : output) {
      if (l >= 1000)
        continue;
      expanded.push_back(l);
    }
    if (equation.substr(arrow + 2).find("...") != std::string::npos) {
      const std::string out_term = equation.substr(arrow + 2);
      const std::size_t dots = out_term.find("...");
      expanded.clear();
      for (char c : out_term.substr(0, dots))
        expanded.push_back(c);
      for (int i = widest; i-- > 0;)
        expanded.push_back(1000 + i);
      for (char c : out_term.substr(dots + 3))
        expanded.push_back(c);
    }
    output = expanded;
  } else {  // implicit: the ellipsis axes, then the letters used once, alphabetically
    for (const auto& [l, count] : uses)
      if (l >= 1000)
        output.insert(output.begin(), l);
    for (const auto& [l, count] : uses)
      if (l < 1000 && count == 1)
        output.push_back(l);
  }
  for (int l : output)
    check(uses.count(l),
          r.where(n) + ": the output of '" + equation + "' names a label no input has");
  // Left to right: each operand first loses the labels nothing later needs, then the
  // running result and it are contracted.
  auto needed_after = [&](std::size_t i) {
    std::vector<int> keep = output;
    for (std::size_t j = i + 1; j < operands.size(); ++j)
      keep.insert(keep.end(), operands[j].labels.begin(), operands[j].labels.end());
    return keep;
  };
  std::vector<int> keep0 = needed_after(0);
  for (std::size_t j = 1; j < operands.size(); ++j)
    keep0.insert(keep0.end(), operands[j].labels.begin(), operands[j].labels.end());
  Labelled result = sum_out(r, operands[0], keep0);
  for (std::size_t i = 1; i < operands.size(); ++i) {
    std::vector<int> keep = needed_after(i);
    std::vector<int> with_result = keep;
    with_result.insert(with_result.end(), result.labels.begin(), result.labels.end());
    Labelled next = sum_out(r, operands[i], with_result);
    result = contract(r, n, result, next, keep);
  }
  result = sum_out(r, result, output);
  r.set(n, 0, arrange(r, result, output));
}

// ---- DequantizeLinear ----------------------------------------------------------------

// A quantisation parameter (scale or zero point) shaped to broadcast against x: a scalar;
// one value per index of `axis` (per-axis); or, with block_size b > 0, one per block of b
// along `axis` (blocked: the parameter has x's shape with ceil(dim / b) there).
ag::Var along_axis(Runner& r, const io::OnnxNode& n, ag::Var v, const Shape& x,
                   std::int64_t axis_attr, std::int64_t block) {
  const Shape s = v.shape();
  if (shape_numel(s) == 1 && s.size() <= 1)  // per tensor: the axis is not used
    return ag::reshape(r.tape, v, {});
  const int axis = axis_of(axis_attr, static_cast<int>(x.size()), r.where(n));
  const auto a = static_cast<std::size_t>(axis);
  if (block <= 0) {
    check(s.size() == 1 && s[0] == x[a],
          r.where(n) + ": a per-axis parameter " + shape_str(s) + " needs " + std::to_string(x[a]) +
              " values along axis " + std::to_string(axis) + " of " + shape_str(x));
    Shape shaped(x.size(), 1);
    shaped[a] = x[a];
    return ag::reshape(r.tape, v, shaped);
  }
  const std::int64_t blocks = (x[a] + block - 1) / block;
  bool fits = s.size() == x.size() && s[a] == blocks;
  for (std::size_t d = 0; fits && d < x.size(); ++d)
    fits = d == a || s[d] == x[d];
  check(fits, r.where(n) + ": a blocked parameter " + shape_str(s) + " does not fit " +
                  shape_str(x) + " with block_size " + std::to_string(block) + " on axis " +
                  std::to_string(axis));
  // [.., blocks, ..] -> [.., blocks, 1, ..] -> [.., blocks, block, ..] -> [.., dim, ..]
  Shape split = s;
  split.insert(split.begin() + static_cast<std::ptrdiff_t>(a) + 1, 1);
  Shape wide = split;
  wide[a + 1] = block;
  Shape merged = s;
  merged[a] = blocks * block;
  ag::Var spread =
      ag::reshape(r.tape, ag::expand(r.tape, ag::reshape(r.tape, v, split), wide), merged);
  return merged[a] == x[a] ? spread : ag::slice(r.tape, spread, axis, 0, x[a]);
}

// DequantizeLinear: y = (x - zero_point) * scale, in f32 (integer x and zero point are
// exact there up to 2^24; FP8 and FP4 x arrive widened).
void dequantize_linear(Runner& r, const io::OnnxNode& n) {
  const Shape x_shape = r.shape_of(n, 0);
  const std::int64_t axis = r.attr_int(n, "axis", 1);
  const std::int64_t block = r.attr_int(n, "block_size", 0);
  check(block >= 0, r.where(n) + ": block_size " + std::to_string(block) + " is negative");
  ag::Var x = r.as_float(n, 0);
  if (r.has_input(n, 2))
    x = ag::sub(r.tape, x, along_axis(r, n, r.as_float(n, 2), x_shape, axis, block));
  r.set(n, 0, ag::mul(r.tape, x, along_axis(r, n, r.as_float(n, 1), x_shape, axis, block)));
}

}  // namespace

void add_index_ops(OpTable& table) {
  table["DequantizeLinear"] = dequantize_linear;
  table["Einsum"] = einsum;
  table["ScatterElements"] = scatter_elements;
  table["Scatter"] = scatter_elements;
  table["ScatterND"] = scatter_nd;
  table["GatherND"] = gather_nd;
  table["GroupNormalization"] = group_normalization;
}

}  // namespace loom::nn::onnx_import
