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

__kernel void binary(const int op, __global const float* full, const ulong full_off, __global const float* other,
                     const ulong other_off, __global float* c, const ulong c_off, const int mode, const ulong period,
                     const int other_left) {
  size_t i = get_global_id(0);
  ulong j = mode == 0 ? i : mode == 1 ? 0 : mode == 2 ? i % period : i / period;
  float x = full[full_off + i], y = other[other_off + j];
  c[c_off + i] = other_left ? binary_op(op, y, x) : binary_op(op, x, y);
}

float gelu_tanh(const float x) {
  const float k = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanh(k * (x + 0.044715f * x * x * x)));
}

float gelu_tanh_grad(const float x) {
  const float k = 0.7978845608028654f;
  float x2 = x * x;
  float t = tanh(k * (x + 0.044715f * x2 * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * x2);
}

// op: 0 exp, 1 log, 2 tanh, 3 relu, 4 gelu, 5 scale by alpha
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
    default: r = alpha * v; break;
  }
  y[y_off + i] = r;
}

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
