// Reference kernels, part 1: utility, elementwise, reductions, softmax, matmul, AdamW.
//
// These are the oracle: obviously correct, single-threaded, accumulating in double.
// Inputs are contiguous (except for `copy`, which is how anything becomes contiguous)
// and live on a host-accessible device; outputs are preallocated and contiguous.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/op_catalog.h"
#include "core/reference_util.h"

namespace loom {

float math_function(MathFunction f, float x) {
  switch (f) {
    case MathFunction::sin:
      return std::sin(x);
    case MathFunction::cos:
      return std::cos(x);
    case MathFunction::tan:
      return std::tan(x);
    case MathFunction::asin:
      return std::asin(x);
    case MathFunction::acos:
      return std::acos(x);
    case MathFunction::atan:
      return std::atan(x);
    case MathFunction::sinh:
      return std::sinh(x);
    case MathFunction::cosh:
      return std::cosh(x);
    case MathFunction::asinh:
      return std::asinh(x);
    case MathFunction::acosh:
      return std::acosh(x);
    case MathFunction::atanh:
      return std::atanh(x);
    case MathFunction::floor:
      return std::floor(x);
    case MathFunction::ceil:
      return std::ceil(x);
    case MathFunction::round:
      return std::nearbyint(x);  // the default mode: half to even
    case MathFunction::sign:
      return x > 0 ? 1.0f : x < 0 ? -1.0f : x;  // sign(NaN) = NaN, 0 = 0
  }
  return x;
}

}  // namespace loom

namespace loom::reference {

void copy(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  std::size_t esize = dtype_size(x.dtype());
  auto* src = static_cast<const std::byte*>(x.device_address());
  auto* dst = static_cast<std::byte*>(call.outputs[0].device_address());
  std::vector<std::int64_t> index(x.rank(), 0);
  for (std::int64_t n = 0; n < x.numel(); ++n) {
    std::int64_t offset = 0;
    for (int i = 0; i < x.rank(); ++i)
      offset += index[i] * x.strides()[i];
    std::memcpy(dst + n * esize, src + offset * esize, esize);
    for (int i = x.rank() - 1; i >= 0; --i) {
      if (++index[i] < x.shape()[i])
        break;
      index[i] = 0;
    }
  }
}

void fill(const OpCall& call) {
  Tensor& y = call.outputs[0];
  switch (y.dtype()) {
    case DType::f32:
      std::fill_n(y.data<float>(), y.numel(), static_cast<float>(call.attrs.alpha));
      break;
    case DType::i32:
      std::fill_n(y.data<std::int32_t>(), y.numel(), static_cast<std::int32_t>(call.attrs.alpha));
      break;
    default:
      throw Error("fill: dtype " + std::string(dtype_name(y.dtype())) + " not supported");
  }
}

// A float as int32, as the cast defines it: truncation toward zero, NaN to 0, values
// beyond the range saturating (a plain static_cast is undefined behaviour for them).
std::int32_t float_to_i32(float v) {
  if (std::isnan(v))
    return 0;
  if (v >= 2147483648.0f)
    return std::numeric_limits<std::int32_t>::max();
  if (v < -2147483648.0f)
    return std::numeric_limits<std::int32_t>::min();
  return static_cast<std::int32_t>(v);
}

void cast(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  if (x.dtype() == DType::i32 && y.dtype() == DType::i32) {  // exact: not through float
    std::copy_n(x.data<std::int32_t>(), x.numel(), y.data<std::int32_t>());
    return;
  }
  std::vector<float> values(x.numel());
  switch (x.dtype()) {
    case DType::f32:
      std::copy_n(x.data<float>(), x.numel(), values.begin());
      break;
    case DType::bf16:
      for (std::int64_t i = 0; i < x.numel(); ++i)
        values[i] = bf16_to_float(x.data<std::uint16_t>()[i]);
      break;
    case DType::f16:
      for (std::int64_t i = 0; i < x.numel(); ++i)
        values[i] = f16_to_float(x.data<std::uint16_t>()[i]);
      break;
    case DType::i32:
      for (std::int64_t i = 0; i < x.numel(); ++i)
        values[i] = static_cast<float>(x.data<std::int32_t>()[i]);
      break;
    default:
      throw Error("cast: from " + std::string(dtype_name(x.dtype())) + " not supported");
  }
  switch (y.dtype()) {
    case DType::f32:
      std::copy(values.begin(), values.end(), y.data<float>());
      break;
    case DType::bf16:
      for (std::size_t i = 0; i < values.size(); ++i)
        y.data<std::uint16_t>()[i] = float_to_bf16(values[i]);
      break;
    case DType::f16:
      for (std::size_t i = 0; i < values.size(); ++i)
        y.data<std::uint16_t>()[i] = float_to_f16(values[i]);
      break;
    case DType::i32:
      for (std::size_t i = 0; i < values.size(); ++i)
        y.data<std::int32_t>()[i] = float_to_i32(values[i]);
      break;
    default:
      throw Error("cast: to " + std::string(dtype_name(y.dtype())) + " not supported");
  }
}

void expand(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  Strides xs = broadcast_strides(x.shape(), y.shape());
  for_each_index(y.shape(), [&](std::int64_t n, const std::vector<std::int64_t>& idx) {
    y.data<float>()[n] = x.data<float>()[offset_of(idx, xs)];
  });
}

void concat(const OpCall& call) {
  Tensor& y = call.outputs[0];
  int axis = normalize_axis(call.attrs.axis, y.rank(), "concat");
  std::size_t esize = dtype_size(y.dtype());
  // View y as [outer, axis * inner] rows; each input contributes a run per row.
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d)
    outer *= y.shape()[d];
  for (int d = axis + 1; d < y.rank(); ++d)
    inner *= y.shape()[d];
  auto* out = static_cast<std::byte*>(y.device_address());
  std::int64_t out_row = y.shape()[axis] * inner;
  std::int64_t column = 0;
  for (const Tensor& x : call.inputs) {
    std::int64_t run = x.shape()[axis] * inner;
    auto* src = static_cast<const std::byte*>(x.device_address());
    for (std::int64_t o = 0; o < outer; ++o)
      std::memcpy(out + (o * out_row + column) * esize, src + o * run * esize, run * esize);
    column += run;
  }
}

void slice_backward(const OpCall& call) {
  const Tensor& dy = call.inputs[0];
  Tensor& dx = call.outputs[0];
  int axis = normalize_axis(call.attrs.axis, dx.rank(), "slice_backward");
  std::fill_n(dx.data<float>(), dx.numel(), 0.0f);
  Strides dxs = contiguous_strides(dx.shape());
  for_each_index(dy.shape(), [&](std::int64_t n, const std::vector<std::int64_t>& idx) {
    std::int64_t offset = offset_of(idx, dxs) + call.attrs.start * dxs[axis];
    dx.data<float>()[offset] = dy.data<float>()[n];
  });
}

namespace {

template <class F>
void binary(const OpCall& call, F f) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  Tensor& c = call.outputs[0];
  Strides as = broadcast_strides(a.shape(), c.shape());
  Strides bs = broadcast_strides(b.shape(), c.shape());
  for_each_index(c.shape(), [&](std::int64_t n, const std::vector<std::int64_t>& idx) {
    c.data<float>()[n] =
        f(a.data<float>()[offset_of(idx, as)], b.data<float>()[offset_of(idx, bs)]);
  });
}

template <class F>
void unary(const OpCall& call, F f) {
  const float* x = call.inputs[0].data<float>();
  float* y = call.outputs[0].data<float>();
  for (std::int64_t i = 0; i < call.inputs[0].numel(); ++i)
    y[i] = f(x[i]);
}

template <class F>
void pairwise(const OpCall& call, F f) {
  const float* a = call.inputs[0].data<float>();
  const float* b = call.inputs[1].data<float>();
  float* y = call.outputs[0].data<float>();
  for (std::int64_t i = 0; i < call.inputs[0].numel(); ++i)
    y[i] = f(a[i], b[i]);
}

}  // namespace

void add(const OpCall& call) {
  binary(call, [](float a, float b) { return a + b; });
}
void sub(const OpCall& call) {
  binary(call, [](float a, float b) { return a - b; });
}
void mul(const OpCall& call) {
  binary(call, [](float a, float b) { return a * b; });
}
void div(const OpCall& call) {
  binary(call, [](float a, float b) { return a / b; });
}
void where(const OpCall& call) {
  const Tensor& cond = call.inputs[0];
  const Tensor& a = call.inputs[1];
  const Tensor& b = call.inputs[2];
  Tensor& y = call.outputs[0];
  Strides cs = broadcast_strides(cond.shape(), y.shape());
  Strides as = broadcast_strides(a.shape(), y.shape());
  Strides bs = broadcast_strides(b.shape(), y.shape());
  for_each_index(y.shape(), [&](std::int64_t n, const std::vector<std::int64_t>& idx) {
    y.data<float>()[n] = cond.data<std::uint8_t>()[offset_of(idx, cs)] != 0
                             ? a.data<float>()[offset_of(idx, as)]
                             : b.data<float>()[offset_of(idx, bs)];
  });
}
void compare(const OpCall& call) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  Tensor& y = call.outputs[0];
  Strides as = broadcast_strides(a.shape(), y.shape());
  Strides bs = broadcast_strides(b.shape(), y.shape());
  const Comparison how = call.attrs.comparison;
  for_each_index(y.shape(), [&](std::int64_t n, const std::vector<std::int64_t>& idx) {
    const float x = a.data<float>()[offset_of(idx, as)], z = b.data<float>()[offset_of(idx, bs)];
    bool holds = false;
    switch (how) {
      case Comparison::eq:
        holds = x == z;
        break;
      case Comparison::lt:
        holds = x < z;
        break;
      case Comparison::le:
        holds = x <= z;
        break;
      case Comparison::gt:
        holds = x > z;
        break;
      case Comparison::ge:
        holds = x >= z;
        break;
    }
    y.data<std::uint8_t>()[n] = holds ? 1 : 0;
  });
}
void scale(const OpCall& call) {
  float alpha = static_cast<float>(call.attrs.alpha);
  unary(call, [alpha](float x) { return alpha * x; });
}
void exp(const OpCall& call) {
  unary(call, [](float x) { return std::exp(x); });
}
void log(const OpCall& call) {
  unary(call, [](float x) { return std::log(x); });
}
void tanh(const OpCall& call) {
  unary(call, [](float x) { return std::tanh(x); });
}
void math(const OpCall& call) {
  const MathFunction f = call.attrs.function;
  unary(call, [f](float x) { return math_function(f, x); });
}
void sqrt(const OpCall& call) {
  unary(call, [](float x) { return std::sqrt(x); });
}
void erf(const OpCall& call) {
  unary(call, [](float x) { return std::erf(x); });
}
void relu(const OpCall& call) {
  unary(call, [](float x) { return x > 0.0f ? x : 0.0f; });
}
void gelu(const OpCall& call) {
  unary(call, [](float x) { return gelu_tanh(x); });
}
namespace {
double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
}  // namespace
void silu(const OpCall& call) {
  unary(call, [](float x) { return static_cast<float>(x * sigmoid(x)); });
}
void silu_backward(const OpCall& call) {
  // d/dx x s(x) = s + x s (1 - s) = s (1 + x (1 - s))
  pairwise(call, [](float dy, float x) {
    double s = sigmoid(x);
    return static_cast<float>(dy * s * (1.0 + x * (1.0 - s)));
  });
}
void swiglu(const OpCall& call) {
  pairwise(call,
           [](float gate, float up) { return static_cast<float>(gate * sigmoid(gate) * up); });
}
void swiglu_backward(const OpCall& call) {
  const float* dy = call.inputs[0].data<float>();
  const float* gate = call.inputs[1].data<float>();
  const float* up = call.inputs[2].data<float>();
  float* dgate = call.outputs[0].data<float>();
  float* dup = call.outputs[1].data<float>();
  for (std::int64_t i = 0; i < call.inputs[0].numel(); ++i) {
    double g = gate[i], s = sigmoid(g);
    dgate[i] = static_cast<float>(static_cast<double>(dy[i]) * up[i] * s * (1.0 + g * (1.0 - s)));
    dup[i] = static_cast<float>(static_cast<double>(dy[i]) * g * s);
  }
}
void relu_backward(const OpCall& call) {
  pairwise(call, [](float dy, float x) { return x > 0.0f ? dy : 0.0f; });
}
void gelu_backward(const OpCall& call) {
  pairwise(call, [](float dy, float x) { return dy * gelu_tanh_grad(x); });
}
void tanh_backward(const OpCall& call) {
  pairwise(call, [](float dy, float y) { return dy * (1.0f - y * y); });
}

void dropout(const OpCall& call) {
  const float* x = call.inputs[0].data<float>();
  float* y = call.outputs[0].data<float>();
  float p = static_cast<float>(call.attrs.p);
  float keep_scale = 1.0f / (1.0f - p);
  for (std::int64_t i = 0; i < call.inputs[0].numel(); ++i)
    y[i] = dropout_uniform(call.attrs.seed, static_cast<std::uint64_t>(i)) >= p ? x[i] * keep_scale
                                                                                : 0.0f;
}
void dropout_backward(const OpCall& call) {
  dropout(call);
}  // the same mask and scale

namespace {

// Sums x over the reduced axes into y (contiguous, shape = x with reduced axes dropped).
void reduce_sum(const Tensor& x, const std::vector<std::int64_t>& axes, std::vector<double>& acc) {
  std::vector<bool> reduce(x.rank(), axes.empty());
  for (auto a : axes)
    reduce[normalize_axis(a, x.rank(), "sum")] = true;
  Shape kept_shape;
  for (int d = 0; d < x.rank(); ++d)
    kept_shape.push_back(reduce[d] ? 1 : x.shape()[d]);
  Strides kept = contiguous_strides(kept_shape);
  for (int d = 0; d < x.rank(); ++d)
    if (reduce[d])
      kept[d] = 0;
  acc.assign(shape_numel(kept_shape), 0.0);
  for_each_index(x.shape(), [&](std::int64_t n, const std::vector<std::int64_t>& idx) {
    acc[offset_of(idx, kept)] += x.data<float>()[n];
  });
}

}  // namespace

void sum(const OpCall& call) {
  std::vector<double> acc;
  reduce_sum(call.inputs[0], call.attrs.axes, acc);
  for (std::size_t i = 0; i < acc.size(); ++i)
    call.outputs[0].data<float>()[i] = static_cast<float>(acc[i]);
}

void mean(const OpCall& call) {
  std::vector<double> acc;
  reduce_sum(call.inputs[0], call.attrs.axes, acc);
  double count = static_cast<double>(call.inputs[0].numel()) /
                 static_cast<double>(std::max<std::size_t>(acc.size(), 1));
  for (std::size_t i = 0; i < acc.size(); ++i)
    call.outputs[0].data<float>()[i] = static_cast<float>(acc[i] / count);
}

namespace {
struct AxisView {  // x viewed as [outer, length, inner] around one axis
  std::int64_t outer = 1, length = 1, inner = 1;
};
AxisView axis_view(const Tensor& x, std::int64_t axis, std::string_view op) {
  int a = normalize_axis(axis, x.rank(), op);
  AxisView v;
  for (int d = 0; d < a; ++d)
    v.outer *= x.shape()[d];
  v.length = x.shape()[a];
  for (int d = a + 1; d < x.rank(); ++d)
    v.inner *= x.shape()[d];
  return v;
}
}  // namespace

void max(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  AxisView v = axis_view(x, call.attrs.axis, "max");
  for (std::int64_t o = 0; o < v.outer; ++o) {
    for (std::int64_t i = 0; i < v.inner; ++i) {
      // A NaN anywhere makes the maximum NaN (as PyTorch and numpy define it).
      float best = -std::numeric_limits<float>::infinity();
      for (std::int64_t l = 0; l < v.length; ++l) {
        const float value = x.data<float>()[(o * v.length + l) * v.inner + i];
        if (std::isnan(value)) {
          best = value;
          break;
        }
        best = std::max(best, value);
      }
      call.outputs[0].data<float>()[o * v.inner + i] = best;
    }
  }
}

void max_backward(const OpCall& call) {
  const Tensor& x = call.inputs[1];
  AxisView v = axis_view(x, call.attrs.axis, "max_backward");
  float* dx = call.outputs[0].data<float>();
  std::fill_n(dx, x.numel(), 0.0f);
  for (std::int64_t o = 0; o < v.outer; ++o) {
    for (std::int64_t i = 0; i < v.inner; ++i) {
      float y = call.inputs[2].data<float>()[o * v.inner + i];
      for (std::int64_t l = 0; l < v.length; ++l) {
        std::int64_t at = (o * v.length + l) * v.inner + i;
        const float value = x.data<float>()[at];
        // The first maximum takes the whole gradient (a NaN maximum: the first NaN).
        if (value == y || (std::isnan(y) && std::isnan(value))) {
          dx[at] = call.inputs[0].data<float>()[o * v.inner + i];
          break;
        }
      }
    }
  }
}

void sum_squares(const OpCall& call) {
  double acc = 0.0;
  const float* x = call.inputs[0].data<float>();
  for (std::int64_t i = 0; i < call.inputs[0].numel(); ++i)
    acc += static_cast<double>(x[i]) * x[i];
  call.outputs[0].data<float>()[0] = static_cast<float>(acc);
}

namespace {
template <class RowFn>
void for_each_row(const OpCall& call, RowFn f) {
  const Tensor& x = call.inputs[0];
  std::int64_t cols = x.rank() == 0 ? 1 : x.dim(-1);
  std::int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  for (std::int64_t r = 0; r < rows; ++r)
    f(r * cols, cols);
}
}  // namespace

void softmax(const OpCall& call) {
  const float* x = call.inputs[0].data<float>();
  float* y = call.outputs[0].data<float>();
  for_each_row(call, [&](std::int64_t at, std::int64_t n) {
    double m = -std::numeric_limits<double>::infinity(), s = 0.0;
    for (std::int64_t j = 0; j < n; ++j)
      m = std::max(m, static_cast<double>(x[at + j]));
    for (std::int64_t j = 0; j < n; ++j)
      s += std::exp(x[at + j] - m);
    for (std::int64_t j = 0; j < n; ++j)
      y[at + j] = static_cast<float>(std::exp(x[at + j] - m) / s);
  });
}

void softmax_backward(const OpCall& call) {
  const float* dy = call.inputs[0].data<float>();
  const float* y = call.inputs[1].data<float>();
  float* dx = call.outputs[0].data<float>();
  for_each_row(call, [&](std::int64_t at, std::int64_t n) {
    double dot = 0.0;
    for (std::int64_t j = 0; j < n; ++j)
      dot += static_cast<double>(dy[at + j]) * y[at + j];
    for (std::int64_t j = 0; j < n; ++j)
      dx[at + j] = static_cast<float>(y[at + j] * (dy[at + j] - dot));
  });
}

void log_softmax(const OpCall& call) {
  const float* x = call.inputs[0].data<float>();
  float* y = call.outputs[0].data<float>();
  for_each_row(call, [&](std::int64_t at, std::int64_t n) {
    double m = -std::numeric_limits<double>::infinity(), s = 0.0;
    for (std::int64_t j = 0; j < n; ++j)
      m = std::max(m, static_cast<double>(x[at + j]));
    for (std::int64_t j = 0; j < n; ++j)
      s += std::exp(x[at + j] - m);
    double lse = m + std::log(s);
    for (std::int64_t j = 0; j < n; ++j)
      y[at + j] = static_cast<float>(x[at + j] - lse);
  });
}

void log_softmax_backward(const OpCall& call) {
  const float* dy = call.inputs[0].data<float>();
  const float* y = call.inputs[1].data<float>();
  float* dx = call.outputs[0].data<float>();
  for_each_row(call, [&](std::int64_t at, std::int64_t n) {
    double total = 0.0;
    for (std::int64_t j = 0; j < n; ++j)
      total += dy[at + j];
    for (std::int64_t j = 0; j < n; ++j)
      dx[at + j] = static_cast<float>(dy[at + j] - std::exp(y[at + j]) * total);
  });
}

void matmul(const OpCall& call) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  Tensor& c = call.outputs[0];
  std::int64_t m = c.dim(-2), n = c.dim(-1);
  std::int64_t k = call.attrs.trans_a ? a.dim(-2) : a.dim(-1);
  Shape batch(c.shape().begin(), c.shape().end() - 2);
  Shape a_batch(a.shape().begin(), a.shape().end() - 2);
  Shape b_batch(b.shape().begin(), b.shape().end() - 2);
  Strides as = broadcast_strides(a_batch, batch);  // in units of matrices
  Strides bs = broadcast_strides(b_batch, batch);
  for_each_index(batch, [&](std::int64_t bi, const std::vector<std::int64_t>& idx) {
    const float* pa = a.data<float>() + offset_of(idx, as) * a.dim(-2) * a.dim(-1);
    const float* pb = b.data<float>() + offset_of(idx, bs) * b.dim(-2) * b.dim(-1);
    float* pc = c.data<float>() + bi * m * n;
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (std::int64_t p = 0; p < k; ++p) {
          float av = call.attrs.trans_a ? pa[p * m + i] : pa[i * k + p];
          float bv = call.attrs.trans_b ? pb[j * k + p] : pb[p * n + j];
          acc += static_cast<double>(av) * bv;
        }
        pc[i * n + j] = static_cast<float>(acc);
      }
    }
  });
}

void linear(const OpCall& call) {
  const float* x = call.inputs[0].data<float>();
  const float* w = call.inputs[1].data<float>();
  const float* bias = call.inputs[2].data<float>();
  float* y = call.outputs[0].data<float>();
  std::int64_t k = call.inputs[0].dim(-1), n = call.outputs[0].dim(-1),
               rows = call.inputs[0].numel() / std::max<std::int64_t>(k, 1);
  if (k == 0)
    rows = call.outputs[0].numel() / std::max<std::int64_t>(n, 1);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = bias[j];
      for (std::int64_t p = 0; p < k; ++p)
        acc +=
            static_cast<double>(x[r * k + p]) * (call.attrs.trans_b ? w[j * k + p] : w[p * n + j]);
      y[r * n + j] = static_cast<float>(acc);
    }
  }
}

void adamw_step(const OpCall& call) {
  // AdamW (Loshchilov & Hutter): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  // p -= lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + lr wd p  (decay decoupled from g).
  const Attrs& a = call.attrs;
  float* p = call.outputs[0].data<float>();
  float* m = call.outputs[1].data<float>();
  float* v = call.outputs[2].data<float>();
  const float* param_in = call.inputs[0].data<float>();
  const float* g = call.inputs[1].data<float>();
  const float* m_in = call.inputs[2].data<float>();
  const float* v_in = call.inputs[3].data<float>();
  double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
  double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(a.step));
  for (std::int64_t i = 0; i < call.inputs[0].numel(); ++i) {
    double mi = a.beta1 * m_in[i] + (1.0 - a.beta1) * g[i];
    double vi = a.beta2 * v_in[i] + (1.0 - a.beta2) * static_cast<double>(g[i]) * g[i];
    double pi = param_in[i];
    pi -= a.lr * a.weight_decay * pi;
    pi -= a.lr * (mi / bc1) / (std::sqrt(vi / bc2) + a.eps);
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    p[i] = static_cast<float>(pi);
  }
}

}  // namespace loom::reference
