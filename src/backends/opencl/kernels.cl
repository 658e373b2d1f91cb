// Loom's OpenCL C kernels (OpenCL 1.2). Every buffer argument comes with an element
// offset, because a tensor is (buffer, offset). One work-item per output element
// unless stated. Embedded into the binary at build time and compiled at run time.

__kernel void fill(__global float* y, const ulong y_off, const float value) {
  y[y_off + get_global_id(0)] = value;
}

// Binary ops. mode: 0 same shape, 1 scalar, 2 trailing block of `period`, 3 per row
// (each value repeats `period` times). `other_left`: the broadcast operand is the left one.
float binary_op(const int op, const float a, const float b) {
  switch (op) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    default: return a / b;
  }
}

// Columns by rows: modes 2 and 3 launch `period` columns by size / period rows, so the
// broadcast operand's index is the column or the row (no division per element, which
// kept a CPU device's kernel scalar); modes 0 and 1 launch one row.
__kernel void binary(const int op, __global const float* full, const ulong full_off, __global const float* other,
                     const ulong other_off, __global float* c, const ulong c_off, const int mode, const ulong period,
                     const int other_left) {
  const ulong col = get_global_id(0), row = get_global_id(1), i = row * period + col;
  const ulong j = mode == 0 ? i : mode == 1 ? 0 : mode == 2 ? col : row;
  float x = full[full_off + i], y = other[other_off + j];
  c[c_off + i] = other_left ? binary_op(op, y, x) : binary_op(op, x, y);
}

// gelu_tanh and gelu_tanh_grad: elementwise.cl, compiled ahead of this file.

// op: 0 exp, 1 log, 2 tanh, 3 relu, 4 gelu, 5 scale by alpha, 6 sqrt, 7 erf; 8 + the
// catalog's math function (MathFunction: sin cos tan asin acos atan sinh cosh asinh acosh
// atanh floor ceil round sign)
__kernel void unary(const int op, __global const float* x, const ulong x_off, __global float* y, const ulong y_off,
                    const float alpha) {
  size_t i = get_global_id(0);
  float v = x[x_off + i];
  float r;
  switch (op) {
    case 0: r = exp(v); break;
    case 1: r = log(v); break;
    case 2: r = tanh(v); break;
    case 3: r = v > 0.0f ? v : 0.0f; break;
    case 4: r = gelu_tanh(v); break;
    case 6: r = sqrt(v); break;
    case 7: r = loom_erf(v); break;
    case 8: r = sin(v); break;
    case 9: r = cos(v); break;
    case 10: r = tan(v); break;
    case 11: r = asin(v); break;
    case 12: r = acos(v); break;
    case 13: r = atan(v); break;
    case 14: r = sinh(v); break;
    case 15: r = cosh(v); break;
    case 16: r = asinh(v); break;
    case 17: r = acosh(v); break;
    case 18: r = atanh(v); break;
    case 19: r = floor(v); break;
    case 20: r = ceil(v); break;
    case 21: r = rint(v); break;
    case 22: r = v > 0.0f ? 1.0f : v < 0.0f ? -1.0f : v; break;
    default: r = alpha * v; break;
  }
  y[y_off + i] = r;
}

// The unary ops an eager training step runs, one kernel each: the switch above over a
// run-time op (with the math functions' library calls among its cases) keeps a CPU
// device's compiler from vectorizing it. The same expressions as its cases.
#define LOOM_UNARY(NAME, EXPR)                                                               \
  __kernel void NAME(__global const float* x, const ulong x_off, __global float* y,          \
                     const ulong y_off, const float alpha) {                                 \
    const size_t i = get_global_id(0);                                                       \
    const float v = x[x_off + i];                                                            \
    y[y_off + i] = (EXPR);                                                                   \
  }
LOOM_UNARY(unary_exp, exp(v))
LOOM_UNARY(unary_log, log(v))
LOOM_UNARY(unary_tanh, tanh(v))
LOOM_UNARY(unary_relu, v > 0.0f ? v : 0.0f)
LOOM_UNARY(unary_gelu, gelu_tanh(v))
LOOM_UNARY(unary_scale, alpha * v)
LOOM_UNARY(unary_sqrt, sqrt(v))
LOOM_UNARY(unary_erf, loom_erf(v))

// op: 0 relu_backward (dy, x), 1 gelu_backward (dy, x), 2 tanh_backward (dy, y)
__kernel void unary_backward(const int op, __global const float* dy, const ulong dy_off, __global const float* x,
                             const ulong x_off, __global float* dx, const ulong dx_off) {
  size_t i = get_global_id(0);
  float g = dy[dy_off + i], v = x[x_off + i];
  float r;
  switch (op) {
    case 0: r = v > 0.0f ? g : 0.0f; break;
    case 1: r = g * gelu_tanh_grad(v); break;
    default: r = g * (1.0f - v * v); break;
  }
  dx[dx_off + i] = r;
}

// x viewed as [rows, cols]. One work-item per row: sum (or max) of the row.
__kernel void reduce_rows(const int is_max, __global const float* x, const ulong x_off, __global float* y,
                          const ulong y_off, const ulong cols, const float scale) {
  size_t r = get_global_id(0);
  __global const float* row = x + x_off + r * cols;
  float acc = is_max ? -INFINITY : 0.0f;
  for (ulong j = 0; j < cols; ++j) acc = is_max ? fmax(acc, row[j]) : acc + row[j];
  y[y_off + r] = acc * scale;
}

// x viewed as [rows, cols]. One work-item per column: sum over rows (bias gradients).
__kernel void sum_cols(__global const float* x, const ulong x_off, __global float* y, const ulong y_off,
                       const ulong rows, const ulong cols, const float scale) {
  size_t c = get_global_id(0);
  float acc = 0.0f;
  for (ulong r = 0; r < rows; ++r) acc += x[x_off + r * cols + c];
  y[y_off + c] = acc * scale;
}

// AdamW (decoupled weight decay, bias-corrected). Outputs may alias the inputs (the
// optimizer updates in place) or be separate tensors (the conformance suite).
__kernel void adamw(__global const float* p_in, const ulong p_in_off, __global const float* g, const ulong g_off,
                    __global const float* m_in, const ulong m_in_off, __global const float* v_in, const ulong v_in_off,
                    __global float* p_out, const ulong p_out_off, __global float* m_out, const ulong m_out_off,
                    __global float* v_out, const ulong v_out_off, const float b1, const float b2,
                    const float step_size, const float inv_sqrt_bc2, const float decay, const float eps) {
  size_t i = get_global_id(0);
  float gi = g[g_off + i];
  float mi = b1 * m_in[m_in_off + i] + (1.0f - b1) * gi;
  float vi = b2 * v_in[v_in_off + i] + (1.0f - b2) * gi * gi;
  float pi = p_in[p_in_off + i];
  m_out[m_out_off + i] = mi;
  v_out[v_out_off + i] = vi;
  p_out[p_out_off + i] = pi * decay - step_size * mi / (sqrt(vi) * inv_sqrt_bc2 + eps);
}

// ---- layout ------------------------------------------------------------------------
// y (contiguous) = x read through up to 6 dims of shape s and strides t (elements).
__kernel void copy_strided(__global const float* x, const ulong x_off, __global float* y, const ulong y_off,
                           const int rank, const ulong s0, const ulong s1, const ulong s2, const ulong s3,
                           const ulong s4, const ulong s5, const ulong t0, const ulong t1, const ulong t2,
                           const ulong t3, const ulong t4, const ulong t5) {
  ulong shape[6] = {s0, s1, s2, s3, s4, s5};
  ulong stride[6] = {t0, t1, t2, t3, t4, t5};
  ulong i = get_global_id(0), rem = i, src = 0;
  for (int d = rank - 1; d >= 0; --d) {
    src += (rem % shape[d]) * stride[d];
    rem /= shape[d];
  }
  y[y_off + i] = x[x_off + src];
}

// gemm_nt, gemm_nn and gemm_tn: gemm.cl, compiled ahead of this file.

// The same copy with the host's merged dimensions: a work-item copies up to 64 elements
// of one row of the innermost dimension (get_global_id(0) the piece, get_global_id(1)
// the row), the row's offset decoded once in 32-bit arithmetic (the host launches this
// only when every index of the view fits). A 64-bit division per dimension and element
// made copy_strided a fifth of a small model's step on a CPU device.
#define LOOM_COPY_PIECE 64
__kernel void copy_rows(__global const float* x, const ulong x_off, __global float* y,
                        const ulong y_off, const uint inner, const uint inner_stride,
                        const int outer_rank, const uint n0, const uint n1, const uint n2,
                        const uint n3, const uint n4, const uint t0, const uint t1, const uint t2,
                        const uint t3, const uint t4) {
  const uint piece = get_global_id(0), row = get_global_id(1);
  const uint n[5] = {n0, n1, n2, n3, n4}, t[5] = {t0, t1, t2, t3, t4};
  uint rem = row, src = 0;
  for (int d = outer_rank - 1; d >= 0; --d) {
    src += (rem % n[d]) * t[d];
    rem /= n[d];
  }
  __global const float* from = x + x_off + src;
  __global float* to = y + y_off + (ulong)row * inner;
  const uint begin = piece * LOOM_COPY_PIECE, end = min(begin + LOOM_COPY_PIECE, inner);
  if (inner_stride == 1) {
    for (uint i = begin; i < end; ++i)
      to[i] = from[i];
  } else {
    for (uint i = begin; i < end; ++i)
      to[i] = from[i * inner_stride];
  }
}

// dx viewed as [outer, L, inner]; dy as [outer, l, inner] placed at rows [start, start + l).
// Columns (inner) by rows (outer x L): a row's place is decoded once per row, where a
// division per element kept a CPU device's kernel scalar.
__kernel void slice_backward(__global const float* dy, const ulong dy_off, __global float* dx, const ulong dx_off,
                             const ulong L, const ulong l, const ulong inner, const ulong start) {
  const ulong in = get_global_id(0), row = get_global_id(1);
  const ulong a = row % L, o = row / L, i = row * inner + in;
  dx[dx_off + i] = (a >= start && a < start + l) ? dy[dy_off + (o * l + (a - start)) * inner + in] : 0.0f;
}

// y viewed as [outer, row] bytes, x as [outer, run] bytes: x's rows placed at byte `column`
// of y's (concat, any dtype). Bytes by rows.
__kernel void place_columns(__global const uchar* x, const ulong x_off, __global uchar* y,
                            const ulong y_off, const ulong run, const ulong row,
                            const ulong column) {
  const ulong i = get_global_id(0), o = get_global_id(1);
  y[y_off + o * row + column + i] = x[x_off + o * run + i];
}

// Row r's k largest, larger first, equal values by the lower index (core/reference_util.h's
// order): pick j is the best element after pick j - 1 in that order, one scan of the row a
// pick and no scratch (k is small: experts chosen per token). Rows without NaN.
__kernel void top_k_rows(__global const float* x, const ulong x_off, __global float* values,
                         const ulong v_off, __global int* indices, const ulong i_off,
                         const ulong width, const ulong k) {
  const ulong r = get_global_id(0);
  __global const float* row = x + x_off + r * width;
  float prev_v = INFINITY;
  long prev_i = -1;
  for (ulong j = 0; j < k; ++j) {
    float best_v = -INFINITY;
    long best_i = -1;
    for (ulong e = 0; e < width; ++e) {
      const float v = row[e];
      const bool after = v < prev_v || (v == prev_v && (long)e > prev_i);
      if (after && (best_i < 0 || v > best_v)) {
        best_v = v;
        best_i = (long)e;
      }
    }
    values[v_off + r * k + j] = best_v;
    indices[i_off + r * k + j] = (int)best_i;
    prev_v = best_v;
    prev_i = best_i;
  }
}

// top_k's backward, a row a work-item: zeros, then each picked value's gradient at its index
// (indices outside the row, which top_k never gives, are left out).
__kernel void top_k_scatter(__global const float* dv, const ulong dv_off, __global const int* indices,
                            const ulong i_off, __global float* dx, const ulong dx_off,
                            const ulong width, const ulong k) {
  const ulong r = get_global_id(0);
  __global float* out = dx + dx_off + r * width;
  for (ulong e = 0; e < width; ++e) out[e] = 0.0f;
  for (ulong j = 0; j < k; ++j) {
    const int at = indices[i_off + r * k + j];
    if (at >= 0 && (ulong)at < width) out[at] += dv[dv_off + r * k + j];
  }
}

// partial[c] = sum of squares of chunk c (chunks of `chunk` elements; the last may be short).
__kernel void sum_squares_partial(__global const float* x, const ulong x_off, const ulong n, const ulong chunk,
                                  __global float* partial) {
  ulong c = get_global_id(0), begin = c * chunk, end = min(n, begin + chunk);
  float acc = 0.0f;
  for (ulong i = begin; i < end; ++i) acc += x[x_off + i] * x[x_off + i];
  partial[c] = acc;
}

// ---- embedding -----------------------------------------------------------------------
// Whether a token id is inside [0, limit). One outside is used for nothing, and the first
// is recorded for the host: fault[0] the op's code (0: none yet), [1] the id's position,
// [2] the id, [3] the limit (device_ops::IdCheckOp: the op; device_ops::id_fault_error names it).
bool id_in_range(const int id, const ulong limit, __global int* fault, const int op, const ulong at) {
  if (id >= 0 && (ulong)id < limit)
    return true;
  if (atomic_cmpxchg(fault, 0, op) == 0) {
    fault[1] = (int)at;
    fault[2] = id;
    fault[3] = (int)limit;
  }
  return false;
}

__kernel void embedding(__global const float* w, const ulong w_off, __global const int* ids, const ulong ids_off,
                        __global float* y, const ulong y_off, const ulong c, const ulong vocab,
                        __global int* fault) {
  ulong i = get_global_id(0), t = i / c, j = i % c;
  const int id = ids[ids_off + t];
  y[y_off + i] = id_in_range(id, vocab, fault, 1, t) ? w[w_off + (ulong)id * c + j] : 0.0f;
}

// The embedding's gradient in three launches, each over the range that suits it:
// embedding_zero clears the table (columns x rows), embedding_scatter gives each column one
// work-item that adds the tokens' rows in token order (deterministic, no atomics), and, for
// embedding_backward_add, embedding_add_base adds base to each sum afterwards (columns x
// rows), as the add of the two ops computes it. `op`: the IdCheckOp named for a bad id.
__kernel void embedding_zero(__global float* dw, const ulong dw_off, const ulong c) {
  dw[dw_off + get_global_id(1) * c + get_global_id(0)] = 0.0f;
}
__kernel void embedding_scatter(__global const float* dy, const ulong dy_off, __global const int* ids,
                                const ulong ids_off, __global float* dw, const ulong dw_off, const ulong tokens,
                                const ulong c, const ulong vocab, __global int* fault, const int op) {
  const ulong j = get_global_id(0);
  for (ulong t = 0; t < tokens; ++t) {
    const int id = ids[ids_off + t];
    if (id_in_range(id, vocab, fault, op, t))
      dw[dw_off + (ulong)id * c + j] += dy[dy_off + t * c + j];
  }
}
__kernel void embedding_add_base(__global const float* base, const ulong base_off, __global float* dw,
                                 const ulong dw_off, const ulong c) {
  const ulong i = get_global_id(1) * c + get_global_id(0);
  dw[dw_off + i] = base[base_off + i] + dw[dw_off + i];
}

// ---- cross-entropy -------------------------------------------------------------------
// Per row: lse = max + log sum exp(x - max); row_loss = lse - x[target].
__kernel void cross_entropy_rows(__global const float* x, const ulong x_off, __global const int* t, const ulong t_off,
                                 __global float* lse, const ulong lse_off, __global float* row_loss, const ulong v,
                                 __global int* fault) {
  ulong r = get_global_id(0);
  __global const float* row = x + x_off + r * v;
  float m = -INFINITY;
  for (ulong j = 0; j < v; ++j) m = fmax(m, row[j]);
  float s = 0.0f;
  for (ulong j = 0; j < v; ++j) s += exp(row[j] - m);
  float l = m + log(s);
  lse[lse_off + r] = l;
  const int target = t[t_off + r];
  row_loss[r] = id_in_range(target, v, fault, 3, r) ? l - row[target] : 0.0f;
}

// dx = dloss / N (softmax - onehot)
__kernel void cross_entropy_backward(__global const float* dloss, const ulong dloss_off, __global const float* x,
                                     const ulong x_off, __global const int* t, const ulong t_off,
                                     __global const float* lse, const ulong lse_off, __global float* dx,
                                     const ulong dx_off, const ulong v, const float inv_n,
                                     __global int* fault) {
  ulong i = get_global_id(0), r = i / v, j = i % v;
  float p = exp(x[x_off + i] - lse[lse_off + r]);
  const int target = t[t_off + r];
  if (j == 0)
    id_in_range(target, v, fault, 4, r);
  dx[dx_off + i] = dloss[dloss_off] * inv_n * (p - (j == (ulong)target ? 1.0f : 0.0f));
}

// ---- layer norm backward ---------------------------------------------------------------
// Per row: dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w, xhat = (x - mean) rstd.
__kernel void layer_norm_backward_rows(__global const float* dy, const ulong dy_off, __global const float* x,
                                       const ulong x_off, __global const float* w, const ulong w_off,
                                       __global const float* mean, const ulong mean_off, __global const float* rstd,
                                       const ulong rstd_off, __global float* dx, const ulong dx_off, const ulong c) {
  ulong r = get_global_id(0);
  float mu = mean[mean_off + r], rs = rstd[rstd_off + r];
  float mg = 0.0f, mgx = 0.0f;
  for (ulong j = 0; j < c; ++j) {
    float g = dy[dy_off + r * c + j] * w[w_off + j];
    mg += g;
    mgx += g * (x[x_off + r * c + j] - mu) * rs;
  }
  mg /= (float)c;
  mgx /= (float)c;
  for (ulong j = 0; j < c; ++j) {
    float xhat = (x[x_off + r * c + j] - mu) * rs;
    dx[dx_off + r * c + j] = rs * (dy[dy_off + r * c + j] * w[w_off + j] - mg - xhat * mgx);
  }
}

// Per column: dw = sum_rows dy xhat, db = sum_rows dy.
__kernel void layer_norm_backward_cols(__global const float* dy, const ulong dy_off, __global const float* x,
                                       const ulong x_off, __global const float* mean, const ulong mean_off,
                                       __global const float* rstd, const ulong rstd_off, __global float* dw,
                                       const ulong dw_off, __global float* db, const ulong db_off, const ulong rows,
                                       const ulong c) {
  ulong j = get_global_id(0);
  float sw = 0.0f, sb = 0.0f;
  for (ulong r = 0; r < rows; ++r) {
    float g = dy[dy_off + r * c + j];
    sw += g * (x[x_off + r * c + j] - mean[mean_off + r]) * rstd[rstd_off + r];
    sb += g;
  }
  dw[dw_off + j] = sw;
  db[db_off + j] = sb;
}

// ---- attention -------------------------------------------------------------------------
// One family of kernels for causal_attention's fused qkv [B,T,3C] and attention's separate
// q [B,Tq,H,D], k and v [B,Tk,G,D]: q, k, v and out are strided views, row strides ldq, ldkv,
// ldo and batch strides bq, bkv, bo, each head's D columns at h*D (query heads) or g*D (key/
// value heads, g = h / (H/G)). Query i sits at position i + Tk - Tq and sees keys 0..that.
#define LOOM_MAX_HEAD 256
#define LOOM_ATTENTION_LAYOUT                                                                  \
  const ulong Tq, const ulong Tk, const ulong H, const ulong G, const ulong D, const ulong ldq, \
      const ulong ldkv, const ulong ldo, const ulong bq, const ulong bkv, const ulong bo, const float scale

// One work-item per (b, h, i): out[b,i,h,:] and lse[b,h,i].
__kernel void attention_forward(__global const float* q, const ulong q_off, __global const float* k,
                                const ulong k_off, __global const float* v, const ulong v_off, __global float* out,
                                const ulong out_off, __global float* lse, const ulong lse_off,
                                LOOM_ATTENTION_LAYOUT) {
  ulong id = get_global_id(0), i = id % Tq, h = (id / Tq) % H, b = id / (Tq * H);
  ulong g = h / (H / G), last = i + Tk - Tq;
  __global const float* qi = q + q_off + b * bq + i * ldq + h * D;
  __global const float* k0 = k + k_off + b * bkv + g * D;
  __global const float* v0 = v + v_off + b * bkv + g * D;
  float m = -INFINITY;
  for (ulong j = 0; j <= last; ++j) {
    float s = 0.0f;
    for (ulong e = 0; e < D; ++e) s += qi[e] * k0[j * ldkv + e];
    m = fmax(m, s * scale);
  }
  float acc[LOOM_MAX_HEAD];
  for (ulong e = 0; e < D; ++e) acc[e] = 0.0f;
  float total = 0.0f;
  for (ulong j = 0; j <= last; ++j) {
    float s = 0.0f;
    for (ulong e = 0; e < D; ++e) s += qi[e] * k0[j * ldkv + e];
    float p = exp(s * scale - m);
    total += p;
    for (ulong e = 0; e < D; ++e) acc[e] += p * v0[j * ldkv + e];
  }
  for (ulong e = 0; e < D; ++e) out[out_off + b * bo + i * ldo + h * D + e] = acc[e] / total;
  lse[lse_off + (b * H + h) * Tq + i] = m + log(total);
}

// p_ij and ds_ij = p_ij (dO_i . v_j - dO_i . O_i), recomputed from lse (dO and O: out's layout).
float attention_ds(__global const float* q, const ulong q_off, __global const float* k, const ulong k_off,
                   __global const float* v, const ulong v_off, __global const float* dout, const ulong dout_off,
                   __global const float* out, const ulong out_off, const float lse_i, const ulong b, const ulong h,
                   const ulong i, const ulong j, LOOM_ATTENTION_LAYOUT, float* p_out) {
  ulong g = h / (H / G);
  __global const float* qi = q + q_off + b * bq + i * ldq + h * D;
  __global const float* kj = k + k_off + b * bkv + j * ldkv + g * D;
  __global const float* vj = v + v_off + b * bkv + j * ldkv + g * D;
  __global const float* dO = dout + dout_off + b * bo + i * ldo + h * D;
  __global const float* O = out + out_off + b * bo + i * ldo + h * D;
  float s = 0.0f, dp = 0.0f, delta = 0.0f;
  for (ulong e = 0; e < D; ++e) {
    s += qi[e] * kj[e];
    dp += dO[e] * vj[e];
    delta += dO[e] * O[e];
  }
  float p = exp(s * scale - lse_i);
  *p_out = p;
  return p * (dp - delta);
}

#define LOOM_ATTENTION_ARGS Tq, Tk, H, G, D, ldq, ldkv, ldo, bq, bkv, bo, scale

// One work-item per (b, h, i): dq_i = scale sum_{j <= last_i} ds_ij k_j (dq: q's layout).
__kernel void attention_backward_dq(__global const float* dout, const ulong dout_off, __global const float* q,
                                    const ulong q_off, __global const float* k, const ulong k_off,
                                    __global const float* v, const ulong v_off, __global const float* out,
                                    const ulong out_off, __global const float* lse, const ulong lse_off,
                                    __global float* dq, const ulong dq_off, LOOM_ATTENTION_LAYOUT) {
  ulong id = get_global_id(0), i = id % Tq, h = (id / Tq) % H, b = id / (Tq * H);
  ulong g = h / (H / G), last = i + Tk - Tq;
  float acc[LOOM_MAX_HEAD];
  for (ulong e = 0; e < D; ++e) acc[e] = 0.0f;
  float lse_i = lse[lse_off + (b * H + h) * Tq + i], p;
  for (ulong j = 0; j <= last; ++j) {
    float ds = attention_ds(q, q_off, k, k_off, v, v_off, dout, dout_off, out, out_off, lse_i, b, h, i, j,
                            LOOM_ATTENTION_ARGS, &p);
    __global const float* kj = k + k_off + b * bkv + j * ldkv + g * D;
    for (ulong e = 0; e < D; ++e) acc[e] += ds * scale * kj[e];
  }
  for (ulong e = 0; e < D; ++e) dq[dq_off + b * bq + i * ldq + h * D + e] = acc[e];
}

// One work-item per (b, g, j): over the query heads h of group g and the queries i that see
// key j, dk_j = scale sum ds_ij q_i and dv_j = sum p_ij dO_i (dk, dv: k's layout).
__kernel void attention_backward_dkv(__global const float* dout, const ulong dout_off, __global const float* q,
                                     const ulong q_off, __global const float* k, const ulong k_off,
                                     __global const float* v, const ulong v_off, __global const float* out,
                                     const ulong out_off, __global const float* lse, const ulong lse_off,
                                     __global float* dk, const ulong dk_off, __global float* dv, const ulong dv_off,
                                     LOOM_ATTENTION_LAYOUT) {
  ulong id = get_global_id(0), j = id % Tk, g = (id / Tk) % G, b = id / (Tk * G);
  ulong offset = Tk - Tq, first = j > offset ? j - offset : 0, group = H / G;
  float dkj[LOOM_MAX_HEAD], dvj[LOOM_MAX_HEAD];
  for (ulong e = 0; e < D; ++e) dkj[e] = dvj[e] = 0.0f;
  float p;
  for (ulong h = g * group; h < (g + 1) * group; ++h) {
    for (ulong i = first; i < Tq; ++i) {
      float lse_i = lse[lse_off + (b * H + h) * Tq + i];
      float ds = attention_ds(q, q_off, k, k_off, v, v_off, dout, dout_off, out, out_off, lse_i, b, h, i, j,
                              LOOM_ATTENTION_ARGS, &p);
      __global const float* qi = q + q_off + b * bq + i * ldq + h * D;
      __global const float* dO = dout + dout_off + b * bo + i * ldo + h * D;
      for (ulong e = 0; e < D; ++e) {
        dkj[e] += ds * scale * qi[e];
        dvj[e] += p * dO[e];
      }
    }
  }
  for (ulong e = 0; e < D; ++e) {
    dk[dk_off + b * bkv + j * ldkv + g * D + e] = dkj[e];
    dv[dv_off + b * bkv + j * ldkv + g * D + e] = dvj[e];
  }
}

// ---- RMSNorm, rotary positions, SiLU and SwiGLU -------------------------------------------
// One work-item per row: rstd = (mean(x^2) + eps)^(-1/2), y = x rstd w.
__kernel void rms_norm_rows(__global const float* x, const ulong x_off, __global const float* w, const ulong w_off,
                            __global float* y, const ulong y_off, __global float* rstd, const ulong rstd_off,
                            const ulong c, const float eps) {
  ulong r = get_global_id(0);
  __global const float* xr = x + x_off + r * c;
  float squares = 0.0f;
  for (ulong j = 0; j < c; ++j) squares += xr[j] * xr[j];
  float rs = 1.0f / sqrt(squares / (float)c + eps);
  for (ulong j = 0; j < c; ++j) y[y_off + r * c + j] = xr[j] * rs * w[w_off + j];
  rstd[rstd_off + r] = rs;
}

// Per row: dx = rstd (g - xhat mean(g xhat)), g = dy w, xhat = x rstd.
__kernel void rms_norm_backward_rows(__global const float* dy, const ulong dy_off, __global const float* x,
                                     const ulong x_off, __global const float* w, const ulong w_off,
                                     __global const float* rstd, const ulong rstd_off, __global float* dx,
                                     const ulong dx_off, const ulong c) {
  ulong r = get_global_id(0);
  float rs = rstd[rstd_off + r], mgx = 0.0f;
  for (ulong j = 0; j < c; ++j) mgx += dy[dy_off + r * c + j] * w[w_off + j] * x[x_off + r * c + j] * rs;
  mgx /= (float)c;
  for (ulong j = 0; j < c; ++j) {
    float xhat = x[x_off + r * c + j] * rs;
    dx[dx_off + r * c + j] = rs * (dy[dy_off + r * c + j] * w[w_off + j] - xhat * mgx);
  }
}

// Per column: dw = sum_rows dy xhat.
__kernel void rms_norm_backward_cols(__global const float* dy, const ulong dy_off, __global const float* x,
                                     const ulong x_off, __global const float* rstd, const ulong rstd_off,
                                     __global float* dw, const ulong dw_off, const ulong rows, const ulong c) {
  ulong j = get_global_id(0);
  float sw = 0.0f;
  for (ulong r = 0; r < rows; ++r) sw += dy[dy_off + r * c + j] * x[x_off + r * c + j] * rstd[rstd_off + r];
  dw[dw_off + j] = sw;
}

// One work-item per pair (row of D, i < D/2): the row's position is (row / N) % T.
__kernel void rope(__global const float* x, const ulong x_off, __global const float* cs, const ulong cs_off,
                   __global const float* sn, const ulong sn_off, __global float* y, const ulong y_off,
                   const ulong T, const ulong N, const ulong pairs) {
  ulong id = get_global_id(0), i = id % pairs, row = id / pairs, t = (row / N) % T;
  float c = cs[cs_off + t * pairs + i], s = sn[sn_off + t * pairs + i];
  float a = x[x_off + row * 2 * pairs + i], b = x[x_off + row * 2 * pairs + pairs + i];
  y[y_off + row * 2 * pairs + i] = a * c - b * s;
  y[y_off + row * 2 * pairs + pairs + i] = b * c + a * s;
}

float loom_sigmoid(const float x) { return 1.0f / (1.0f + exp(-x)); }

__kernel void silu(__global const float* x, const ulong x_off, __global float* y, const ulong y_off) {
  size_t i = get_global_id(0);
  float v = x[x_off + i];
  y[y_off + i] = v * loom_sigmoid(v);
}
// dy s (1 + x (1 - s))
__kernel void silu_backward(__global const float* dy, const ulong dy_off, __global const float* x,
                            const ulong x_off, __global float* dx, const ulong dx_off) {
  size_t i = get_global_id(0);
  float v = x[x_off + i], s = loom_sigmoid(v);
  dx[dx_off + i] = dy[dy_off + i] * s * (1.0f + v * (1.0f - s));
}
__kernel void swiglu(__global const float* gate, const ulong gate_off, __global const float* up,
                     const ulong up_off, __global float* y, const ulong y_off) {
  size_t i = get_global_id(0);
  float g = gate[gate_off + i];
  y[y_off + i] = g * loom_sigmoid(g) * up[up_off + i];
}
__kernel void swiglu_backward(__global const float* dy, const ulong dy_off, __global const float* gate,
                              const ulong gate_off, __global const float* up, const ulong up_off,
                              __global float* dgate, const ulong dgate_off, __global float* dup,
                              const ulong dup_off) {
  size_t i = get_global_id(0);
  float g = gate[gate_off + i], s = loom_sigmoid(g), d = dy[dy_off + i];
  dgate[dgate_off + i] = d * up[up_off + i] * s * (1.0f + g * (1.0f - s));
  dup[dup_off + i] = d * g * s;
}
