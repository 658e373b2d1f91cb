#include "autograd/functions.h"

#include <numeric>

#include "autograd/tensor_parallel.h"
#include "core/error.h"
#include "dispatch/dispatch.h"

namespace loom::autograd {
namespace {

using dispatch::call;
using dispatch::call1;

Attrs with_alpha(double alpha) {
  Attrs a;
  a.alpha = alpha;
  return a;
}

}  // namespace

Tensor sum_to_shape(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape)
    return grad;
  Attrs a;
  a.keepdim = true;
  std::size_t lead = grad.shape().size() - shape.size();
  for (std::size_t d = 0; d < grad.shape().size(); ++d) {
    bool extra = d < lead;
    if (extra || (shape[d - lead] == 1 && grad.shape()[d] != 1))
      a.axes.push_back(static_cast<std::int64_t>(d));
  }
  Tensor summed = a.axes.empty() ? grad : call1(OpId::sum, {grad}, a);
  return summed.reshape(shape);
}

Var add(Tape& tape, const Var& a, const Var& b) {
  if (distributed({&a, &b}))
    return tp::add(tape, a, b);
  Shape sa = a.shape(), sb = b.shape();
  return tape.record({a, b}, call1(OpId::add, {a.value(), b.value()}), [sa, sb](const Tensor& g) {
    return std::vector<Tensor>{sum_to_shape(g, sa), sum_to_shape(g, sb)};
  });
}

Var sub(Tape& tape, const Var& a, const Var& b) {
  Shape sa = a.shape(), sb = b.shape();
  return tape.record({a, b}, call1(OpId::sub, {a.value(), b.value()}), [sa, sb](const Tensor& g) {
    return std::vector<Tensor>{sum_to_shape(g, sa),
                               sum_to_shape(call1(OpId::scale, {g}, with_alpha(-1.0)), sb)};
  });
}

Var mul(Tape& tape, const Var& a, const Var& b) {
  Tensor av = a.value(), bv = b.value();
  bool ga = a.requires_grad(), gb = b.requires_grad();
  return tape.record({a, b}, call1(OpId::mul, {av, bv}), [av, bv, ga, gb](const Tensor& g) {
    std::vector<Tensor> grads(2);
    if (ga)
      grads[0] = sum_to_shape(call1(OpId::mul, {g, bv}), av.shape());
    if (gb)
      grads[1] = sum_to_shape(call1(OpId::mul, {g, av}), bv.shape());
    return grads;
  });
}

Var div(Tape& tape, const Var& a, const Var& b) {
  // d(a/b)/da = 1/b; d(a/b)/db = -a/b^2 = -(a/b)/b.
  Tensor av = a.value(), bv = b.value();
  Tensor y = call1(OpId::div, {av, bv});
  bool ga = a.requires_grad(), gb = b.requires_grad();
  return tape.record({a, b}, y, [av, bv, y, ga, gb](const Tensor& g) {
    std::vector<Tensor> grads(2);
    Tensor g_over_b = call1(OpId::div, {g, bv});
    if (ga)
      grads[0] = sum_to_shape(g_over_b, av.shape());
    if (gb)
      grads[1] = sum_to_shape(
          call1(OpId::scale, {call1(OpId::mul, {g_over_b, y})}, with_alpha(-1.0)), bv.shape());
    return grads;
  });
}

Var where(Tape& tape, const Tensor& cond, const Var& a, const Var& b) {
  Shape sa = a.shape(), sb = b.shape();
  bool ga = a.requires_grad(), gb = b.requires_grad();
  return tape.record({a, b}, call1(OpId::where, {cond, a.value(), b.value()}),
                     [cond, sa, sb, ga, gb](const Tensor& g) {
                       Attrs zeros;
                       zeros.shape = g.shape();
                       zeros.alpha = 0.0;
                       Tensor zero = call(OpId::fill, {}, zeros, &g.backend()).front();
                       std::vector<Tensor> grads(2);
                       if (ga)
                         grads[0] = sum_to_shape(call1(OpId::where, {cond, g, zero}), sa);
                       if (gb)
                         grads[1] = sum_to_shape(call1(OpId::where, {cond, zero, g}), sb);
                       return grads;
                     });
}

Var expand(Tape& tape, const Var& x, const Shape& shape) {
  if (x.shape() == shape)
    return x;
  Shape sx = x.shape();
  Attrs a;
  a.shape = shape;
  return tape.record({x}, call1(OpId::expand, {x.value()}, a),
                     [sx](const Tensor& g) { return std::vector<Tensor>{sum_to_shape(g, sx)}; });
}

Var scale(Tape& tape, const Var& x, double alpha) {
  return tape.record({x}, call1(OpId::scale, {x.value()}, with_alpha(alpha)),
                     [alpha](const Tensor& g) {
                       return std::vector<Tensor>{call1(OpId::scale, {g}, with_alpha(alpha))};
                     });
}

Var exp(Tape& tape, const Var& x) {
  Tensor y = call1(OpId::exp, {x.value()});
  return tape.record({x}, y, [y](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::mul, {g, y})};
  });
}

Var log(Tape& tape, const Var& x) {
  Tensor xv = x.value();
  return tape.record({x}, call1(OpId::log, {xv}), [xv](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::div, {g, xv})};
  });
}

Var tanh(Tape& tape, const Var& x) {
  Tensor y = call1(OpId::tanh, {x.value()});
  return tape.record({x}, y, [y](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::tanh_backward, {g, y})};
  });
}

// d sqrt(x) = dy / (2 sqrt(x))
Var sqrt(Tape& tape, const Var& x) {
  Tensor y = call1(OpId::sqrt, {x.value()});
  return tape.record({x}, y, [y](const Tensor& g) {
    Attrs half;
    half.alpha = 0.5;
    return std::vector<Tensor>{call1(OpId::div, {call1(OpId::scale, {g}, half), y})};
  });
}

Var math(Tape& tape, const Var& x, MathFunction f) {
  Tensor xv = x.value();
  Attrs a;
  a.function = f;
  Tensor y = call1(OpId::math, {xv}, a);
  return tape.record({x}, y, [xv, y, f](const Tensor& g) {
    auto of = [&](MathFunction h) {
      Attrs b;
      b.function = h;
      return call1(OpId::math, {xv}, b);
    };
    auto constant = [&](double value) {
      Attrs c;
      c.shape = {};
      c.alpha = value;
      return call(OpId::fill, {}, c, &g.backend()).front();
    };
    auto mul = [](const Tensor& p, const Tensor& q) { return call1(OpId::mul, {p, q}); };
    auto add = [](const Tensor& p, const Tensor& q) { return call1(OpId::add, {p, q}); };
    auto sub = [](const Tensor& p, const Tensor& q) { return call1(OpId::sub, {p, q}); };
    auto div = [](const Tensor& p, const Tensor& q) { return call1(OpId::div, {p, q}); };
    auto neg = [](const Tensor& p) { return call1(OpId::scale, {p}, with_alpha(-1.0)); };
    const Tensor one = constant(1.0), xx = mul(xv, xv);
    Tensor dx;
    switch (f) {
      case MathFunction::sin:
        dx = mul(g, of(MathFunction::cos));
        break;  // cos x
      case MathFunction::cos:
        dx = neg(mul(g, of(MathFunction::sin)));
        break;  // -sin x
      case MathFunction::tan:
        dx = mul(g, add(one, mul(y, y)));
        break;  // 1 + tan^2
      case MathFunction::asin:
        dx = div(g, call1(OpId::sqrt, {sub(one, xx)}));
        break;
      case MathFunction::acos:
        dx = neg(div(g, call1(OpId::sqrt, {sub(one, xx)})));
        break;
      case MathFunction::atan:
        dx = div(g, add(one, xx));
        break;
      case MathFunction::sinh:
        dx = mul(g, of(MathFunction::cosh));
        break;
      case MathFunction::cosh:
        dx = mul(g, of(MathFunction::sinh));
        break;
      case MathFunction::asinh:
        dx = div(g, call1(OpId::sqrt, {add(xx, one)}));
        break;
      case MathFunction::acosh:
        dx = div(g, call1(OpId::sqrt, {sub(xx, one)}));
        break;
      case MathFunction::atanh:
        dx = div(g, sub(one, xx));
        break;
      default:
        dx = call1(OpId::scale, {g}, with_alpha(0.0));
        break;  // piecewise constant
    }
    return std::vector<Tensor>{dx};
  });
}

// d erf(x) = dy * 2/sqrt(pi) * e^{-x^2}
Var erf(Tape& tape, const Var& x) {
  Tensor xv = x.value();
  return tape.record({x}, call1(OpId::erf, {xv}), [xv](const Tensor& g) {
    Attrs minus;
    minus.alpha = -1.0;
    Attrs factor;
    factor.alpha = 1.1283791670955126;  // 2 / sqrt(pi)
    Tensor density = call1(OpId::exp, {call1(OpId::scale, {call1(OpId::mul, {xv, xv})}, minus)});
    return std::vector<Tensor>{call1(OpId::mul, {g, call1(OpId::scale, {density}, factor)})};
  });
}

Var relu(Tape& tape, const Var& x) {
  Tensor xv = x.value();
  return tape.record({x}, call1(OpId::relu, {xv}), [xv](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::relu_backward, {g, xv})};
  });
}

Var gelu(Tape& tape, const Var& x) {
  Tensor xv = x.value();
  return tape.record({x}, call1(OpId::gelu, {xv}), [xv](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::gelu_backward, {g, xv})};
  });
}

Var silu(Tape& tape, const Var& x) {
  Tensor xv = x.value();
  return tape.record({x}, call1(OpId::silu, {xv}), [xv](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::silu_backward, {g, xv})};
  });
}

Var swiglu(Tape& tape, const Var& gate, const Var& up) {
  if (distributed({&gate, &up}))
    return tp::swiglu(tape, gate, up);
  Tensor gv = gate.value(), uv = up.value();
  return tape.record({gate, up}, call1(OpId::swiglu, {gv, uv}), [gv, uv](const Tensor& g) {
    return call(OpId::swiglu_backward, {g, gv, uv});
  });
}

Var dropout(Tape& tape, const Var& x, double p, std::uint64_t seed) {
  if (p == 0.0)
    return x;
  Attrs a;
  a.p = p;
  a.seed = seed;
  return tape.record({x}, call1(OpId::dropout, {x.value()}, a), [a](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::dropout_backward, {g}, a)};
  });
}

Var dropout(Tape& tape, const Var& x, double p, std::uint64_t step_seed, std::uint64_t site) {
  if (p == 0.0)
    return x;
  Attrs a;
  a.p = p;
  a.seed = mix_seed(step_seed, site);
  a.seed_per_step = true;
  a.seed_site = site;
  return tape.record({x}, call1(OpId::dropout, {x.value()}, a), [a](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::dropout_backward, {g}, a)};
  });
}

namespace {
Attrs reduce_attrs(std::vector<std::int64_t> axes, bool keepdim) {
  Attrs a;
  a.axes = std::move(axes);
  a.keepdim = keepdim;
  return a;
}
// Shape of a reduction's output with the reduced axes kept as 1 (for broadcasting back).
Shape kept_shape(const Shape& in, const std::vector<std::int64_t>& axes) {
  Shape out = in;
  if (axes.empty())
    std::fill(out.begin(), out.end(), 1);
  for (auto axis : axes)
    out[normalize_axis(axis, static_cast<int>(in.size()), "reduce")] = 1;
  return out;
}
}  // namespace

Var sum(Tape& tape, const Var& x, std::vector<std::int64_t> axes, bool keepdim) {
  Attrs a = reduce_attrs(axes, keepdim);
  Shape in = x.shape(), kept = kept_shape(in, axes);
  return tape.record({x}, call1(OpId::sum, {x.value()}, a), [in, kept](const Tensor& g) {
    Attrs e;
    e.shape = in;
    return std::vector<Tensor>{call1(OpId::expand, {dispatch::contiguous(g).reshape(kept)}, e)};
  });
}

Var mean(Tape& tape, const Var& x, std::vector<std::int64_t> axes, bool keepdim) {
  Attrs a = reduce_attrs(axes, keepdim);
  Shape in = x.shape(), kept = kept_shape(in, axes);
  Tensor y = call1(OpId::mean, {x.value()}, a);
  double count = static_cast<double>(shape_numel(in)) /
                 static_cast<double>(std::max<std::int64_t>(y.numel(), 1));
  return tape.record({x}, y, [in, kept, count](const Tensor& g) {
    Attrs e;
    e.shape = in;
    Tensor spread = call1(OpId::expand, {dispatch::contiguous(g).reshape(kept)}, e);
    return std::vector<Tensor>{call1(OpId::scale, {spread}, with_alpha(1.0 / count))};
  });
}

Var max(Tape& tape, const Var& x, std::int64_t axis, bool keepdim) {
  Attrs a;
  a.axis = axis;
  a.keepdim = keepdim;
  Tensor xv = x.value();
  Tensor y = call1(OpId::max, {xv}, a);
  return tape.record({x}, y, [xv, y, a](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::max_backward, {g, xv, y}, a)};
  });
}

Var softmax(Tape& tape, const Var& x) {
  Tensor y = call1(OpId::softmax, {x.value()});
  return tape.record({x}, y, [y](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::softmax_backward, {g, y})};
  });
}

Var log_softmax(Tape& tape, const Var& x) {
  Tensor y = call1(OpId::log_softmax, {x.value()});
  return tape.record({x}, y, [y](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::log_softmax_backward, {g, y})};
  });
}

Var cross_entropy(Tape& tape, const Var& logits, const Tensor& targets) {
  if (distributed({&logits}))
    return tp::cross_entropy(tape, logits, targets);
  Tensor lv = logits.value();
  std::vector<Tensor> out = call(OpId::cross_entropy, {lv, targets});
  Tensor lse = out[1];
  return tape.record({logits}, out[0], [lv, targets, lse](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::cross_entropy_backward, {g, lv, targets, lse})};
  });
}

Var matmul(Tape& tape, const Var& a, const Var& b, bool trans_a, bool trans_b) {
  if (distributed({&a, &b}))
    return tp::matmul(tape, a, b, trans_a, trans_b);
  // C = op(A) op(B). dA = dC op(B)^T (transposed back when trans_a); dB likewise.
  Attrs attrs;
  attrs.trans_a = trans_a;
  attrs.trans_b = trans_b;
  Tensor av = a.value(), bv = b.value();
  bool ga = a.requires_grad(), gb = b.requires_grad();
  return tape.record({a, b}, call1(OpId::matmul, {av, bv}, attrs), [=](const Tensor& g) {
    std::vector<Tensor> grads(2);
    auto mm = [](const Tensor& x, const Tensor& y, bool tx, bool ty) {
      Attrs m;
      m.trans_a = tx;
      m.trans_b = ty;
      return call1(OpId::matmul, {x, y}, m);
    };
    if (ga)
      grads[0] =
          sum_to_shape(trans_a ? mm(bv, g, trans_b, true) : mm(g, bv, false, !trans_b), av.shape());
    if (gb) {
      // A batch-free B against a batched A: fold A's batch into rows so dB is one GEMM.
      if (bv.rank() == 2 && av.rank() > 2 && !trans_a) {
        Tensor a2 = dispatch::contiguous(av).reshape({-1, av.dim(-1)});  // av may be a view
        Tensor g2 = dispatch::contiguous(g).reshape({-1, g.dim(-1)});
        grads[1] = trans_b ? mm(g2, a2, true, false) : mm(a2, g2, true, false);
      } else {
        grads[1] = sum_to_shape(trans_b ? mm(g, av, true, trans_a) : mm(av, g, !trans_a, false),
                                bv.shape());
      }
    }
    return grads;
  });
}

Var linear(Tape& tape, const Var& x, const Var& weight, const Var& bias, bool trans_b) {
  if (distributed({&x, &weight, &bias}))
    return tp::linear(tape, x, weight, bias, trans_b);
  // y = x W + b with x flattened to [rows, K]. dx = dy W^T, dW = x^T dy (or dy^T x), db = sum_rows
  // dy.
  Attrs attrs;
  attrs.trans_b = trans_b;
  Tensor xv = x.value(), wv = weight.value();
  bool gx = x.requires_grad(), gw = weight.requires_grad(), gb = bias.requires_grad();
  return tape.record(
      {x, weight, bias}, call1(OpId::linear, {xv, wv, bias.value()}, attrs), [=](const Tensor& g) {
        std::vector<Tensor> grads(3);
        Tensor g2 = dispatch::contiguous(g).reshape({-1, g.dim(-1)});
        Tensor x2 = xv.reshape({-1, xv.dim(-1)});
        Attrs m;
        if (gx) {
          m.trans_b = !trans_b;
          grads[0] = call1(OpId::matmul, {g2, wv}, m).reshape(xv.shape());
        }
        if (gw) {
          Attrs t;
          t.trans_a = true;
          grads[1] = trans_b ? call1(OpId::matmul, {g2, x2}, t) : call1(OpId::matmul, {x2, g2}, t);
        }
        if (gb) {
          Attrs s;
          s.axes = {0};
          grads[2] = call1(OpId::sum, {g2}, s);
        }
        return grads;
      });
}

Var layer_norm(Tape& tape, const Var& x, const Var& weight, const Var& bias, double eps) {
  Attrs a;
  a.eps = eps;
  Tensor xv = x.value(), wv = weight.value();
  std::vector<Tensor> out = call(OpId::layer_norm, {xv, wv, bias.value()}, a);
  Tensor mean = out[1], rstd = out[2];
  return tape.record({x, weight, bias}, out[0], [xv, wv, mean, rstd](const Tensor& g) {
    return call(OpId::layer_norm_backward, {g, xv, wv, mean, rstd});
  });
}

Var rms_norm(Tape& tape, const Var& x, const Var& weight, double eps) {
  if (distributed({&x, &weight}))
    return tp::rms_norm(tape, x, weight, eps);
  Attrs a;
  a.eps = eps;
  Tensor xv = x.value(), wv = weight.value();
  std::vector<Tensor> out = call(OpId::rms_norm, {xv, wv}, a);
  Tensor rstd = out[1];
  return tape.record({x, weight}, out[0], [xv, wv, rstd](const Tensor& g) {
    return call(OpId::rms_norm_backward, {g, xv, wv, rstd});
  });
}

Var rope(Tape& tape, const Var& x, const Tensor& cos, const Tensor& sin, const Tensor& neg_sin) {
  if (distributed({&x}))
    return tp::rope(tape, x, cos, sin, neg_sin);
  return tape.record({x}, call1(OpId::rope, {x.value(), cos, sin}),
                     [cos, neg_sin](const Tensor& g) {
                       return std::vector<Tensor>{call1(OpId::rope, {g, cos, neg_sin})};
                     });
}

Var attention(Tape& tape, const Var& q, const Var& k, const Var& v) {
  if (distributed({&q, &k, &v}))
    return tp::attention(tape, q, k, v);
  Tensor qv = q.value(), kv = k.value(), vv = v.value();
  std::vector<Tensor> out = call(OpId::attention, {qv, kv, vv});
  Tensor o = out[0], lse = out[1];
  return tape.record({q, k, v}, o, [qv, kv, vv, o, lse](const Tensor& g) {
    return call(OpId::attention_backward, {g, qv, kv, vv, o, lse});
  });
}

Var embedding(Tape& tape, const Var& weight, const Tensor& ids) {
  if (distributed({&weight}))
    return tp::embedding(tape, weight, ids);
  Attrs a;
  a.shape = weight.shape();
  return tape.record(
      {weight}, call1(OpId::embedding, {weight.value(), ids}),
      [ids, a](const Tensor& g) {
        return std::vector<Tensor>{call1(OpId::embedding_backward, {g, ids}, a)};
      },
      [ids](const Tensor& g, const Tensor& existing) {
        return call1(OpId::embedding_backward_add, {existing, g, ids});
      });
}

Var causal_attention(Tape& tape, const Var& qkv, std::int64_t heads) {
  Attrs a;
  a.heads = heads;
  Tensor qv = qkv.value();
  std::vector<Tensor> out = call(OpId::causal_attention, {qv}, a);
  Tensor o = out[0], lse = out[1];
  return tape.record({qkv}, o, [qv, o, lse, a](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::causal_attention_backward, {g, qv, o, lse}, a)};
  });
}

Var conv2d(Tape& tape, const Var& x, const Var& weight, const Var& bias, std::int64_t stride,
           std::int64_t padding) {
  Attrs a;
  a.stride = stride;
  a.padding = padding;
  Tensor xv = x.value(), wv = weight.value();
  return tape.record({x, weight, bias}, call1(OpId::conv2d, {xv, wv, bias.value()}, a),
                     [xv, wv, a](const Tensor& g) {
                       return call(OpId::conv2d_backward, {g, xv, wv}, a);
                     });
}

Var max_pool2d(Tape& tape, const Var& x, std::int64_t kernel, std::int64_t stride) {
  Attrs a;
  a.kernel = kernel;
  a.stride = stride;
  a.shape = x.shape();
  std::vector<Tensor> out = call(OpId::max_pool2d, {x.value()}, a);
  Tensor argmax = out[1];
  return tape.record({x}, out[0], [argmax, a](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::max_pool2d_backward, {g, argmax}, a)};
  });
}

TopK top_k(Tape& tape, const Var& x, std::int64_t k) {
  Attrs a;
  a.k = k;
  a.shape = x.shape();
  std::vector<Tensor> out = call(OpId::top_k, {x.value()}, a);
  Tensor indices = out[1];
  Var values = tape.record({x}, out[0], [indices, a](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::top_k_backward, {g, indices}, a)};
  });
  return {values, indices};
}

Var avg_pool2d(Tape& tape, const Var& x, std::int64_t kernel, std::int64_t stride) {
  Attrs a;
  a.kernel = kernel;
  a.stride = stride;
  a.shape = x.shape();
  return tape.record({x}, call1(OpId::avg_pool2d, {x.value()}, a), [a](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::avg_pool2d_backward, {g}, a)};
  });
}

Var reshape(Tape& tape, const Var& x, const Shape& shape) {
  if (distributed({&x}))
    return tp::reshape(tape, x, shape);
  Shape in = x.shape();
  Tensor y = dispatch::contiguous(x.value()).reshape(shape);
  return tape.record({x}, y, [in](const Tensor& g) {
    return std::vector<Tensor>{dispatch::contiguous(g).reshape(in)};
  });
}

Var permute(Tape& tape, const Var& x, const std::vector<int>& order) {
  std::vector<int> inverse(order.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    inverse[order[i]] = static_cast<int>(i);
  return tape.record({x}, x.value().permute(order), [inverse](const Tensor& g) {
    return std::vector<Tensor>{dispatch::contiguous(g.permute(inverse))};
  });
}

Var slice(Tape& tape, const Var& x, int axis, std::int64_t start, std::int64_t end) {
  Attrs a;
  a.shape = x.shape();
  a.axis = axis;
  a.start = start;
  return tape.record({x}, x.value().slice(axis, start, end), [a](const Tensor& g) {
    return std::vector<Tensor>{call1(OpId::slice_backward, {g}, a)};
  });
}

Var concat(Tape& tape, const std::vector<Var>& xs, int axis) {
  std::vector<Tensor> values;
  std::vector<std::int64_t> sizes;
  for (const Var& v : xs) {
    values.push_back(v.value());
    sizes.push_back(v.dim(axis));
  }
  Attrs a;
  a.axis = axis;
  Tensor y = call(OpId::concat, values, a).front();
  return tape.record(xs, y, [sizes, axis](const Tensor& g) {
    std::vector<Tensor> grads;
    std::int64_t start = 0;
    for (std::int64_t size : sizes) {
      grads.push_back(dispatch::contiguous(g.slice(axis, start, start + size)));
      start += size;
    }
    return grads;
  });
}

}  // namespace loom::autograd
