// Reference kernels, part 2: cross-entropy, layer norm, embedding, causal attention,
// convolution and pooling. Same rules as part 1: plain loops, double accumulation.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/op_catalog.h"
#include "core/reference_util.h"

namespace loom::reference {

namespace {
std::int32_t checked_index(std::int32_t id, std::int64_t limit, std::string_view op) {
  check(id >= 0 && id < limit, [&] {
    return std::string(op) + ": index " + std::to_string(id) + " outside [0, " +
           std::to_string(limit) + ")";
  });
  return id;
}
}  // namespace

void cross_entropy(const OpCall& call) {
  const Tensor& logits = call.inputs[0];
  const std::int32_t* targets = call.inputs[1].data<std::int32_t>();
  std::int64_t n = logits.dim(0), v = logits.dim(1);
  float* lse_out = call.outputs[1].data<float>();
  double total = 0.0;
  for (std::int64_t r = 0; r < n; ++r) {
    const float* row = logits.data<float>() + r * v;
    double m = -std::numeric_limits<double>::infinity(), s = 0.0;
    for (std::int64_t j = 0; j < v; ++j)
      m = std::max(m, static_cast<double>(row[j]));
    for (std::int64_t j = 0; j < v; ++j)
      s += std::exp(row[j] - m);
    double lse = m + std::log(s);
    lse_out[r] = static_cast<float>(lse);
    total += lse - row[checked_index(targets[r], v, "cross_entropy")];
  }
  call.outputs[0].data<float>()[0] =
      static_cast<float>(n > 0 ? total / static_cast<double>(n) : 0.0);
}

void cross_entropy_backward(const OpCall& call) {
  float dloss = call.inputs[0].data<float>()[0];
  const Tensor& logits = call.inputs[1];
  const std::int32_t* targets = call.inputs[2].data<std::int32_t>();
  const float* lse = call.inputs[3].data<float>();
  std::int64_t n = logits.dim(0), v = logits.dim(1);
  float* dx = call.outputs[0].data<float>();
  double scale = static_cast<double>(dloss) / static_cast<double>(std::max<std::int64_t>(n, 1));
  for (std::int64_t r = 0; r < n; ++r) {
    std::int32_t t = checked_index(targets[r], v, "cross_entropy_backward");
    for (std::int64_t j = 0; j < v; ++j) {
      double p = std::exp(static_cast<double>(logits.data<float>()[r * v + j]) - lse[r]);
      dx[r * v + j] = static_cast<float>(scale * (p - (j == t ? 1.0 : 0.0)));
    }
  }
}

void layer_norm(const OpCall& call) {
  // y = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + eps), var biased (divide by C).
  const Tensor& x = call.inputs[0];
  const float* w = call.inputs[1].data<float>();
  const float* b = call.inputs[2].data<float>();
  std::int64_t c = x.dim(-1), rows = c == 0 ? 0 : x.numel() / c;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data<float>() + r * c;
    double mean = 0.0, var = 0.0;
    for (std::int64_t j = 0; j < c; ++j)
      mean += xr[j];
    mean /= static_cast<double>(c);
    for (std::int64_t j = 0; j < c; ++j)
      var += (xr[j] - mean) * (xr[j] - mean);
    var /= static_cast<double>(c);
    double rstd = 1.0 / std::sqrt(var + call.attrs.eps);
    for (std::int64_t j = 0; j < c; ++j)
      call.outputs[0].data<float>()[r * c + j] =
          static_cast<float>((xr[j] - mean) * rstd * w[j] + b[j]);
    call.outputs[1].data<float>()[r] = static_cast<float>(mean);
    call.outputs[2].data<float>()[r] = static_cast<float>(rstd);
  }
}

void layer_norm_backward(const OpCall& call) {
  // With xhat = (x - mean) rstd and g = dy * w:
  //   dx = rstd (g - mean(g) - xhat mean(g xhat)),  dw = sum_rows dy xhat,  db = sum_rows dy.
  const float* dy = call.inputs[0].data<float>();
  const float* x = call.inputs[1].data<float>();
  const float* w = call.inputs[2].data<float>();
  const float* mean = call.inputs[3].data<float>();
  const float* rstd = call.inputs[4].data<float>();
  std::int64_t c = call.inputs[1].dim(-1), rows = c == 0 ? 0 : call.inputs[1].numel() / c;
  std::vector<double> dw(c, 0.0), db(c, 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean_g = 0.0, mean_gx = 0.0;
    for (std::int64_t j = 0; j < c; ++j) {
      double xhat = (x[r * c + j] - mean[r]) * static_cast<double>(rstd[r]);
      double g = static_cast<double>(dy[r * c + j]) * w[j];
      mean_g += g;
      mean_gx += g * xhat;
      dw[j] += dy[r * c + j] * xhat;
      db[j] += dy[r * c + j];
    }
    mean_g /= static_cast<double>(c);
    mean_gx /= static_cast<double>(c);
    for (std::int64_t j = 0; j < c; ++j) {
      double xhat = (x[r * c + j] - mean[r]) * static_cast<double>(rstd[r]);
      double g = static_cast<double>(dy[r * c + j]) * w[j];
      call.outputs[0].data<float>()[r * c + j] =
          static_cast<float>(rstd[r] * (g - mean_g - xhat * mean_gx));
    }
  }
  for (std::int64_t j = 0; j < c; ++j) {
    call.outputs[1].data<float>()[j] = static_cast<float>(dw[j]);
    call.outputs[2].data<float>()[j] = static_cast<float>(db[j]);
  }
}

void embedding(const OpCall& call) {
  const Tensor& weight = call.inputs[0];
  const std::int32_t* ids = call.inputs[1].data<std::int32_t>();
  std::int64_t v = weight.dim(0), c = weight.dim(1);
  for (std::int64_t i = 0; i < call.inputs[1].numel(); ++i) {
    std::int32_t id = checked_index(ids[i], v, "embedding");
    std::copy_n(weight.data<float>() + id * c, c, call.outputs[0].data<float>() + i * c);
  }
}

void embedding_backward(const OpCall& call) {
  const float* dy = call.inputs[0].data<float>();
  const std::int32_t* ids = call.inputs[1].data<std::int32_t>();
  Tensor& dw = call.outputs[0];
  std::int64_t v = dw.dim(0), c = dw.dim(1);
  std::fill_n(dw.data<float>(), dw.numel(), 0.0f);
  for (std::int64_t i = 0; i < call.inputs[1].numel(); ++i) {
    std::int32_t id = checked_index(ids[i], v, "embedding_backward");
    for (std::int64_t j = 0; j < c; ++j)
      dw.data<float>()[id * c + j] += dy[i * c + j];
  }
}

// base + the scatter-add, as the two ops would give it: the scatter summed from zero in
// token order, then added to base.
void embedding_backward_add(const OpCall& call) {
  const Tensor& base = call.inputs[0];
  std::array<Tensor, 1> scatter{Tensor::empty(base.shape(), DType::f32, base.backend())};
  Attrs a;
  a.shape = base.shape();
  embedding_backward(OpCall{OpId::embedding_backward, call.inputs.subspan(1), scatter, a});
  const float* pb = base.data<float>();
  const float* ps = scatter[0].data<float>();
  float* out = call.outputs[0].data<float>();
  for (std::int64_t i = 0; i < base.numel(); ++i)
    out[i] = pb[i] + ps[i];
}

void rms_norm(const OpCall& call) {
  // y = x rstd w, rstd = 1 / sqrt(mean(x^2) + eps)
  const Tensor& x = call.inputs[0];
  const float* w = call.inputs[1].data<float>();
  std::int64_t c = x.dim(-1), rows = c == 0 ? 0 : x.numel() / c;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data<float>() + r * c;
    double squares = 0.0;
    for (std::int64_t j = 0; j < c; ++j)
      squares += static_cast<double>(xr[j]) * xr[j];
    double rstd = 1.0 / std::sqrt(squares / static_cast<double>(c) + call.attrs.eps);
    for (std::int64_t j = 0; j < c; ++j)
      call.outputs[0].data<float>()[r * c + j] = static_cast<float>(xr[j] * rstd * w[j]);
    call.outputs[1].data<float>()[r] = static_cast<float>(rstd);
  }
}

void rms_norm_backward(const OpCall& call) {
  // With xhat = x rstd and g = dy w (rstd depends on x through mean(x^2)):
  //   dx = rstd (g - xhat mean(g xhat)),  dw = sum_rows dy xhat.
  const float* dy = call.inputs[0].data<float>();
  const float* x = call.inputs[1].data<float>();
  const float* w = call.inputs[2].data<float>();
  const float* rstd = call.inputs[3].data<float>();
  std::int64_t c = call.inputs[1].dim(-1), rows = c == 0 ? 0 : call.inputs[1].numel() / c;
  std::vector<double> dw(c, 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean_gx = 0.0;
    for (std::int64_t j = 0; j < c; ++j) {
      double xhat = x[r * c + j] * static_cast<double>(rstd[r]);
      mean_gx += static_cast<double>(dy[r * c + j]) * w[j] * xhat;
      dw[j] += dy[r * c + j] * xhat;
    }
    mean_gx /= static_cast<double>(c);
    for (std::int64_t j = 0; j < c; ++j) {
      double xhat = x[r * c + j] * static_cast<double>(rstd[r]);
      double g = static_cast<double>(dy[r * c + j]) * w[j];
      call.outputs[0].data<float>()[r * c + j] = static_cast<float>(rstd[r] * (g - xhat * mean_gx));
    }
  }
  for (std::int64_t j = 0; j < c; ++j)
    call.outputs[1].data<float>()[j] = static_cast<float>(dw[j]);
}

void rope(const OpCall& call) {
  // Per head, the pair (x_i, x_{i+D/2}) at position t turns by angle a = angle(t, i):
  //   y_i = x_i cos a - x_{i+D/2} sin a,  y_{i+D/2} = x_{i+D/2} cos a + x_i sin a.
  const Tensor& x = call.inputs[0];
  const float* cos_table = call.inputs[1].data<float>();
  const float* sin_table = call.inputs[2].data<float>();
  std::int64_t d = x.dim(-1), half = d / 2, n = x.dim(-2), t = x.dim(-3);
  std::int64_t heads = x.numel() / std::max<std::int64_t>(d, 1);
  const float* px = x.data<float>();
  float* py = call.outputs[0].data<float>();
  for (std::int64_t row = 0; row < heads; ++row) {
    std::int64_t position = (row / n) % t;
    const float* xr = px + row * d;
    float* yr = py + row * d;
    for (std::int64_t i = 0; i < half; ++i) {
      double c = cos_table[position * half + i], s = sin_table[position * half + i];
      double a = xr[i], b = xr[i + half];
      yr[i] = static_cast<float>(a * c - b * s);
      yr[i + half] = static_cast<float>(b * c + a * s);
    }
  }
}

namespace {
// q [B,Tq,H,D]; k, v [B,Tk,G,D]; query head h reads key/value head h / (H/G). Query i sits
// at position i + Tk - Tq and sees keys 0..i + Tk - Tq.
struct GroupedShape {
  std::int64_t b, tq, tk, h, g, d;
  std::int64_t q(std::int64_t bi, std::int64_t ti, std::int64_t hi, std::int64_t di) const {
    return ((bi * tq + ti) * h + hi) * d + di;
  }
  std::int64_t kv(std::int64_t bi, std::int64_t ti, std::int64_t hi, std::int64_t di) const {
    return ((bi * tk + ti) * g + hi / (h / g)) * d + di;  // hi: the query head
  }
  std::int64_t last_key(std::int64_t i) const { return i + tk - tq; }
};
GroupedShape grouped_shape(const Tensor& q, const Tensor& k) {
  return {q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3)};
}
}  // namespace

void attention(const OpCall& call) {
  const float* q = call.inputs[0].data<float>();
  const float* k = call.inputs[1].data<float>();
  const float* v = call.inputs[2].data<float>();
  GroupedShape s = grouped_shape(call.inputs[0], call.inputs[1]);
  float* out = call.outputs[0].data<float>();
  float* lse = call.outputs[1].data<float>();
  double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  std::vector<double> p(s.tk);
  for (std::int64_t b = 0; b < s.b; ++b) {
    for (std::int64_t h = 0; h < s.h; ++h) {
      for (std::int64_t i = 0; i < s.tq; ++i) {
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j <= s.last_key(i); ++j) {
          double dot = 0.0;
          for (std::int64_t e = 0; e < s.d; ++e)
            dot += static_cast<double>(q[s.q(b, i, h, e)]) * k[s.kv(b, j, h, e)];
          p[j] = dot * scale;
          m = std::max(m, p[j]);
        }
        double total = 0.0;
        for (std::int64_t j = 0; j <= s.last_key(i); ++j)
          total += std::exp(p[j] - m);
        lse[(b * s.h + h) * s.tq + i] = static_cast<float>(m + std::log(total));
        for (std::int64_t e = 0; e < s.d; ++e) {
          double acc = 0.0;
          for (std::int64_t j = 0; j <= s.last_key(i); ++j)
            acc += std::exp(p[j] - m) / total * v[s.kv(b, j, h, e)];
          out[s.q(b, i, h, e)] = static_cast<float>(acc);
        }
      }
    }
  }
}

void attention_backward(const OpCall& call) {
  // As causal_attention_backward, with each key/value head's gradient summed over the
  // query heads that read it.
  const float* dout = call.inputs[0].data<float>();
  const float* q = call.inputs[1].data<float>();
  const float* k = call.inputs[2].data<float>();
  const float* v = call.inputs[3].data<float>();
  const float* out = call.inputs[4].data<float>();
  const float* lse = call.inputs[5].data<float>();
  GroupedShape s = grouped_shape(call.inputs[1], call.inputs[2]);
  std::vector<double> dq(call.outputs[0].numel(), 0.0), dk(call.outputs[1].numel(), 0.0),
      dv(call.outputs[2].numel(), 0.0);
  double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  for (std::int64_t b = 0; b < s.b; ++b) {
    for (std::int64_t h = 0; h < s.h; ++h) {
      for (std::int64_t i = 0; i < s.tq; ++i) {
        double delta = 0.0;
        for (std::int64_t e = 0; e < s.d; ++e)
          delta += static_cast<double>(dout[s.q(b, i, h, e)]) * out[s.q(b, i, h, e)];
        for (std::int64_t j = 0; j <= s.last_key(i); ++j) {
          double dot = 0.0, dp = 0.0;
          for (std::int64_t e = 0; e < s.d; ++e) {
            dot += static_cast<double>(q[s.q(b, i, h, e)]) * k[s.kv(b, j, h, e)];
            dp += static_cast<double>(dout[s.q(b, i, h, e)]) * v[s.kv(b, j, h, e)];
          }
          double p = std::exp(dot * scale - lse[(b * s.h + h) * s.tq + i]);
          double ds = p * (dp - delta);
          for (std::int64_t e = 0; e < s.d; ++e) {
            dq[s.q(b, i, h, e)] += ds * scale * k[s.kv(b, j, h, e)];
            dk[s.kv(b, j, h, e)] += ds * scale * q[s.q(b, i, h, e)];
            dv[s.kv(b, j, h, e)] += p * dout[s.q(b, i, h, e)];
          }
        }
      }
    }
  }
  std::vector<double>* grads[] = {&dq, &dk, &dv};
  for (int o = 0; o < 3; ++o)
    for (std::size_t n = 0; n < grads[o]->size(); ++n)
      call.outputs[o].data<float>()[n] = static_cast<float>((*grads[o])[n]);
}

namespace {
// qkv is [B,T,3C]: q at columns [0,C), k at [C,2C), v at [2C,3C); head h uses D = C/H
// columns starting at h*D within each — exactly GPT-2's split + view(B,T,H,D).
struct AttentionShape {
  std::int64_t b, t, c, h, d;
  std::int64_t qkv(std::int64_t bi, std::int64_t ti, int which, std::int64_t hi,
                   std::int64_t di) const {
    return (bi * t + ti) * 3 * c + which * c + hi * d + di;
  }
  std::int64_t out(std::int64_t bi, std::int64_t ti, std::int64_t hi, std::int64_t di) const {
    return (bi * t + ti) * c + hi * d + di;
  }
};
AttentionShape attention_shape(const Tensor& qkv, std::int64_t heads) {
  std::int64_t c = qkv.dim(2) / 3;
  return {qkv.dim(0), qkv.dim(1), c, heads, c / heads};
}
}  // namespace

void causal_attention(const OpCall& call) {
  const float* qkv = call.inputs[0].data<float>();
  AttentionShape s = attention_shape(call.inputs[0], call.attrs.heads);
  float* out = call.outputs[0].data<float>();
  float* lse = call.outputs[1].data<float>();
  double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  std::vector<double> p(s.t);
  for (std::int64_t b = 0; b < s.b; ++b) {
    for (std::int64_t h = 0; h < s.h; ++h) {
      for (std::int64_t i = 0; i < s.t; ++i) {
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (std::int64_t e = 0; e < s.d; ++e)
            dot += static_cast<double>(qkv[s.qkv(b, i, 0, h, e)]) * qkv[s.qkv(b, j, 1, h, e)];
          p[j] = dot * scale;
          m = std::max(m, p[j]);
        }
        double total = 0.0;
        for (std::int64_t j = 0; j <= i; ++j)
          total += std::exp(p[j] - m);
        lse[(b * s.h + h) * s.t + i] = static_cast<float>(m + std::log(total));
        for (std::int64_t e = 0; e < s.d; ++e) {
          double acc = 0.0;
          for (std::int64_t j = 0; j <= i; ++j)
            acc += std::exp(p[j] - m) / total * qkv[s.qkv(b, j, 2, h, e)];
          out[s.out(b, i, h, e)] = static_cast<float>(acc);
        }
      }
    }
  }
}

void causal_attention_backward(const OpCall& call) {
  // P = softmax(S), S = q k^T scale (causal). dV = P^T dO; dP = dO V^T;
  // dS = P (dP - rowsum(dO * O)); dQ = dS K scale; dK = dS^T Q scale.
  const float* dout = call.inputs[0].data<float>();
  const float* qkv = call.inputs[1].data<float>();
  const float* out = call.inputs[2].data<float>();
  const float* lse = call.inputs[3].data<float>();
  AttentionShape s = attention_shape(call.inputs[1], call.attrs.heads);
  float* dqkv = call.outputs[0].data<float>();
  std::fill_n(dqkv, call.outputs[0].numel(), 0.0f);
  double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  for (std::int64_t b = 0; b < s.b; ++b) {
    for (std::int64_t h = 0; h < s.h; ++h) {
      for (std::int64_t i = 0; i < s.t; ++i) {
        double delta = 0.0;
        for (std::int64_t e = 0; e < s.d; ++e)
          delta += static_cast<double>(dout[s.out(b, i, h, e)]) * out[s.out(b, i, h, e)];
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0.0, dp = 0.0;
          for (std::int64_t e = 0; e < s.d; ++e) {
            dot += static_cast<double>(qkv[s.qkv(b, i, 0, h, e)]) * qkv[s.qkv(b, j, 1, h, e)];
            dp += static_cast<double>(dout[s.out(b, i, h, e)]) * qkv[s.qkv(b, j, 2, h, e)];
          }
          double p = std::exp(dot * scale - lse[(b * s.h + h) * s.t + i]);
          double ds = p * (dp - delta);
          for (std::int64_t e = 0; e < s.d; ++e) {
            dqkv[s.qkv(b, i, 0, h, e)] +=
                static_cast<float>(ds * scale * qkv[s.qkv(b, j, 1, h, e)]);
            dqkv[s.qkv(b, j, 1, h, e)] +=
                static_cast<float>(ds * scale * qkv[s.qkv(b, i, 0, h, e)]);
            dqkv[s.qkv(b, j, 2, h, e)] += static_cast<float>(p * dout[s.out(b, i, h, e)]);
          }
        }
      }
    }
  }
}

void conv2d(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Tensor& w = call.inputs[1];
  const float* bias = call.inputs[2].data<float>();
  Tensor& y = call.outputs[0];
  std::int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), wd = x.dim(3);
  std::int64_t o = w.dim(0), kh = w.dim(2), kw = w.dim(3), oh = y.dim(2), ow = y.dim(3);
  std::int64_t stride = call.attrs.stride, pad = call.attrs.padding;
  for (std::int64_t ni = 0; ni < n; ++ni)
    for (std::int64_t oi = 0; oi < o; ++oi)
      for (std::int64_t yi = 0; yi < oh; ++yi)
        for (std::int64_t xi = 0; xi < ow; ++xi) {
          double acc = bias[oi];
          for (std::int64_t ci = 0; ci < c; ++ci)
            for (std::int64_t u = 0; u < kh; ++u)
              for (std::int64_t v = 0; v < kw; ++v) {
                std::int64_t iy = yi * stride - pad + u, ix = xi * stride - pad + v;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd)
                  continue;
                acc += static_cast<double>(x.data<float>()[((ni * c + ci) * h + iy) * wd + ix]) *
                       w.data<float>()[((oi * c + ci) * kh + u) * kw + v];
              }
          y.data<float>()[((ni * o + oi) * oh + yi) * ow + xi] = static_cast<float>(acc);
        }
}

void conv2d_backward(const OpCall& call) {
  const float* dy = call.inputs[0].data<float>();
  const Tensor& x = call.inputs[1];
  const Tensor& w = call.inputs[2];
  std::int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), wd = x.dim(3);
  std::int64_t o = w.dim(0), kh = w.dim(2), kw = w.dim(3);
  std::int64_t oh = call.inputs[0].dim(2), ow = call.inputs[0].dim(3);
  std::int64_t stride = call.attrs.stride, pad = call.attrs.padding;
  std::vector<double> dx(x.numel(), 0.0), dw(w.numel(), 0.0), db(o, 0.0);
  for (std::int64_t ni = 0; ni < n; ++ni)
    for (std::int64_t oi = 0; oi < o; ++oi)
      for (std::int64_t yi = 0; yi < oh; ++yi)
        for (std::int64_t xi = 0; xi < ow; ++xi) {
          double g = dy[((ni * o + oi) * oh + yi) * ow + xi];
          db[oi] += g;
          for (std::int64_t ci = 0; ci < c; ++ci)
            for (std::int64_t u = 0; u < kh; ++u)
              for (std::int64_t v = 0; v < kw; ++v) {
                std::int64_t iy = yi * stride - pad + u, ix = xi * stride - pad + v;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd)
                  continue;
                std::int64_t xa = ((ni * c + ci) * h + iy) * wd + ix;
                std::int64_t wa = ((oi * c + ci) * kh + u) * kw + v;
                dx[xa] += g * w.data<float>()[wa];
                dw[wa] += g * x.data<float>()[xa];
              }
        }
  std::transform(dx.begin(), dx.end(), call.outputs[0].data<float>(),
                 [](double v) { return static_cast<float>(v); });
  std::transform(dw.begin(), dw.end(), call.outputs[1].data<float>(),
                 [](double v) { return static_cast<float>(v); });
  std::transform(db.begin(), db.end(), call.outputs[2].data<float>(),
                 [](double v) { return static_cast<float>(v); });
}

namespace {
template <class Window>
void pool_windows(const Tensor& x, const Tensor& y, const Attrs& a, Window f) {
  std::int64_t planes = x.dim(0) * x.dim(1), h = x.dim(2), w = x.dim(3), oh = y.dim(2),
               ow = y.dim(3);
  for (std::int64_t pl = 0; pl < planes; ++pl)
    for (std::int64_t yi = 0; yi < oh; ++yi)
      for (std::int64_t xi = 0; xi < ow; ++xi)
        f(pl, pl * h * w, (pl * oh + yi) * ow + xi, yi * a.stride, xi * a.stride);
}
}  // namespace

void max_pool2d(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  const float* px = x.data<float>();
  float* y = call.outputs[0].data<float>();
  std::int32_t* argmax = call.outputs[1].data<std::int32_t>();
  std::int64_t w = x.dim(3), k = call.attrs.kernel;
  pool_windows(
      x, call.outputs[0], call.attrs,
      [&](std::int64_t, std::int64_t plane, std::int64_t at, std::int64_t y0, std::int64_t x0) {
        float best = -std::numeric_limits<float>::infinity();
        std::int32_t best_at = 0;
        for (std::int64_t u = 0; u < k; ++u)
          for (std::int64_t v = 0; v < k; ++v) {
            std::int64_t flat = (y0 + u) * w + x0 + v;
            float value = px[plane + flat];
            if (value > best) {
              best = value;
              best_at = static_cast<std::int32_t>(flat);
            }
          }
        y[at] = best;
        argmax[at] = best_at;
      });
}

void max_pool2d_backward(const OpCall& call) {
  const float* dy = call.inputs[0].data<float>();
  const std::int32_t* argmax = call.inputs[1].data<std::int32_t>();
  Tensor& dx = call.outputs[0];
  std::fill_n(dx.data<float>(), dx.numel(), 0.0f);
  std::int64_t plane = dx.dim(2) * dx.dim(3),
               per_plane = call.inputs[0].dim(2) * call.inputs[0].dim(3);
  for (std::int64_t i = 0; i < call.inputs[0].numel(); ++i) {
    std::int64_t pl = i / per_plane;
    dx.data<float>()[pl * plane + argmax[i]] += dy[i];
  }
}

void avg_pool2d(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  const float* px = x.data<float>();
  float* y = call.outputs[0].data<float>();
  std::int64_t w = x.dim(3), k = call.attrs.kernel;
  pool_windows(
      x, call.outputs[0], call.attrs,
      [&](std::int64_t, std::int64_t plane, std::int64_t at, std::int64_t y0, std::int64_t x0) {
        double acc = 0.0;
        for (std::int64_t u = 0; u < k; ++u)
          for (std::int64_t v = 0; v < k; ++v)
            acc += px[plane + (y0 + u) * w + x0 + v];
        y[at] = static_cast<float>(acc / static_cast<double>(k * k));
      });
}

void top_k(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  const std::int64_t width = x.dim(-1), k = call.attrs.k, rows = x.numel() / width;
  std::vector<std::int32_t> order;
  for (std::int64_t r = 0; r < rows; ++r)
    top_k_row(x.data<float>() + r * width, width, k, call.outputs[0].data<float>() + r * k,
              call.outputs[1].data<std::int32_t>() + r * k, order);
}

void top_k_backward(const OpCall& call) {
  const Tensor& dv = call.inputs[0];
  const std::int64_t k = dv.dim(-1), width = call.outputs[0].dim(-1), rows = dv.numel() / k;
  const float* pdv = dv.data<float>();
  const std::int32_t* indices = call.inputs[1].data<std::int32_t>();
  float* dx = call.outputs[0].data<float>();
  std::fill_n(dx, call.outputs[0].numel(), 0.0f);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int32_t at = indices[r * k + j];
      check(at >= 0 && at < width, [&] {
        return "top_k_backward: index " + std::to_string(at) + " outside [0, " +
               std::to_string(width) + ")";
      });
      dx[r * width + at] += pdv[r * k + j];
    }
}

void avg_pool2d_backward(const OpCall& call) {
  const Tensor& dy = call.inputs[0];
  const float* pdy = dy.data<float>();
  Tensor& dx = call.outputs[0];
  float* pdx = dx.data<float>();
  std::fill_n(pdx, dx.numel(), 0.0f);
  std::int64_t w = dx.dim(3), k = call.attrs.kernel;
  float inv = 1.0f / static_cast<float>(k * k);
  pool_windows(
      dx, dy, call.attrs,
      [&](std::int64_t, std::int64_t plane, std::int64_t at, std::int64_t y0, std::int64_t x0) {
        for (std::int64_t u = 0; u < k; ++u)
          for (std::int64_t v = 0; v < k; ++v)
            pdx[plane + (y0 + u) * w + x0 + v] += pdy[at] * inv;
      });
}

}  // namespace loom::reference
