// Loom's GEMM kernels for OpenCL CPU devices (gemm_nt, gemm_nn, gemm_tn), shared by the
// backend's program (kernels.cl follows this file) and by the programs generated for a
// product and the elementwise chain that reads it (matmul_elementwise, opencl_fusion.cpp).
//
// How a kernel writes each element of the product is a hook: LOOM_GEMM_STORE(index, col,
// value) for one element, LOOM_GEMM_STORE8(index, col, value) for eight in a row, where
// `index` is the element's position in this launch's output (c_off + index in the output
// as a whole) and `col` its column; LOOM_GEMM_EXTRA_ARGS are the kernel's arguments after
// c_off. A program that defines none gets C itself, with linear's bias (has_bias) added
// after the sum over k, as matmul followed by add computes it: the same bits. A generated
// program defines them to run the chain on each value instead of storing it.
#ifndef LOOM_GEMM_STORE
#define LOOM_GEMM_EXTRA_ARGS , __global const float *bias, const ulong bias_off, const int has_bias
#define LOOM_GEMM_STORE(index, col, value) \
  do {                                     \
    float v_ = (value);                    \
    if (has_bias)                          \
      v_ += bias[bias_off + (col)];        \
    c[c_off + (index)] = v_;               \
  } while (0)
#define LOOM_GEMM_STORE8(index, col, value)             \
  do {                                                  \
    float8 v_ = (value);                                \
    if (has_bias)                                       \
      v_ += vload8(0, bias + bias_off + (col));         \
    vstore8(v_, 0, c + c_off + (index));                \
  } while (0)
#endif

// C[batch][i][j] = sum over k of A[batch][i][k] B[batch][j][k]: both operands read along
// k, rows contiguous (the caller lays a transposed operand out so). This is the GEMM for
// CPU devices: their OpenCL compiler turns the eight-wide loads into vector code, where
// a GPU-shaped tiled kernel runs at a few GFLOP/s. Each work-item computes rows i0..i0+3
// of column j. The sum order is fixed on every device: per row, eight partial sums
// (k mod 8, each an fma chain in k order), added as (l0+l4 + l2+l6) + (l1+l5 + l3+l7),
// then the k mod 8 tail in order.
float sum_lanes(float8 v) {
  const float4 s = v.lo + v.hi;
  const float2 t = s.lo + s.hi;
  return t.x + t.y;
}
__kernel void gemm_nt(const int M, const int N, const int K, __global const float* a,
                      const ulong a_off, const ulong a_batch, __global const float* b,
                      const ulong b_off, const ulong b_batch, __global float* c,
                      const ulong c_off LOOM_GEMM_EXTRA_ARGS) {
  const int j = get_global_id(0), i0 = get_global_id(1) * 4;
  const ulong batch = get_global_id(2);
  if (j >= N || i0 >= M)
    return;
  // Rows past M read row M - 1 (in bounds) and are not written.
  const int i1 = min(i0 + 1, M - 1), i2 = min(i0 + 2, M - 1), i3 = min(i0 + 3, M - 1);
  __global const float* a0 = a + a_off + batch * a_batch + (ulong)i0 * K;
  __global const float* a1 = a + a_off + batch * a_batch + (ulong)i1 * K;
  __global const float* a2 = a + a_off + batch * a_batch + (ulong)i2 * K;
  __global const float* a3 = a + a_off + batch * a_batch + (ulong)i3 * K;
  __global const float* bj = b + b_off + batch * b_batch + (ulong)j * K;
  float8 s0 = (float8)(0.0f), s1 = s0, s2 = s0, s3 = s0;
  const int k8 = K & ~7;
  for (int k = 0; k < k8; k += 8) {
    const float8 bv = vload8(0, bj + k);
    s0 = fma(vload8(0, a0 + k), bv, s0);
    s1 = fma(vload8(0, a1 + k), bv, s1);
    s2 = fma(vload8(0, a2 + k), bv, s2);
    s3 = fma(vload8(0, a3 + k), bv, s3);
  }
  float c0 = sum_lanes(s0), c1 = sum_lanes(s1), c2 = sum_lanes(s2), c3 = sum_lanes(s3);
  for (int k = k8; k < K; ++k) {
    const float bv = bj[k];
    c0 = fma(a0[k], bv, c0);
    c1 = fma(a1[k], bv, c1);
    c2 = fma(a2[k], bv, c2);
    c3 = fma(a3[k], bv, c3);
  }
  const ulong at = batch * (ulong)M * N + (ulong)i0 * N + j;
  LOOM_GEMM_STORE(at, j, c0);
  if (i0 + 1 < M)
    LOOM_GEMM_STORE(at + N, j, c1);
  if (i0 + 2 < M)
    LOOM_GEMM_STORE(at + 2 * (ulong)N, j, c2);
  if (i0 + 3 < M)
    LOOM_GEMM_STORE(at + 3 * (ulong)N, j, c3);
}

// C[batch][i][j] = sum over k of A(i, k) B[batch][k][j] with B read along its rows (the
// weight of a forward product, [K, N] as stored): each work-item computes rows i0..i0+3
// of columns j0..j0+7, one eight-wide load of B's row k and one value of A per row and
// k, a fused multiply-add chain over k in order (a fixed sum order on every device).
// A(i, k) is a[i * K + k], or a[k * M + i] for the transposed kernel (gemm_tn). Columns
// past the last multiple of eight go one at a time.
#define LOOM_GEMM_NN(NAME, A_AT)                                                         \
  __kernel void NAME(const int M, const int N, const int K, __global const float* a,     \
                     const ulong a_off, const ulong a_batch, __global const float* b,    \
                     const ulong b_off, const ulong b_batch, __global float* c,          \
                     const ulong c_off LOOM_GEMM_EXTRA_ARGS) {                           \
    const int j0 = get_global_id(0) * 8, i0 = get_global_id(1) * 4;                      \
    const ulong batch = get_global_id(2);                                                \
    if (j0 >= N || i0 >= M)                                                              \
      return;                                                                            \
    const int i1 = min(i0 + 1, M - 1), i2 = min(i0 + 2, M - 1), i3 = min(i0 + 3, M - 1); \
    a += a_off + batch * a_batch;                                                        \
    b += b_off + batch * b_batch;                                                        \
    const ulong at = batch * (ulong)M * N + (ulong)i0 * N;                               \
    if (j0 + 8 <= N) {                                                                   \
      float8 s0 = (float8)(0.0f), s1 = s0, s2 = s0, s3 = s0;                             \
      for (int k = 0; k < K; ++k) {                                                      \
        const float8 bv = vload8(0, b + (ulong)k * N + j0);                              \
        s0 = fma((float8)(A_AT(i0, k)), bv, s0);                                         \
        s1 = fma((float8)(A_AT(i1, k)), bv, s1);                                         \
        s2 = fma((float8)(A_AT(i2, k)), bv, s2);                                         \
        s3 = fma((float8)(A_AT(i3, k)), bv, s3);                                         \
      }                                                                                  \
      LOOM_GEMM_STORE8(at + j0, j0, s0);                                                 \
      if (i0 + 1 < M)                                                                    \
        LOOM_GEMM_STORE8(at + N + j0, j0, s1);                                           \
      if (i0 + 2 < M)                                                                    \
        LOOM_GEMM_STORE8(at + 2 * (ulong)N + j0, j0, s2);                                \
      if (i0 + 3 < M)                                                                    \
        LOOM_GEMM_STORE8(at + 3 * (ulong)N + j0, j0, s3);                                \
      return;                                                                            \
    }                                                                                    \
    for (int j = j0; j < N; ++j) {                                                       \
      float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;                                  \
      for (int k = 0; k < K; ++k) {                                                      \
        const float bv = b[(ulong)k * N + j];                                            \
        s0 = fma(A_AT(i0, k), bv, s0);                                                   \
        s1 = fma(A_AT(i1, k), bv, s1);                                                   \
        s2 = fma(A_AT(i2, k), bv, s2);                                                   \
        s3 = fma(A_AT(i3, k), bv, s3);                                                   \
      }                                                                                  \
      LOOM_GEMM_STORE(at + j, j, s0);                                                    \
      if (i0 + 1 < M)                                                                    \
        LOOM_GEMM_STORE(at + N + j, j, s1);                                              \
      if (i0 + 2 < M)                                                                    \
        LOOM_GEMM_STORE(at + 2 * (ulong)N + j, j, s2);                                   \
      if (i0 + 3 < M)                                                                    \
        LOOM_GEMM_STORE(at + 3 * (ulong)N + j, j, s3);                                   \
    }                                                                                    \
  }
#define LOOM_A_ROWS(i, k) a[(ulong)(i)*K + (k)]
#define LOOM_A_COLUMNS(i, k) a[(ulong)(k)*M + (i)]
LOOM_GEMM_NN(gemm_nn, LOOM_A_ROWS)
LOOM_GEMM_NN(gemm_tn, LOOM_A_COLUMNS)
