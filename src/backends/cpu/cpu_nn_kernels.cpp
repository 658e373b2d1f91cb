// Fast CPU kernels, part 2: layer norm, embedding, cross-entropy, causal attention and
// convolution. Each is one fused pass where the unfused chain would stream the same
// rows through memory several times.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/vec_math.h"
#include "backends/device_ops.h"
#include "core/error.h"
#include "core/reference_util.h"

namespace loom::cpu {

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc);

namespace {

constexpr std::int64_t kParallelGrain = 16384;

// ---- layer norm -------------------------------------------------------------------
// x is [rows, C]. Forward: y = (x - mean) rstd w + b. Backward (g = dy w, xhat = (x-mean) rstd):
// dx = rstd (g - mean(g) - xhat mean(g xhat)); dw, db summed over rows per thread, then combined.
void layer_norm(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  const float* px = x.data<float>();
  const float* w = call.inputs[1].data<float>();
  const float* b = call.inputs[2].data<float>();
  float* y = call.outputs[0].data<float>();
  float* mean_out = call.outputs[1].data<float>();
  float* rstd_out = call.outputs[2].data<float>();
  std::int64_t c = x.dim(-1), rows = c == 0 ? 0 : x.numel() / c;
  float eps = static_cast<float>(call.attrs.eps);
#pragma omp parallel for schedule(static) if (x.numel() > kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = px + r * c;
    float mean = lanes_sum(c, [&](std::int64_t j) { return xr[j]; }) / static_cast<float>(c);
    float var = lanes_sum(c, [&](std::int64_t j) { return (xr[j] - mean) * (xr[j] - mean); });
    float rstd = 1.0f / std::sqrt(var / static_cast<float>(c) + eps);
    float* yr = y + r * c;
#pragma omp simd
    for (std::int64_t j = 0; j < c; ++j)
      yr[j] = (xr[j] - mean) * rstd * w[j] + b[j];
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

void layer_norm_backward(const OpCall& call) {
  const float* dy = call.inputs[0].data<float>();
  const float* x = call.inputs[1].data<float>();
  const float* w = call.inputs[2].data<float>();
  const float* mean = call.inputs[3].data<float>();
  const float* rstd = call.inputs[4].data<float>();
  float* dx = call.outputs[0].data<float>();
  float* dw = call.outputs[1].data<float>();
  float* db = call.outputs[2].data<float>();
  std::int64_t c = call.inputs[1].dim(-1), rows = c == 0 ? 0 : call.inputs[1].numel() / c;
  int threads = rows * c > kParallelGrain ? omp_get_max_threads() : 1;
  std::vector<float> partial(static_cast<std::size_t>(threads) * 2 * c, 0.0f);
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num();
    float* dw_t = partial.data() + static_cast<std::size_t>(t) * 2 * c;
    float* db_t = dw_t + c;
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * c;
      const float* dyr = dy + r * c;
      float mu = mean[r], rs = rstd[r];
      // One pass: the row sums of g and g xhat in 16 fixed lanes (see lanes_sum), and
      // this thread's dw, db.
      constexpr int kLanes = 16;
      float lane_g[kLanes] = {}, lane_gx[kLanes] = {};
      std::int64_t j0 = 0;
      for (; j0 + kLanes <= c; j0 += kLanes) {
#pragma omp simd
        for (int l = 0; l < kLanes; ++l) {
          std::int64_t j = j0 + l;
          float xhat = (xr[j] - mu) * rs, g = dyr[j] * w[j];
          lane_g[l] += g;
          lane_gx[l] += g * xhat;
          dw_t[j] += dyr[j] * xhat;
          db_t[j] += dyr[j];
        }
      }
      float tail_g = 0.0f, tail_gx = 0.0f;
      for (std::int64_t j = j0; j < c; ++j) {
        float xhat = (xr[j] - mu) * rs, g = dyr[j] * w[j];
        tail_g += g;
        tail_gx += g * xhat;
        dw_t[j] += dyr[j] * xhat;
        db_t[j] += dyr[j];
      }
      for (int width = kLanes / 2; width > 0; width /= 2)
        for (int l = 0; l < width; ++l) {
          lane_g[l] += lane_g[l + width];
          lane_gx[l] += lane_gx[l + width];
        }
      float mean_g = (lane_g[0] + tail_g) / static_cast<float>(c);
      float mean_gx = (lane_gx[0] + tail_gx) / static_cast<float>(c);
      float* dxr = dx + r * c;
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j) {
        float xhat = (xr[j] - mu) * rs;
        dxr[j] = rs * (dyr[j] * w[j] - mean_g - xhat * mean_gx);
      }
    }
  }
  for (std::int64_t j = 0; j < c; ++j) {
    float sw = 0.0f, sb = 0.0f;
    for (int t = 0; t < threads; ++t) {
      sw += partial[static_cast<std::size_t>(t) * 2 * c + j];
      sb += partial[static_cast<std::size_t>(t) * 2 * c + c + j];
    }
    dw[j] = sw;
    db[j] = sb;
  }
}

// ---- embedding --------------------------------------------------------------------
// Called once per index: the message is built only for an index out of range.
std::int32_t checked_id(std::int32_t id, std::int64_t limit, const char* op) {
  check(id >= 0 && id < limit, [&] {
    return std::string(op) + ": index " + std::to_string(id) + " outside [0, " +
           std::to_string(limit) + ")";
  });
  return id;
}

void embedding(const OpCall& call) {
  const float* weight = call.inputs[0].data<float>();
  const std::int32_t* ids = call.inputs[1].data<std::int32_t>();
  std::int64_t v = call.inputs[0].dim(0), c = call.inputs[0].dim(1), n = call.inputs[1].numel();
  for (std::int64_t i = 0; i < n; ++i)
    checked_id(ids[i], v, "embedding");
  float* out = call.outputs[0].data<float>();
#pragma omp parallel for schedule(static) if (n * c > kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i)
    std::memcpy(out + i * c, weight + ids[i] * c, c * sizeof(float));
}

// Scatter-add of dy's n rows of c into the rows row_of(i) points at. Threads split the C
// columns, so no two threads touch the same element and the sum order per element is the
// token order: deterministic.
template <class RowOf>
void scatter_rows(const float* dy, std::int64_t n, std::int64_t c, RowOf row_of) {
  int threads = n * c > kParallelGrain && c >= 64 ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    std::int64_t begin = c * t / nt, end = c * (t + 1) / nt;
    for (std::int64_t i = 0; i < n; ++i) {
      float* row = row_of(i);
      const float* g = dy + i * c;
      for (std::int64_t j = begin; j < end; ++j)
        row[j] += g[j];
    }
  }
}

void embedding_backward(const OpCall& call) {
  const float* dy = call.inputs[0].data<float>();
  const std::int32_t* ids = call.inputs[1].data<std::int32_t>();
  Tensor& dw = call.outputs[0];
  std::int64_t v = dw.dim(0), c = dw.dim(1), n = call.inputs[1].numel();
  for (std::int64_t i = 0; i < n; ++i)
    checked_id(ids[i], v, "embedding_backward");
  float* pdw = dw.data<float>();
  // The zeroed table is most of the work (a GPT-2 vocabulary's is 154 MB): by all threads.
#pragma omp parallel for schedule(static) if (v * c > kParallelGrain)
  for (std::int64_t r = 0; r < v; ++r)
    std::memset(pdw + r * c, 0, static_cast<std::size_t>(c) * sizeof(float));
  scatter_rows(dy, n, c, [&](std::int64_t i) { return pdw + ids[i] * c; });
}

// base + embedding_backward(dy, ids) in one pass over the table instead of three (zero,
// scatter, add): the tokens' rows are summed, from zero and in token order, into one row
// per distinct id, then each output row is base's row plus that sum where its id occurs.
// The same bits as the two ops.
void embedding_backward_add(const OpCall& call) {
  const Tensor& base = call.inputs[0];
  const float* dy = call.inputs[1].data<float>();
  const std::int32_t* ids = call.inputs[2].data<std::int32_t>();
  const std::int64_t v = base.dim(0), c = base.dim(1), n = call.inputs[2].numel();
  std::vector<std::int32_t> slot_of_id(static_cast<std::size_t>(v), -1), slot_of_token;
  slot_of_token.reserve(static_cast<std::size_t>(n));
  std::int32_t slots = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    std::int32_t& slot = slot_of_id[checked_id(ids[i], v, "embedding_backward_add")];
    if (slot < 0)
      slot = slots++;
    slot_of_token.push_back(slot);
  }
  std::vector<float> sums(static_cast<std::size_t>(slots * c), 0.0f);
  scatter_rows(dy, n, c, [&](std::int64_t i) { return sums.data() + slot_of_token[i] * c; });
  const float* pb = base.data<float>();
  float* out = call.outputs[0].data<float>();
#pragma omp parallel for schedule(static) if (v * c > kParallelGrain)
  for (std::int64_t r = 0; r < v; ++r) {
    const std::int32_t slot = slot_of_id[r];
    if (slot < 0) {
      std::memcpy(out + r * c, pb + r * c, static_cast<std::size_t>(c) * sizeof(float));
      continue;
    }
    const float* sum = sums.data() + slot * c;
#pragma omp simd
    for (std::int64_t j = 0; j < c; ++j)
      out[r * c + j] = pb[r * c + j] + sum[j];
  }
}

// ---- cross-entropy ----------------------------------------------------------------
void cross_entropy(const OpCall& call) {
  const float* logits = call.inputs[0].data<float>();
  const std::int32_t* targets = call.inputs[1].data<std::int32_t>();
  std::int64_t n = call.inputs[0].dim(0), v = call.inputs[0].dim(1);
  for (std::int64_t r = 0; r < n; ++r)
    checked_id(targets[r], v, "cross_entropy");
  float* lse_out = call.outputs[1].data<float>();
  double total = 0.0;
#pragma omp parallel for reduction(+ : total) schedule(static) if (n * v > kParallelGrain)
  for (std::int64_t r = 0; r < n; ++r) {
    // Vectorised (fixed lanes, exp to about 2 ulp): over a 50k vocabulary the scalar
    // library exp made this and its backward 5% of a GPT-2 step.
    const float* row = logits + r * v;
    const float m = lanes_max(v, [&](std::int64_t j) { return row[j]; });
    const float s = lanes_sum(v, [&](std::int64_t j) { return exp_approx(row[j] - m); });
    float lse = m + std::log(s);
    lse_out[r] = lse;
    total += static_cast<double>(lse) - row[targets[r]];
  }
  call.outputs[0].data<float>()[0] =
      static_cast<float>(n > 0 ? total / static_cast<double>(n) : 0.0);
}

void cross_entropy_backward(const OpCall& call) {
  float dloss = call.inputs[0].data<float>()[0];
  const float* logits = call.inputs[1].data<float>();
  const std::int32_t* targets = call.inputs[2].data<std::int32_t>();
  const float* lse = call.inputs[3].data<float>();
  std::int64_t n = call.inputs[1].dim(0), v = call.inputs[1].dim(1);
  for (std::int64_t r = 0; r < n; ++r)
    checked_id(targets[r], v, "cross_entropy_backward");
  float* dx = call.outputs[0].data<float>();
  float scale = dloss / static_cast<float>(std::max<std::int64_t>(n, 1));
#pragma omp parallel for schedule(static) if (n * v > kParallelGrain)
  for (std::int64_t r = 0; r < n; ++r) {
    const float* row = logits + r * v;
    float* drow = dx + r * v;
    float l = lse[r];
#pragma omp simd
    for (std::int64_t j = 0; j < v; ++j)
      drow[j] = scale * exp_approx(row[j] - l);
    drow[targets[r]] -= scale;
  }
}

// ---- attention ------------------------------------------------------------------------
// One kernel serves both catalog ops: causal_attention's fused qkv [B,T,3C] and attention's
// separate q [B,Tq,H,D], k and v [B,Tk,G,D]. Per (batch, head) the Tq x D block of q and
// the Tk x D blocks of k and v are strided views (row strides ld_q, ld_kv), which GEMM reads
// directly: no split, permute or copy. Query head h reads key/value head h / (H/G).
// Queries go in blocks of kQueryBlock rows; query i sits at position i + Tk - Tq, so block
// [i0, i0+rows) meets only keys [0, i0 + rows + Tk - Tq): the masked upper triangle is
// (almost all) never computed.
constexpr std::int64_t kQueryBlock = 64;  // measured: 64 beats 32 at T = 64 and 128 (bigger GEMMs)

using device_ops::AttentionLayout;

// q, k, v, out: the first element of batch 0, head 0 of each.
void attention_forward(const AttentionLayout& s, const float* q, const float* k, const float* v,
                       float* out, float* lse) {
  float scale = s.scale();
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<std::size_t>(kQueryBlock * s.tk));
#pragma omp for schedule(static) collapse(2)
    for (std::int64_t b = 0; b < s.b; ++b) {
      for (std::int64_t h = 0; h < s.h; ++h) {
        const float* qh = q + b * s.batch_q + h * s.d;
        const std::int64_t kv_offset = b * s.batch_kv + (h / s.group()) * s.d;
        const float* kh = k + kv_offset;
        const float* vh = v + kv_offset;
        float* o = out + b * s.batch_o + h * s.d;
        float* lse_bh = lse + (b * s.h + h) * s.tq;
        for (std::int64_t i0 = 0; i0 < s.tq; i0 += kQueryBlock) {
          std::int64_t rows = std::min(kQueryBlock, s.tq - i0), end = i0 + rows + s.offset();
          // S = scale q_block k[0:end]^T, [rows, end] with leading dimension end.
          gemm(false, true, rows, end, s.d, scale, qh + i0 * s.ld_q, s.ld_q, kh, s.ld_kv, 0.0f,
               scores.data(), end);
          for (std::int64_t r = 0; r < rows; ++r) {
            std::int64_t last = i0 + r + s.offset();  // keys 0..last are visible
            float* row = scores.data() + r * end;
            float m = lanes_max(last + 1, [&](std::int64_t j) { return row[j]; });
            float total = 0.0f;
#pragma omp simd reduction(+ : total)
            for (std::int64_t j = 0; j <= last; ++j) {
              row[j] = exp_approx(row[j] - m);
              total += row[j];
            }
            float inv = 1.0f / total;
#pragma omp simd
            for (std::int64_t j = 0; j <= last; ++j)
              row[j] *= inv;
            for (std::int64_t j = last + 1; j < end; ++j)
              row[j] = 0.0f;
            lse_bh[i0 + r] = m + std::log(total);
          }
          gemm(false, false, rows, s.d, end, 1.0f, scores.data(), end, vh, s.ld_kv, 0.0f,
               o + i0 * s.ld_o, s.ld_o);  // O = P v
        }
      }
    }
  }
}

// Per query block: P recomputed from lse; dV += P^T dO; dP = dO V^T;
// dS = P (dP - rowsum(dO * O)); dQ = scale dS K; dK += scale dS^T Q. The heads sharing a
// key/value head run in turn on one thread, so its dK and dV sum without races.
void attention_backward_pass(const AttentionLayout& s, const float* dout, const float* q,
                             const float* k, const float* v, const float* out, const float* lse,
                             float* dq, float* dk, float* dv) {
  float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
#pragma omp parallel
  {
    std::vector<float> p(static_cast<std::size_t>(kQueryBlock * s.tk)), dp(p.size());
#pragma omp for schedule(static) collapse(2)
    for (std::int64_t b = 0; b < s.b; ++b) {
      for (std::int64_t g = 0; g < s.g; ++g) {
        const std::int64_t kv_offset = b * s.batch_kv + g * s.d;
        const float* kg = k + kv_offset;
        const float* vg = v + kv_offset;
        float* dkg = dk + kv_offset;
        float* dvg = dv + kv_offset;
        for (std::int64_t t = 0; t < s.tk; ++t) {  // dK and dV accumulate over query blocks
          std::fill_n(dkg + t * s.ld_kv, s.d, 0.0f);
          std::fill_n(dvg + t * s.ld_kv, s.d, 0.0f);
        }
        for (std::int64_t h = g * s.group(); h < (g + 1) * s.group(); ++h) {
          const float* qh = q + b * s.batch_q + h * s.d;
          float* dqh = dq + b * s.batch_q + h * s.d;
          const float* o = out + b * s.batch_o + h * s.d;
          const float* dot = dout + b * s.batch_o + h * s.d;
          const float* lse_bh = lse + (b * s.h + h) * s.tq;
          for (std::int64_t i0 = 0; i0 < s.tq; i0 += kQueryBlock) {
            std::int64_t rows = std::min(kQueryBlock, s.tq - i0), end = i0 + rows + s.offset();
            gemm(false, true, rows, end, s.d, scale, qh + i0 * s.ld_q, s.ld_q, kg, s.ld_kv, 0.0f,
                 p.data(), end);
            for (std::int64_t r = 0; r < rows; ++r) {
              std::int64_t last = i0 + r + s.offset();
              float* row = p.data() + r * end;
              float l = lse_bh[i0 + r];
#pragma omp simd
              for (std::int64_t j = 0; j <= last; ++j)
                row[j] = exp_approx(row[j] - l);
              for (std::int64_t j = last + 1; j < end; ++j)
                row[j] = 0.0f;
            }
            const float* dot_blk = dot + i0 * s.ld_o;
            gemm(true, false, end, s.d, rows, 1.0f, p.data(), end, dot_blk, s.ld_o, 1.0f, dvg,
                 s.ld_kv);  // dV += P^T dO
            gemm(false, true, rows, end, s.d, 1.0f, dot_blk, s.ld_o, vg, s.ld_kv, 0.0f, dp.data(),
                 end);  // dP = dO V^T
            for (std::int64_t r = 0; r < rows; ++r) {
              std::int64_t last = i0 + r + s.offset();
              const float* dot_i = dot + (i0 + r) * s.ld_o;
              const float* o_i = o + (i0 + r) * s.ld_o;
              float delta = lanes_sum(s.d, [&](std::int64_t e) { return dot_i[e] * o_i[e]; });
              float* prow = p.data() + r * end;
              const float* dprow = dp.data() + r * end;
#pragma omp simd
              for (std::int64_t j = 0; j <= last; ++j)
                prow[j] = prow[j] * (dprow[j] - delta);  // now dS
            }
            gemm(false, false, rows, s.d, end, scale, p.data(), end, kg, s.ld_kv, 0.0f,
                 dqh + i0 * s.ld_q, s.ld_q);  // dQ = scale dS K
            gemm(true, false, end, s.d, rows, scale, p.data(), end, qh + i0 * s.ld_q, s.ld_q, 1.0f,
                 dkg, s.ld_kv);  // dK += scale dS^T Q
          }
        }
      }
    }
  }
}

void causal_attention(const OpCall& call) {
  const float* qkv = call.inputs[0].data<float>();
  AttentionLayout s = device_ops::fused_attention_layout(call.inputs[0], call.attrs.heads);
  attention_forward(s, qkv, qkv + s.h * s.d, qkv + 2 * s.h * s.d, call.outputs[0].data<float>(),
                    call.outputs[1].data<float>());
}

void causal_attention_backward(const OpCall& call) {
  const float* qkv = call.inputs[1].data<float>();
  AttentionLayout s = device_ops::fused_attention_layout(call.inputs[1], call.attrs.heads);
  float* dqkv = call.outputs[0].data<float>();
  const std::int64_t c = s.h * s.d;
  attention_backward_pass(s, call.inputs[0].data<float>(), qkv, qkv + c, qkv + 2 * c,
                          call.inputs[2].data<float>(), call.inputs[3].data<float>(), dqkv,
                          dqkv + c, dqkv + 2 * c);
}

void attention(const OpCall& call) {
  AttentionLayout s = device_ops::grouped_attention_layout(call.inputs[0], call.inputs[1]);
  attention_forward(s, call.inputs[0].data<float>(), call.inputs[1].data<float>(),
                    call.inputs[2].data<float>(), call.outputs[0].data<float>(),
                    call.outputs[1].data<float>());
}

void attention_backward(const OpCall& call) {
  AttentionLayout s = device_ops::grouped_attention_layout(call.inputs[1], call.inputs[2]);
  attention_backward_pass(
      s, call.inputs[0].data<float>(), call.inputs[1].data<float>(), call.inputs[2].data<float>(),
      call.inputs[3].data<float>(), call.inputs[4].data<float>(), call.inputs[5].data<float>(),
      call.outputs[0].data<float>(), call.outputs[1].data<float>(), call.outputs[2].data<float>());
}

// ---- RMSNorm, rotary positions, SiLU and SwiGLU -----------------------------------------
// rms_norm: y = x rstd w, rstd = (mean(x^2) + eps)^(-1/2), one pass per row.
void rms_norm(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  const float* px = x.data<float>();
  const float* w = call.inputs[1].data<float>();
  float* y = call.outputs[0].data<float>();
  float* rstd_out = call.outputs[1].data<float>();
  std::int64_t c = x.dim(-1), rows = c == 0 ? 0 : x.numel() / c;
  float eps = static_cast<float>(call.attrs.eps);
#pragma omp parallel for schedule(static) if (x.numel() > kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = px + r * c;
    float squares = lanes_sum(c, [&](std::int64_t j) { return xr[j] * xr[j]; });
    float rstd = 1.0f / std::sqrt(squares / static_cast<float>(c) + eps);
    float* yr = y + r * c;
#pragma omp simd
    for (std::int64_t j = 0; j < c; ++j)
      yr[j] = xr[j] * rstd * w[j];
    rstd_out[r] = rstd;
  }
}

// dx = rstd (g - xhat mean(g xhat)), g = dy w, xhat = x rstd; dw = sum over rows of dy xhat
// (per-thread partial sums in a fixed order, then combined in thread order).
void rms_norm_backward(const OpCall& call) {
  const float* dy = call.inputs[0].data<float>();
  const float* x = call.inputs[1].data<float>();
  const float* w = call.inputs[2].data<float>();
  const float* rstd = call.inputs[3].data<float>();
  float* dx = call.outputs[0].data<float>();
  float* dw = call.outputs[1].data<float>();
  std::int64_t c = call.inputs[1].dim(-1), rows = c == 0 ? 0 : call.inputs[1].numel() / c;
  const int threads = call.inputs[1].numel() > kParallelGrain ? omp_get_max_threads() : 1;
  std::vector<float> partial(static_cast<std::size_t>(threads * c), 0.0f);
#pragma omp parallel num_threads(threads)
  {
    float* mine = partial.data() + omp_get_thread_num() * c;
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * c;
      const float* dyr = dy + r * c;
      const float rs = rstd[r];
      float mean_gx = lanes_sum(c, [&](std::int64_t j) { return dyr[j] * w[j] * xr[j] * rs; }) /
                      static_cast<float>(c);
      float* dxr = dx + r * c;
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j) {
        float xhat = xr[j] * rs;
        dxr[j] = rs * (dyr[j] * w[j] - xhat * mean_gx);
        mine[j] += dyr[j] * xhat;
      }
    }
  }
  for (std::int64_t j = 0; j < c; ++j) {
    float total = 0.0f;
    for (int t = 0; t < threads; ++t)
      total += partial[static_cast<std::size_t>(t * c + j)];
    dw[j] = total;
  }
}

// Each head's pairs (i, i + D/2) at position t turn by the angle whose cos and sin are
// row t of the tables.
void rope(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  const float* cos_table = call.inputs[1].data<float>();
  const float* sin_table = call.inputs[2].data<float>();
  std::int64_t d = x.dim(-1), half = d / 2, n = x.dim(-2), t = x.dim(-3);
  std::int64_t heads = d == 0 ? 0 : x.numel() / d;
  const float* px = x.data<float>();
  float* py = call.outputs[0].data<float>();
#pragma omp parallel for schedule(static) if (x.numel() > kParallelGrain)
  for (std::int64_t row = 0; row < heads; ++row) {
    const float* cr = cos_table + ((row / n) % t) * half;
    const float* sr = sin_table + ((row / n) % t) * half;
    const float* xr = px + row * d;
    float* yr = py + row * d;
#pragma omp simd
    for (std::int64_t i = 0; i < half; ++i) {
      float a = xr[i], b = xr[i + half];
      yr[i] = a * cr[i] - b * sr[i];
      yr[i + half] = b * cr[i] + a * sr[i];
    }
  }
}

// ---- convolution through im2col + GEMM ------------------------------------------------
struct ConvGeometry {
  std::int64_t n, c, h, w, o, kh, kw, oh, ow, stride, pad;
  std::int64_t patch() const { return c * kh * kw; }
  std::int64_t pixels() const { return oh * ow; }
};
ConvGeometry conv_geometry(const Tensor& x, const Tensor& w, const Attrs& a) {
  std::int64_t oh = (x.dim(2) + 2 * a.padding - w.dim(2)) / a.stride + 1;
  std::int64_t ow = (x.dim(3) + 2 * a.padding - w.dim(3)) / a.stride + 1;
  return {x.dim(0), x.dim(1), x.dim(2), x.dim(3), w.dim(0), w.dim(2),
          w.dim(3), oh,       ow,       a.stride, a.padding};
}

// cols[(ci,u,v), (y,x)] = image[ci, y*stride - pad + u, x*stride - pad + v] (0 outside).
void im2col(const float* image, const ConvGeometry& g, float* cols) {
  for (std::int64_t ci = 0; ci < g.c; ++ci)
    for (std::int64_t u = 0; u < g.kh; ++u)
      for (std::int64_t v = 0; v < g.kw; ++v) {
        float* row = cols + ((ci * g.kh + u) * g.kw + v) * g.pixels();
        for (std::int64_t y = 0; y < g.oh; ++y) {
          std::int64_t iy = y * g.stride - g.pad + u;
          for (std::int64_t x = 0; x < g.ow; ++x) {
            std::int64_t ix = x * g.stride - g.pad + v;
            row[y * g.ow + x] = (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w)
                                    ? image[(ci * g.h + iy) * g.w + ix]
                                    : 0.0f;
          }
        }
      }
}

void col2im(const float* cols, const ConvGeometry& g, float* image) {
  std::memset(image, 0, static_cast<std::size_t>(g.c * g.h * g.w) * sizeof(float));
  for (std::int64_t ci = 0; ci < g.c; ++ci)
    for (std::int64_t u = 0; u < g.kh; ++u)
      for (std::int64_t v = 0; v < g.kw; ++v) {
        const float* row = cols + ((ci * g.kh + u) * g.kw + v) * g.pixels();
        for (std::int64_t y = 0; y < g.oh; ++y) {
          std::int64_t iy = y * g.stride - g.pad + u;
          if (iy < 0 || iy >= g.h)
            continue;
          for (std::int64_t x = 0; x < g.ow; ++x) {
            std::int64_t ix = x * g.stride - g.pad + v;
            if (ix >= 0 && ix < g.w)
              image[(ci * g.h + iy) * g.w + ix] += row[y * g.ow + x];
          }
        }
      }
}

void conv2d(const OpCall& call) {
  ConvGeometry g = conv_geometry(call.inputs[0], call.inputs[1], call.attrs);
  const float* x = call.inputs[0].data<float>();
  const float* w = call.inputs[1].data<float>();
  const float* bias = call.inputs[2].data<float>();
  float* y = call.outputs[0].data<float>();
#pragma omp parallel
  {
    std::vector<float> cols(static_cast<std::size_t>(g.patch() * g.pixels()));
#pragma omp for schedule(static)
    for (std::int64_t i = 0; i < g.n; ++i) {
      im2col(x + i * g.c * g.h * g.w, g, cols.data());
      float* yi = y + i * g.o * g.pixels();
      for (std::int64_t oi = 0; oi < g.o; ++oi)
        std::fill_n(yi + oi * g.pixels(), g.pixels(), bias[oi]);
      gemm(false, false, g.o, g.pixels(), g.patch(), 1.0f, w, g.patch(), cols.data(), g.pixels(),
           1.0f, yi, g.pixels());
    }
  }
}

void conv2d_backward(const OpCall& call) {
  // Per image: dW += dY cols^T; dcols = W^T dY, then col2im; db = sum of dY over pixels.
  const float* dy = call.inputs[0].data<float>();
  ConvGeometry g = conv_geometry(call.inputs[1], call.inputs[2], call.attrs);
  const float* x = call.inputs[1].data<float>();
  const float* w = call.inputs[2].data<float>();
  float* dx = call.outputs[0].data<float>();
  float* dw = call.outputs[1].data<float>();
  float* db = call.outputs[2].data<float>();
  int threads = omp_get_max_threads();
  std::vector<float> dw_partial(static_cast<std::size_t>(threads) * g.o * g.patch(), 0.0f);
  std::vector<double> db_partial(static_cast<std::size_t>(threads) * g.o, 0.0);
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num();
    std::vector<float> cols(static_cast<std::size_t>(g.patch() * g.pixels()));
    std::vector<float> dcols(cols.size());
    float* dw_t = dw_partial.data() + static_cast<std::size_t>(t) * g.o * g.patch();
#pragma omp for schedule(static)
    for (std::int64_t i = 0; i < g.n; ++i) {
      const float* dyi = dy + i * g.o * g.pixels();
      im2col(x + i * g.c * g.h * g.w, g, cols.data());
      gemm(false, true, g.o, g.patch(), g.pixels(), 1.0f, dyi, g.pixels(), cols.data(), g.pixels(),
           1.0f, dw_t, g.patch());
      gemm(true, false, g.patch(), g.pixels(), g.o, 1.0f, w, g.patch(), dyi, g.pixels(), 0.0f,
           dcols.data(), g.pixels());
      col2im(dcols.data(), g, dx + i * g.c * g.h * g.w);
      for (std::int64_t oi = 0; oi < g.o; ++oi) {
        double acc = 0.0;
        for (std::int64_t p = 0; p < g.pixels(); ++p)
          acc += dyi[oi * g.pixels() + p];
        db_partial[static_cast<std::size_t>(t) * g.o + oi] += acc;
      }
    }
  }
  for (std::int64_t j = 0; j < g.o * g.patch(); ++j) {
    float acc = 0.0f;
    for (int t = 0; t < threads; ++t)
      acc += dw_partial[static_cast<std::size_t>(t) * g.o * g.patch() + j];
    dw[j] = acc;
  }
  for (std::int64_t oi = 0; oi < g.o; ++oi) {
    double acc = 0.0;
    for (int t = 0; t < threads; ++t)
      acc += db_partial[static_cast<std::size_t>(t) * g.o + oi];
    db[oi] = static_cast<float>(acc);
  }
}

// ---- pooling: planes in parallel ---------------------------------------------------
void max_pool2d(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  const float* px = x.data<float>();
  float* py = call.outputs[0].data<float>();
  std::int32_t* arg = call.outputs[1].data<std::int32_t>();
  std::int64_t planes = x.dim(0) * x.dim(1), h = x.dim(2), w = x.dim(3);
  std::int64_t oh = call.outputs[0].dim(2), ow = call.outputs[0].dim(3), k = call.attrs.kernel,
               s = call.attrs.stride;
#pragma omp parallel for schedule(static) if (x.numel() > kParallelGrain)
  for (std::int64_t p = 0; p < planes; ++p) {
    const float* plane = px + p * h * w;
    for (std::int64_t yi = 0; yi < oh; ++yi)
      for (std::int64_t xi = 0; xi < ow; ++xi) {
        float best = -std::numeric_limits<float>::infinity();
        std::int64_t best_at = 0;
        for (std::int64_t u = 0; u < k; ++u)
          for (std::int64_t v = 0; v < k; ++v) {
            std::int64_t flat = (yi * s + u) * w + xi * s + v;
            if (plane[flat] > best) {
              best = plane[flat];
              best_at = flat;
            }
          }
        std::int64_t at = (p * oh + yi) * ow + xi;
        py[at] = best;
        arg[at] = static_cast<std::int32_t>(best_at);
      }
  }
}

void max_pool2d_backward(const OpCall& call) {
  const float* dy = call.inputs[0].data<float>();
  const std::int32_t* arg = call.inputs[1].data<std::int32_t>();
  Tensor& dx = call.outputs[0];
  float* pdx = dx.data<float>();
  std::int64_t planes = dx.dim(0) * dx.dim(1), plane = dx.dim(2) * dx.dim(3);
  std::int64_t per_plane = call.inputs[0].dim(2) * call.inputs[0].dim(3);
#pragma omp parallel for schedule(static) if (dx.numel() > kParallelGrain)
  for (std::int64_t p = 0; p < planes; ++p) {
    float* out = pdx + p * plane;
    std::memset(out, 0, plane * sizeof(float));
    for (std::int64_t i = 0; i < per_plane; ++i)
      out[arg[p * per_plane + i]] += dy[p * per_plane + i];
  }
}

// ---- routing: rows in parallel ----------------------------------------------------------
void top_k(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  const std::int64_t width = x.dim(-1), k = call.attrs.k, rows = x.numel() / width;
  const float* px = x.data<float>();
  float* values = call.outputs[0].data<float>();
  std::int32_t* indices = call.outputs[1].data<std::int32_t>();
#pragma omp parallel if (x.numel() > kParallelGrain)
  {
    std::vector<std::int32_t> order;
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r)
      top_k_row(px + r * width, width, k, values + r * k, indices + r * k, order);
  }
}

}  // namespace

void register_nn_kernels(std::array<KernelFn, kNumOps>& table) {
  auto set = [&](OpId op, KernelFn fn) { table[static_cast<std::size_t>(op)] = fn; };
  set(OpId::layer_norm, layer_norm);
  set(OpId::layer_norm_backward, layer_norm_backward);
  set(OpId::embedding, embedding);
  set(OpId::embedding_backward, embedding_backward);
  set(OpId::embedding_backward_add, embedding_backward_add);
  set(OpId::cross_entropy, cross_entropy);
  set(OpId::cross_entropy_backward, cross_entropy_backward);
  set(OpId::causal_attention, causal_attention);
  set(OpId::attention, attention);
  set(OpId::attention_backward, attention_backward);
  set(OpId::rms_norm, rms_norm);
  set(OpId::rms_norm_backward, rms_norm_backward);
  set(OpId::rope, rope);
  set(OpId::causal_attention_backward, causal_attention_backward);
  set(OpId::conv2d, conv2d);
  set(OpId::conv2d_backward, conv2d_backward);
  set(OpId::max_pool2d, max_pool2d);
  set(OpId::max_pool2d_backward, max_pool2d_backward);
  set(OpId::top_k, top_k);
  set(OpId::top_k_backward, reference::top_k_backward);  // a scatter of k values a row
}

}  // namespace loom::cpu
