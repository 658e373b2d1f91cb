// Loom's CUDA kernels. Compiled by nvcc into a fatbin (sm_80, sm_90 and PTX) that is
// embedded into the binary and loaded with cuModuleLoadData, so the host code needs no
// CUDA runtime. Every kernel (LOOM_KERNEL) is extern "C" so the host finds it by name;
// the CPU emulator (emulator/) compiles this same file and finds them by the same names.
//
// Conventions: pointers already include the tensor's offset; sizes are 64-bit; 1-D
// launches use grid-stride loops, so any grid size is correct. Row kernels give one warp
// (32 threads) to a row, or one block when rows are long (cross-entropy over a vocabulary).
// Every reduction has a fixed order, so results are bitwise repeatable run to run.
#include <cuda_bf16.h>

#include "backends/cuda/kernel_args.h"

// The emulator (emulator/device_shim.h) compiles this file as C++ with its own definition.
#ifndef LOOM_KERNEL
#define LOOM_KERNEL extern "C" __global__ void
#endif

typedef long long i64;

namespace {

__device__ __forceinline__ i64 first_index() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ i64 grid_stride() { return (i64)gridDim.x * blockDim.x; }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reductions (blockDim.x a multiple of 32); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float partial[32];
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();  // a previous call's readers are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? partial[lane] : 0.0f);
}
__device__ float block_max(float v) {
  __shared__ float partial[32];
  v = warp_max(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_max(lane < warps ? partial[lane] : -INFINITY);
}

__device__ __forceinline__ float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float gelu_tanh_grad(float x) {
  const float k = 0.7978845608028654f;
  float x2 = x * x, t = tanhf(k * (x + 0.044715f * x2 * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * x2);
}

__device__ __forceinline__ float binary_op(int op, float a, float b) {
  switch (op) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    default: return a / b;
  }
}

}  // namespace

// ---- elementwise ---------------------------------------------------------------------

LOOM_KERNEL fill(float* y, i64 n, float value) {
  for (i64 i = first_index(); i < n; i += grid_stride()) y[i] = value;
}

// mode: 0 same shape, 1 scalar, 2 trailing block of `period`, 3 each value repeated
// `period` times. other_left: the broadcast operand is the left one.
LOOM_KERNEL binary(int op, const float* full, const float* other, float* c, i64 n, int mode,
                                  i64 period, int other_left) {
  for (i64 i = first_index(); i < n; i += grid_stride()) {
    i64 j = mode == 0 ? i : mode == 1 ? 0 : mode == 2 ? i % period : i / period;
    float x = full[i], y = other[j];
    c[i] = other_left ? binary_op(op, y, x) : binary_op(op, x, y);
  }
}

// op: 0 exp, 1 log, 2 tanh, 3 relu, 4 gelu, 5 scale by alpha, 6 sqrt, 7 erf; 8 + the
// catalog's math function (sin cos tan asin acos atan sinh cosh asinh acosh atanh floor
// ceil round sign)
LOOM_KERNEL unary(int op, const float* x, float* y, i64 n, float alpha) {
  for (i64 i = first_index(); i < n; i += grid_stride()) {
    float v = x[i], r;
    switch (op) {
      case 0: r = expf(v); break;
      case 1: r = logf(v); break;
      case 2: r = tanhf(v); break;
      case 3: r = v > 0.0f ? v : 0.0f; break;
      case 4: r = gelu_tanh(v); break;
      case 6: r = sqrtf(v); break;
      case 7: r = erff(v); break;
      case 8: r = sinf(v); break;
      case 9: r = cosf(v); break;
      case 10: r = tanf(v); break;
      case 11: r = asinf(v); break;
      case 12: r = acosf(v); break;
      case 13: r = atanf(v); break;
      case 14: r = sinhf(v); break;
      case 15: r = coshf(v); break;
      case 16: r = asinhf(v); break;
      case 17: r = acoshf(v); break;
      case 18: r = atanhf(v); break;
      case 19: r = floorf(v); break;
      case 20: r = ceilf(v); break;
      case 21: r = rintf(v); break;
      case 22: r = v > 0.0f ? 1.0f : v < 0.0f ? -1.0f : v; break;
      default: r = alpha * v; break;
    }
    y[i] = r;
  }
}

// op: 0 relu_backward (dy, x), 1 gelu_backward (dy, x), 2 tanh_backward (dy, y)
LOOM_KERNEL unary_backward(int op, const float* dy, const float* x, float* dx, i64 n) {
  for (i64 i = first_index(); i < n; i += grid_stride()) {
    float g = dy[i], v = x[i];
    dx[i] = op == 0 ? (v > 0.0f ? g : 0.0f) : op == 1 ? g * gelu_tanh_grad(v) : g * (1.0f - v * v);
  }
}

// One step of a fused chain: the unfused kernel's expression (binary, unary,
// unary_backward), one step per statement.
__device__ __forceinline__ float fused_apply(const loom::cuda::FusedStep& st, float a, float b) {
  using namespace loom::cuda;
  switch (st.op) {
    case fused_add: return a + b;
    case fused_sub: return a - b;
    case fused_mul: return a * b;
    case fused_div: return a / b;
    case fused_scale: return st.alpha * a;
    case fused_exp: return expf(a);
    case fused_log: return logf(a);
    case fused_tanh: return tanhf(a);
    case fused_sqrt: return sqrtf(a);
    case fused_erf: return erff(a);
    case fused_relu: return a > 0.0f ? a : 0.0f;
    case fused_gelu: return gelu_tanh(a);
    case fused_relu_backward: return b > 0.0f ? a : 0.0f;
    case fused_gelu_backward: return a * gelu_tanh_grad(b);
    case fused_tanh_backward: return a * (1.0f - b * b);
    default: return a;
  }
}

// Input k of a fused chain at output element i (same layout, one value, or strided over
// the collapsed dimensions).
__device__ __forceinline__ float fused_input(const loom::cuda::FusedProgram& p, int k, i64 i) {
  using namespace loom::cuda;
  if (p.access[k] == 0) return p.x[k][i];
  if (p.access[k] == 1) return p.x[k][0];
  i64 j = 0, rem = i;
  for (int d = kFusedRank - 1; d >= 0; --d) {
    j += (rem % p.dims[d]) * p.strides[k][d];
    rem /= p.dims[d];
  }
  return p.x[k][j];
}

// A fused chain, interpreted per element (kernel_args.h).
LOOM_KERNEL fused_elementwise(i64 n, loom::cuda::FusedProgram p) {
  using namespace loom::cuda;
  for (i64 i = first_index(); i < n; i += grid_stride()) {
    float r[kFusedMaxInputs + kFusedMaxSteps];
    for (int k = 0; k < p.inputs; ++k) r[k] = fused_input(p, k, i);
    for (int s = 0; s < p.steps; ++s) {
      const FusedStep& st = p.step[s];
      r[p.inputs + s] = fused_apply(st, r[st.a], st.b >= 0 ? r[st.b] : 0.0f);
    }
    for (int k = 0; k < p.outputs; ++k) p.y[k][i] = r[p.y_reg[k]];
  }
}

// A chain with row reductions over rows of `cols` elements, one warp per row (as
// reduce_rows). Row values are computed once by every lane; each reduction is a pass in
// which lane l computes the full steps before it at elements l, l + 32, ... and adds its
// operand, then the warp's butterfly sum, as reduce_rows adds a row; a last pass computes
// every full step and writes the full outputs. An output holding a row value is
// written once per row.
LOOM_KERNEL fused_rows(i64 rows, i64 cols, float inv_cols, loom::cuda::FusedProgram p) {
  using namespace loom::cuda;
  i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  float r[kFusedMaxInputs + kFusedMaxSteps];
  for (int k = 0; k < p.inputs; ++k)
    if (p.row[k]) r[k] = fused_input(p, k, row * cols);
  int next_row_step = 0;
  for (int phase = 0; phase <= p.steps; ++phase) {
    const bool last = phase == p.steps;
    if (!last && p.step[phase].op != fused_sum && p.step[phase].op != fused_mean) continue;
    for (; next_row_step < phase; ++next_row_step) {
      const FusedStep& st = p.step[next_row_step];
      if (p.row[p.inputs + next_row_step] && st.op != fused_sum && st.op != fused_mean)
        r[p.inputs + next_row_step] = fused_apply(st, r[st.a], st.b >= 0 ? r[st.b] : 0.0f);
    }
    float acc = 0.0f;
    for (i64 j = lane; j < cols; j += 32) {
      const i64 i = row * cols + j;
      for (int k = 0; k < p.inputs; ++k)
        if (!p.row[k]) r[k] = fused_input(p, k, i);
      for (int s = 0; s < phase; ++s) {
        const FusedStep& st = p.step[s];
        if (!p.row[p.inputs + s]) r[p.inputs + s] = fused_apply(st, r[st.a], st.b >= 0 ? r[st.b] : 0.0f);
      }
      if (!last) {
        acc += r[p.step[phase].a];
      } else {
        for (int k = 0; k < p.outputs; ++k)
          if (!p.row[p.y_reg[k]]) p.y[k][i] = r[p.y_reg[k]];
      }
    }
    if (!last) {
      acc = warp_sum(acc);
      r[p.inputs + phase] = p.step[phase].op == fused_mean ? inv_cols * acc : acc * 1.0f;
    }
  }
  if (lane == 0)
    for (int k = 0; k < p.outputs; ++k)
      if (p.row[p.y_reg[k]]) p.y[k][row] = r[p.y_reg[k]];
}

// y[i] = bias[i % cols]: the starting value of a linear layer's output (GEMM adds x w).
LOOM_KERNEL broadcast_rows(const float* bias, float* y, i64 n, i64 cols) {
  for (i64 i = first_index(); i < n; i += grid_stride()) y[i] = bias[i % cols];
}

LOOM_KERNEL to_bf16(const float* x, __nv_bfloat16* y, i64 n) {
  for (i64 i = first_index(); i < n; i += grid_stride()) y[i] = __float2bfloat16_rn(x[i]);
}

// AdamW, decoupled weight decay and bias correction; outputs may alias inputs.
LOOM_KERNEL adamw(const float* p_in, const float* g, const float* m_in, const float* v_in, float* p_out,
                                 float* m_out, float* v_out, i64 n, float b1, float b2, float step_size,
                                 float inv_sqrt_bc2, float decay, float eps) {
  for (i64 i = first_index(); i < n; i += grid_stride()) {
    float gi = g[i];
    float mi = b1 * m_in[i] + (1.0f - b1) * gi;
    float vi = b2 * v_in[i] + (1.0f - b2) * gi * gi;
    float pi = p_in[i];
    m_out[i] = mi;
    v_out[i] = vi;
    p_out[i] = pi * decay - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
  }
}

// ---- layout --------------------------------------------------------------------------

LOOM_KERNEL copy_strided(const float* x, float* y, i64 n, loom::cuda::StridedView view) {
  for (i64 i = first_index(); i < n; i += grid_stride()) {
    i64 rem = i, src = 0;
    for (int d = view.rank - 1; d >= 0; --d) {
      src += (rem % view.shape[d]) * view.stride[d];
      rem /= view.shape[d];
    }
    y[i] = x[src];
  }
}

// dx viewed as [outer, L, inner]; dy as [outer, l, inner] placed at rows [start, start + l).
LOOM_KERNEL slice_backward(const float* dy, float* dx, i64 n, i64 L, i64 l, i64 inner, i64 start) {
  for (i64 i = first_index(); i < n; i += grid_stride()) {
    i64 in = i % inner, a = (i / inner) % L, o = i / (inner * L);
    dx[i] = (a >= start && a < start + l) ? dy[(o * l + (a - start)) * inner + in] : 0.0f;
  }
}

// ---- reductions ------------------------------------------------------------------------

// x viewed as [rows, cols]; one warp per row: y[r] = scale * (sum or max of the row).
LOOM_KERNEL reduce_rows(int is_max, const float* x, float* y, i64 rows, i64 cols, float scale) {
  i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const float* row = x + r * cols;
  float acc = is_max ? -INFINITY : 0.0f;
  for (i64 j = lane; j < cols; j += 32) acc = is_max ? fmaxf(acc, row[j]) : acc + row[j];
  acc = is_max ? warp_max(acc) : warp_sum(acc);
  if (lane == 0) y[r] = acc * scale;
}

// x viewed as [rows, cols]; block (32, 32) owns 32 columns of one chunk of rows,
// [blockIdx.y * chunk, + chunk): y[blockIdx.y, c] = scale * sum of x[r, c] over the chunk.
// With one chunk that is the column sum; with several, the host sums the chunks' rows
// with a second launch (a fixed order either way).
LOOM_KERNEL sum_cols(const float* x, float* y, i64 rows, i64 cols, float scale, i64 chunk) {
  __shared__ float partial[32][33];
  i64 c = (i64)blockIdx.x * 32 + threadIdx.x;
  i64 r0 = (i64)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  float acc = 0.0f;
  if (c < cols)
    for (i64 r = r0 + threadIdx.y; r < r1; r += 32) acc += x[r * cols + c];
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
    for (int k = 0; k < 32; ++k) total += partial[k][threadIdx.x];
    y[(i64)blockIdx.y * cols + c] = total * scale;
  }
}

// partial[block] = sum of squares of a grid-stride share of x (summed again on the host side).
LOOM_KERNEL sum_squares_partial(const float* x, i64 n, float* partial) {
  float acc = 0.0f;
  for (i64 i = first_index(); i < n; i += grid_stride()) acc += x[i] * x[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// ---- token ids -------------------------------------------------------------------------

// Ids are checked on the device (a host check would wait for the stream, four times a
// training step): an id outside [0, limit) is used for nothing, and the first such is
// recorded for the host: fault[0] the op's code (0: none yet; device_ops::IdCheckOp),
// [1] the id's position, [2] the id, [3] the limit. CudaBackend::download reports it.
__device__ __forceinline__ bool id_in_range(int id, i64 limit, int* fault, int op, i64 at) {
  if (id >= 0 && (i64)id < limit) return true;
  if (atomicCAS(fault, 0, op) == 0) {
    fault[1] = (int)at;
    fault[2] = id;
    fault[3] = (int)limit;
  }
  return false;
}

// ---- embedding -------------------------------------------------------------------------

LOOM_KERNEL embedding(const float* w, const int* ids, float* y, i64 n, i64 c, i64 vocab, int* fault) {
  for (i64 i = first_index(); i < n; i += grid_stride()) {
    const i64 t = i / c;
    const int id = ids[t];
    y[i] = id_in_range(id, vocab, fault, 1, t) ? w[(i64)id * c + i % c] : 0.0f;
  }
}

// The backward pass is a deterministic scatter-add in three steps, with no host work: a
// stable counting sort of the token positions by id, then one thread per (id, column)
// summing its tokens' rows in token order, as the CPU does.
// 1. start[id + 1] = how many tokens have that id (start zeroed before; integer atomics,
//    so the counts do not depend on the order they land in).
LOOM_KERNEL embedding_count(const int* ids, int* start, i64 n, i64 vocab, int* fault, int op) {
  for (i64 t = first_index(); t < n; t += grid_stride())
    if (id_in_range(ids[t], vocab, fault, op, t)) atomicAdd(&start[ids[t] + 1], 1);
}

// 2. Inclusive prefix sum of start[0, n) in place, by one block: each thread sums a
//    contiguous chunk, the block scans the chunk totals, then each thread writes its
//    chunk's running sums. Afterwards id v's tokens are [start[v], start[v + 1]).
LOOM_KERNEL scan_counts(int* start, i64 n) {
  __shared__ int totals[1024];
  const i64 threads = blockDim.x, chunk = (n + threads - 1) / threads;
  const i64 lo = threadIdx.x * chunk, hi = lo + chunk < n ? lo + chunk : n;
  int sum = 0;
  for (i64 i = lo; i < hi; ++i) sum += start[i];
  totals[threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.x == 0)
    for (unsigned k = 1; k < blockDim.x; ++k) totals[k] += totals[k - 1];
  __syncthreads();
  int running = threadIdx.x == 0 ? 0 : totals[threadIdx.x - 1];
  for (i64 i = lo; i < hi; ++i) {
    running += start[i];
    start[i] = running;
  }
}

// 3. Token t goes to order[start[id] + r], r the number of earlier tokens with its id, so
//    each id's tokens stay in token order (n^2 / 2 comparisons in all; the threads of a
//    warp read the same earlier ids together).
LOOM_KERNEL embedding_place(const int* ids, const int* start, int* order, i64 n, i64 vocab) {
  for (i64 t = first_index(); t < n; t += grid_stride()) {
    const int id = ids[t];
    if (id < 0 || (i64)id >= vocab) continue;  // recorded by embedding_count
    int rank = 0;
    for (i64 u = 0; u < t; ++u) rank += ids[u] == id;
    order[start[id] + rank] = (int)t;
  }
}

// 4. Grid (vocab rows, column blocks): dw[v, j] = sum of dy[t, j] over id v's tokens, in
//    token order; 0 for an id that never occurs. With base (embedding_backward_add), dw is
//    base plus that sum, as the add of the two ops computes it.
LOOM_KERNEL embedding_backward(const float* dy, const int* order, const int* start, const float* base,
                               float* dw, i64 c) {
  const i64 j = (i64)blockIdx.y * blockDim.x + threadIdx.x;
  if (j >= c) return;
  const i64 v = blockIdx.x;
  float acc = 0.0f;
  for (int k = start[v]; k < start[v + 1]; ++k) acc += dy[(i64)order[k] * c + j];
  dw[v * c + j] = base ? base[v * c + j] + acc : acc;
}

// ---- cross-entropy -----------------------------------------------------------------------

// One block per row, one pass over it: each thread keeps a running maximum m and
// sum s of exp(x - m) (rescaled when m grows), then the block combines them:
// lse = M + log sum_t s_t exp(m_t - M); row_loss = lse - x[target].
LOOM_KERNEL cross_entropy_rows(const float* x, const int* targets, float* lse, float* row_loss, i64 v,
                               int* fault) {
  const i64 r = blockIdx.x;
  const float* row = x + r * v;
  float m = -INFINITY, s = 0.0f;
  for (i64 j = threadIdx.x; j < v; j += blockDim.x) {
    float value = row[j];
    if (value > m) {
      s = s * expf(m - value) + 1.0f;
      m = value;
    } else if (value > -INFINITY) {
      s += expf(value - m);
    }
  }
  const float block_m = block_max(m);
  const float total = block_sum(m > -INFINITY ? s * expf(m - block_m) : 0.0f);
  if (threadIdx.x == 0) {
    float l = block_m + logf(total);
    lse[r] = l;
    const int target = targets[r];
    row_loss[r] = id_in_range(target, v, fault, 3, r) ? l - row[target] : 0.0f;
  }
}

// dx = dloss / N (softmax - onehot)
LOOM_KERNEL cross_entropy_backward(const float* dloss, const float* x, const int* targets,
                                   const float* lse, float* dx, i64 n, i64 v, float inv_n, int* fault) {
  const float g = dloss[0] * inv_n;
  for (i64 i = first_index(); i < n; i += grid_stride()) {
    i64 r = i / v, j = i % v;
    float p = expf(x[i] - lse[r]);
    const int target = targets[r];
    if (j == 0) id_in_range(target, v, fault, 4, r);
    dx[i] = g * (p - (j == target ? 1.0f : 0.0f));
  }
}

// ---- layer norm (one warp per row) ----------------------------------------------------------

LOOM_KERNEL layer_norm_forward(const float* x, const float* w, const float* b, float* y, float* mean,
                                              float* rstd, i64 rows, i64 c, float eps) {
  i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const float* xr = x + r * c;
  float s = 0.0f;
  for (i64 j = lane; j < c; j += 32) s += xr[j];
  const float mu = warp_sum(s) / (float)c;
  float q = 0.0f;
  for (i64 j = lane; j < c; j += 32) {
    float d = xr[j] - mu;
    q += d * d;
  }
  const float rs = rsqrtf(warp_sum(q) / (float)c + eps);
  for (i64 j = lane; j < c; j += 32) y[r * c + j] = (xr[j] - mu) * rs * w[j] + (b ? b[j] : 0.0f);
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w, xhat = (x - mean) rstd.
LOOM_KERNEL layer_norm_backward_rows(const float* dy, const float* x, const float* w, const float* mean,
                                                    const float* rstd, float* dx, i64 rows, i64 c) {
  i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const float mu = mean[r], rs = rstd[r];
  float mg = 0.0f, mgx = 0.0f;
  for (i64 j = lane; j < c; j += 32) {
    float g = dy[r * c + j] * w[j];
    mg += g;
    mgx += g * (x[r * c + j] - mu) * rs;
  }
  mg = warp_sum(mg) / (float)c;
  mgx = warp_sum(mgx) / (float)c;
  for (i64 j = lane; j < c; j += 32) {
    float xhat = (x[r * c + j] - mu) * rs;
    dx[r * c + j] = rs * (dy[r * c + j] * w[j] - mg - xhat * mgx);
  }
}

// dw = sum_rows dy xhat, db = sum_rows dy; block (32, 32) owns 32 columns of one chunk of
// rows (as sum_cols): dw and db get one row of partial sums per chunk.
LOOM_KERNEL layer_norm_backward_cols(const float* dy, const float* x, const float* mean,
                                                    const float* rstd, float* dw, float* db, i64 rows, i64 c, i64 chunk) {
  __shared__ float pw[32][33], pb[32][33];
  i64 j = (i64)blockIdx.x * 32 + threadIdx.x;
  i64 r0 = (i64)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  float sw = 0.0f, sb = 0.0f;
  if (j < c)
    for (i64 r = r0 + threadIdx.y; r < r1; r += 32) {
      float g = dy[r * c + j];
      sw += g * (x[r * c + j] - mean[r]) * rstd[r];
      sb += g;
    }
  pw[threadIdx.y][threadIdx.x] = sw;
  pb[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && j < c) {
    float tw = 0.0f, tb = 0.0f;
    for (int k = 0; k < 32; ++k) {
      tw += pw[k][threadIdx.x];
      tb += pb[k][threadIdx.x];
    }
    dw[(i64)blockIdx.y * c + j] = tw;
    db[(i64)blockIdx.y * c + j] = tb;
  }
}

// ---- attention through cuBLAS ---------------------------------------------------------------
// q, k, v are strided views: row t of head h at x[(b T + t) ld + col0 + h D] (causal_attention's
// fused qkv: ld = 3C and col0 = 0, C, 2C; attention's separate q [B,Tq,H,D] and k, v
// [B,Tk,G,D]: ld = H D or G D, col0 = 0). The host splits them into [B, H, T, D] blocks (a
// key/value head repeated for each of its H/G query heads), multiplies with batched GEMMs,
// and these kernels do the row-wise softmax work between the products.

// x's head h / group  ->  y[B, H, T, D], f32 or (the operand of bf16 products) bf16.
LOOM_KERNEL heads_split(const float* x, void* y, int bf16, i64 n, i64 T, i64 H, i64 D, i64 ld, i64 col0,
                        i64 group) {
  for (i64 i = first_index(); i < n; i += grid_stride()) {
    i64 d = i % D, t = (i / D) % T, h = (i / (D * T)) % H, b = i / (D * T * H);
    float value = x[(b * T + t) * ld + col0 + (h / group) * D + d];
    if (bf16)
      static_cast<__nv_bfloat16*>(y)[i] = __float2bfloat16_rn(value);
    else
      static_cast<float*>(y)[i] = value;
  }
}

// y[B, H, T, D]  ->  x[B, T, ld] columns col0 + g*D + d, each of the G heads the sum of its
// H/G query heads' blocks (G = H: a plain copy).
LOOM_KERNEL heads_merge(const float* y, float* x, i64 n, i64 T, i64 H, i64 G, i64 D, i64 ld, i64 col0) {
  const i64 group = H / G;
  for (i64 i = first_index(); i < n; i += grid_stride()) {
    i64 d = i % D, g = (i / D) % G, t = (i / (D * G)) % T, b = i / (D * G * T);
    float total = 0.0f;
    for (i64 h = g * group; h < (g + 1) * group; ++h) total += y[((b * H + h) * T + t) * D + d];
    x[(b * T + t) * ld + col0 + g * D + d] = total;
  }
}

// Scores, probabilities and their gradients are bf16 under bf16 products, else f32.
__device__ __forceinline__ float load_score(const void* base, i64 index, int bf16) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]) : static_cast<const float*>(base)[index];
}
__device__ __forceinline__ void store_score(void* base, i64 index, float value, int bf16) {
  if (bf16)
    static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(value);
  else
    static_cast<float*>(base)[index] = value;
}

// One chunk of query rows [q0, q0 + rows) of every (batch, head): s is [BH, rows, keys]
// with keys = q0 + rows + offset; local row r is query i = q0 + r % rows, at position
// i + offset (offset = Tk - Tq), seeing keys j <= i + offset. One warp per row, in place:
// p[j] = exp(scale s[j] - m) / sum for the visible j, 0 after (each lane reads its
// elements before writing them); lse[bh, i] = m + log(sum), with lse [BH, T] (T = Tq).
LOOM_KERNEL causal_softmax(void* s, int bf16, float* lse, i64 total_rows, i64 rows, i64 keys, i64 T, i64 q0,
                           i64 offset, float scale) {
  i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r >= total_rows) return;
  const int lane = threadIdx.x & 31;
  const i64 i = q0 + r % rows, last = i + offset, row0 = r * keys;
  float m = -INFINITY;
  for (i64 j = lane; j <= last; j += 32) m = fmaxf(m, load_score(s, row0 + j, bf16) * scale);
  m = warp_max(m);
  float total = 0.0f;
  for (i64 j = lane; j <= last; j += 32) total += expf(load_score(s, row0 + j, bf16) * scale - m);
  total = warp_sum(total);
  const float inv = 1.0f / total;
  for (i64 j = lane; j < keys; j += 32)
    store_score(s, row0 + j, j <= last ? expf(load_score(s, row0 + j, bf16) * scale - m) * inv : 0.0f, bf16);
  if (lane == 0) lse[(r / rows) * T + i] = m + logf(total);
}

// delta[b, h, t] = sum_d dout[b, t, h*D + d] out[b, t, h*D + d]
LOOM_KERNEL attention_delta(const float* dout, const float* out, float* delta, i64 n, i64 T, i64 H,
                                           i64 D) {
  for (i64 idx = first_index(); idx < n; idx += grid_stride()) {
    i64 t = idx % T, h = (idx / T) % H, b = idx / (T * H);
    const float* g = dout + (b * T + t) * H * D + h * D;
    const float* o = out + (b * T + t) * H * D + h * D;
    float acc = 0.0f;
    for (i64 d = 0; d < D; ++d) acc += g[d] * o[d];
    delta[idx] = acc;
  }
}

// One chunk as causal_softmax's, from the recomputed scores s and dp = dO v^T: in place,
// s <- p = exp(scale s - lse) on and below the diagonal (0 above) and
// dp <- ds = scale p (dp - delta), the gradient of the scaled scores.
LOOM_KERNEL attention_backward_scores(void* s, void* dp, int bf16, const float* lse, const float* delta, i64 n,
                                      i64 rows, i64 keys, i64 T, i64 q0, i64 offset, float scale) {
  for (i64 idx = first_index(); idx < n; idx += grid_stride()) {
    i64 j = idx % keys, r = idx / keys, i = q0 + r % rows, stat = (r / rows) * T + i;
    float p = j <= i + offset ? expf(load_score(s, idx, bf16) * scale - lse[stat]) : 0.0f;
    float ds = scale * p * (load_score(dp, idx, bf16) - delta[stat]);
    store_score(s, idx, p, bf16);
    store_score(dp, idx, ds, bf16);
  }
}

// ---- RMSNorm, rotary positions, SiLU and SwiGLU ---------------------------------------------

// One warp per row: rstd = (mean(x^2) + eps)^(-1/2), y = x rstd w.
LOOM_KERNEL rms_norm_forward(const float* x, const float* w, float* y, float* rstd, i64 rows, i64 c, float eps) {
  i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const float* xr = x + r * c;
  float q = 0.0f;
  for (i64 j = lane; j < c; j += 32) q += xr[j] * xr[j];
  const float rs = rsqrtf(warp_sum(q) / (float)c + eps);
  for (i64 j = lane; j < c; j += 32) y[r * c + j] = xr[j] * rs * w[j];
  if (lane == 0) rstd[r] = rs;
}

// dx = rstd (g - xhat mean(g xhat)), g = dy w, xhat = x rstd (one warp per row).
LOOM_KERNEL rms_norm_backward_rows(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                                   i64 rows, i64 c) {
  i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const float rs = rstd[r];
  float mgx = 0.0f;
  for (i64 j = lane; j < c; j += 32) mgx += dy[r * c + j] * w[j] * x[r * c + j] * rs;
  mgx = warp_sum(mgx) / (float)c;
  for (i64 j = lane; j < c; j += 32) dx[r * c + j] = rs * (dy[r * c + j] * w[j] - x[r * c + j] * rs * mgx);
}

// dw = sum_rows dy xhat; block (32, 32) owns 32 columns of one chunk of rows, as
// layer_norm_backward_cols: one row of partial sums per chunk.
LOOM_KERNEL rms_norm_backward_cols(const float* dy, const float* x, const float* rstd, float* dw, i64 rows, i64 c,
                                   i64 chunk) {
  __shared__ float pw[32][33];
  i64 j = (i64)blockIdx.x * 32 + threadIdx.x;
  i64 r0 = (i64)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  float sw = 0.0f;
  if (j < c)
    for (i64 r = r0 + threadIdx.y; r < r1; r += 32) sw += dy[r * c + j] * x[r * c + j] * rstd[r];
  pw[threadIdx.y][threadIdx.x] = sw;
  __syncthreads();
  if (threadIdx.y == 0 && j < c) {
    float tw = 0.0f;
    for (int k = 0; k < 32; ++k) tw += pw[k][threadIdx.x];
    dw[(i64)blockIdx.y * c + j] = tw;
  }
}

// One thread per pair (row of 2 P, i < P): the row's position is (row / N) % T.
LOOM_KERNEL rope(const float* x, const float* cs, const float* sn, float* y, i64 n, i64 T, i64 N, i64 P) {
  for (i64 id = first_index(); id < n; id += grid_stride()) {
    i64 i = id % P, row = id / P, t = (row / N) % T;
    float c = cs[t * P + i], s = sn[t * P + i];
    float a = x[row * 2 * P + i], b = x[row * 2 * P + P + i];
    y[row * 2 * P + i] = a * c - b * s;
    y[row * 2 * P + P + i] = b * c + a * s;
  }
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

LOOM_KERNEL silu(const float* x, float* y, i64 n) {
  for (i64 i = first_index(); i < n; i += grid_stride()) y[i] = x[i] * sigmoidf(x[i]);
}
// dy s (1 + x (1 - s))
LOOM_KERNEL silu_backward(const float* dy, const float* x, float* dx, i64 n) {
  for (i64 i = first_index(); i < n; i += grid_stride()) {
    float s = sigmoidf(x[i]);
    dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}
LOOM_KERNEL swiglu(const float* gate, const float* up, float* y, i64 n) {
  for (i64 i = first_index(); i < n; i += grid_stride()) y[i] = gate[i] * sigmoidf(gate[i]) * up[i];
}
LOOM_KERNEL swiglu_backward(const float* dy, const float* gate, const float* up, float* dgate, float* dup, i64 n) {
  for (i64 i = first_index(); i < n; i += grid_stride()) {
    float g = gate[i], s = sigmoidf(g);
    dgate[i] = dy[i] * up[i] * s * (1.0f + g * (1.0f - s));
    dup[i] = dy[i] * g * s;
  }
}
