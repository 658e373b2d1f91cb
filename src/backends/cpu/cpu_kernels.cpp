// Fast CPU kernels, part 1: copies, elementwise, reductions, softmax, GEMM, AdamW.
//
// GEMM is oneDNN's dnnl_sgemm (row-major, never hand-written). Loops are
// OpenMP-threaded above a size where threading pays, and written so the compiler vectorises them.
// Shapes a fast path does not handle fall through to the reference kernel.
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/vec_math.h"
#include "core/broadcast.h"
#include "core/error.h"
#include "core/reference_util.h"

namespace loom::cpu {
namespace {

constexpr std::int64_t kParallelGrain = 16384;  // elements below which one thread is faster

// Precision bf16 (set_matmul_precision): matmul and linear round their operands to bf16
// (nearest even) before the f32 GEMM, which is exactly a bf16 x bf16 product with f32
// accumulation, as a GPU's tensor cores compute it. Attention's products stay f32 here.
std::atomic<bool> bf16_operands{false};

// ---- GEMM ----------------------------------------------------------------------
// C[M,N] = alpha op(A) op(B) + beta C, row-major, through oneDNN's dnnl_sgemm. On some
// CPUs it runs a product whose A is transposed at about half the rate of the others
// (bench/RESULTS.md, "GEMM floor": a Zen 3 ran the weight gradients X^T dY at 50-63
// GFLOP/s, every other large product of the step at 100-150). Such a product, when large,
// gets A transposed into a scratch buffer first, one pass over A at memory speed, and
// then runs as the plain product: steps of the small GPT 4-7% faster, interleaved with
// steps without it. Below 2^27 multiply-adds (the tiny GPT's weight gradients) the
// transpose costs what it saves. Only under oneDNN's AVX2 kernels (relayout_by_default).
constexpr std::int64_t kTransposeMinWork = std::int64_t{1} << 27;  // 512^3 multiply-adds

// A plain (untransposed) B whose rows are a multiple of 512 floats (2 KiB) apart, in a
// product of few rows (M < 512), runs at about half the rate: oneDNN then reads B in place
// rather than packing it, and rows 2 KiB apart fall into the same few L1 sets. Measured on
// a Zen 3 with 2 threads (bench/RESULTS.md, "GEMM floor"): the small GPT's fc1 weight
// gradient (M 256, N 1024, K 1024) 78 GFLOP/s with B as it is, 149 with B's rows 16
// floats further apart; products of 512 rows or more, and a transposed B, do not show it.
// Such a product, when large, gets B copied into rows padded by 16 floats first: one pass
// over B at memory speed, 4-6% off the small GPT's step (interleaved steps 161 against 170
// ms, 159 against 170); the tiny GPT's fc1 gradient (M 128, N 512, K 512) gained nothing,
// so the same size threshold as the transpose applies.
constexpr std::int64_t kPadMaxRows = 512;
constexpr std::int64_t kPadStride = 512;  // floats
constexpr std::int64_t kPadFloats = 16;   // one cache line

// Both relayouts work around oneDNN's AVX2 sgemm kernels, the ones a CPU without AVX-512
// runs (the Zen 3 above). Where oneDNN runs its AVX-512 kernels they cost more than they
// save: on an Intel Xeon with AVX-512 (family 6 model 167, 2 threads) the small GPT's step
// took 110.5, 107.6 and 109.5 ms with them against 104.5, 102.1 and 104.1 with every
// product as called (interleaved steps, bench/src/gemm_floor.cpp), and the gpt2-shape step
// 947, 937 and 948 ms against 898, 887 and 878 (bench/RESULTS.md, 2026-12-06). So `auto`
// (the default) relays out only under an ISA below avx512_core; LOOM_CPU_GEMM=relayout
// turns them on everywhere, as_called off everywhere.
bool relayout_by_default() {
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  return (isa & dnnl_cpu_isa_avx512_core) != dnnl_cpu_isa_avx512_core;
}

std::atomic<bool>& transpose_a_setting() {
  static std::atomic<bool> on = [] {
    const char* env = std::getenv("LOOM_CPU_GEMM");
    const std::string v = env == nullptr ? "" : env;
    check(v.empty() || v == "as_called" || v == "auto" || v == "relayout", [&] {
      return "LOOM_CPU_GEMM = '" + v + "', expected auto (the default), relayout or as_called";
    });
    return v == "relayout" || (v != "as_called" && relayout_by_default());
  }();
  return on;
}

// bp[l * (n + kPadFloats) + j] = b[l * ldb + j] for l < k, j < n: B with its rows padded.
void pad_into(const float* b, std::int64_t ldb, std::int64_t k, std::int64_t n, float* bp) {
#pragma omp parallel for schedule(static) if (k * n > kParallelGrain)
  for (std::int64_t l = 0; l < k; ++l)
    std::memcpy(bp + l * (n + kPadFloats), b + l * ldb,
                static_cast<std::size_t>(n) * sizeof(float));
}

// at[i * k + l] = a[l * lda + i] for i < m, l < k: op(A) = A^T laid out row-major, through
// a 64 x 64 tile per thread (one padding column, so that the rows a tile reads, often a
// power of two apart, do not share cache sets): about 20 GB/s on two cores, against 4
// for the direct loop.
void transpose_into(const float* a, std::int64_t lda, std::int64_t m, std::int64_t k, float* at) {
  constexpr std::int64_t kTile = 64;
#pragma omp parallel for schedule(static) if (m * k > kParallelGrain)
  for (std::int64_t i0 = 0; i0 < m; i0 += kTile)
    for (std::int64_t l0 = 0; l0 < k; l0 += kTile) {
      float tile[kTile][kTile + 1];
      const std::int64_t i1 = std::min(m, i0 + kTile), l1 = std::min(k, l0 + kTile);
      for (std::int64_t l = l0; l < l1; ++l)
        for (std::int64_t i = i0; i < i1; ++i)
          tile[i - i0][l - l0] = a[l * lda + i];
      for (std::int64_t i = i0; i < i1; ++i)
        for (std::int64_t l = l0; l < l1; ++l)
          at[i * k + l] = tile[i - i0][l - l0];
    }
}

std::atomic<std::vector<GemmRecord>*> gemm_recorder{nullptr};
std::mutex gemm_recorder_mutex;

void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
           std::int64_t ldc) {
  if (m == 0 || n == 0)
    return;
  if (k == 0) {
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  std::vector<GemmRecord>* recorder = gemm_recorder.load(std::memory_order_relaxed);
  const std::int64_t record_lda = lda, record_ldb = ldb;  // as called, before any relayout
  const auto start =
      recorder ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  // Inside a parallel region (attention's per-head products) the products are small and
  // run one per thread: they stay as called.
  const bool relayout = !omp_in_parallel() && transpose_a_setting().load(std::memory_order_relaxed);
  const bool transpose = relayout && trans_a && m * n * k >= kTransposeMinWork;
  const bool pad = relayout && !trans_b && m < kPadMaxRows && ldb % kPadStride == 0 &&
                   m * n * k >= kTransposeMinWork;
  if (transpose) {
    thread_local std::vector<float> at;
    at.resize(static_cast<std::size_t>(m * k));
    transpose_into(a, lda, m, k, at.data());
    a = at.data();
    lda = k;
  }
  if (pad) {
    thread_local std::vector<float> bp;
    bp.resize(static_cast<std::size_t>(k * (n + kPadFloats)));
    pad_into(b, ldb, k, n, bp.data());
    b = bp.data();
    ldb = n + kPadFloats;
  }
  const dnnl_status_t status = dnnl_sgemm(trans_a && !transpose ? 'T' : 'N', trans_b ? 'T' : 'N', m,
                                          n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  check(status == dnnl_success,
        [&] { return "cpu: dnnl_sgemm failed with status " + std::to_string(status); });
  if (recorder) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard lock(gemm_recorder_mutex);
    recorder->push_back({trans_a, trans_b, m, n, k, record_lda, record_ldb, ldc, alpha, beta,
                         transpose, pad, omp_in_parallel() != 0, seconds});
  }
}

}  // namespace

void set_bf16_operands(bool on) {
  bf16_operands.store(on);
}

void record_gemms(std::vector<GemmRecord>* records) {
  gemm_recorder.store(records);
}

void set_gemm_transpose(bool on) {
  transpose_a_setting().store(on);
}

bool gemm_transpose() {
  return transpose_a_setting().load();
}

// Shared with cpu_nn_kernels.cpp.
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
  sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

namespace {

const float* operand(const Tensor& t, std::vector<float>& rounded) {
  const float* p = t.data<float>();
  if (!bf16_operands.load(std::memory_order_relaxed))
    return p;
  rounded.resize(static_cast<std::size_t>(t.numel()));
  std::int64_t n = t.numel();
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i)
    rounded[i] = bf16_to_float(float_to_bf16(p[i]));
  return rounded.data();
}

void matmul(const OpCall& call) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  Tensor& c = call.outputs[0];
  bool ta = call.attrs.trans_a, tb = call.attrs.trans_b;
  std::int64_t m = c.dim(-2), n = c.dim(-1), k = ta ? a.dim(-2) : a.dim(-1);
  std::int64_t lda = a.dim(-1), ldb = b.dim(-1);
  std::vector<float> a_rounded, b_rounded;
  const float* pa = operand(a, a_rounded);
  const float* pb = operand(b, b_rounded);
  float* pc = c.data<float>();
  if (b.rank() == 2 && !ta) {  // [..., M, K] x [K, N]: one GEMM with the batch folded into M
    sgemm(false, tb, c.numel() / std::max<std::int64_t>(n, 1), n, k, 1.0f, pa, lda, pb, ldb, 0.0f,
          pc, n);
    return;
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> offsets =
      matmul_batch_offsets(a.shape(), b.shape(), c.shape());
  std::int64_t count = static_cast<std::int64_t>(offsets.size());
  // Many small products: one GEMM per thread at a time. Otherwise call oneDNN from
  // outside any parallel region, so that it threads each product itself (inside a
  // region, even an inactive one, it runs single-threaded).
  bool small = m * n * k < 64 * 64 * 64;
  if (small && count > 1) {
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < count; ++i)
      sgemm(ta, tb, m, n, k, 1.0f, pa + offsets[i].first, lda, pb + offsets[i].second, ldb, 0.0f,
            pc + i * m * n, n);
  } else {
    for (std::int64_t i = 0; i < count; ++i)
      sgemm(ta, tb, m, n, k, 1.0f, pa + offsets[i].first, lda, pb + offsets[i].second, ldb, 0.0f,
            pc + i * m * n, n);
  }
}

void linear(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  const float* bias = call.inputs[2].data<float>();
  Tensor& y = call.outputs[0];
  std::int64_t n = y.dim(-1), k = x.dim(-1), rows = y.numel() / std::max<std::int64_t>(n, 1);
  float* py = y.data<float>();
#pragma omp parallel for schedule(static) if (rows * n > kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r)
    std::memcpy(py + r * n, bias, n * sizeof(float));
  std::int64_t ldw = call.inputs[1].dim(1);
  std::vector<float> x_rounded, w_rounded;
  sgemm(false, call.attrs.trans_b, rows, n, k, 1.0f, operand(x, x_rounded), k,
        operand(call.inputs[1], w_rounded), ldw, 1.0f, py, n);
}

// ---- copies ----------------------------------------------------------------------
void copy(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  std::size_t esize = dtype_size(x.dtype());
  auto* src = static_cast<const std::byte*>(x.device_address());
  auto* dst = static_cast<std::byte*>(y.device_address());
  if (x.is_contiguous()) {
    std::memcpy(dst, src, x.nbytes());
    return;
  }
  if (x.rank() == 0 || x.numel() == 0) {
    reference::copy(call);
    return;
  }
  // Copy row by row: the innermost dimension is one run when its stride is 1.
  std::int64_t inner = x.dim(-1);
  std::int64_t rows = x.numel() / inner;
  bool unit = x.strides().back() == 1;
  Shape outer_shape(x.shape().begin(), x.shape().end() - 1);
  Strides outer_strides(x.strides().begin(), x.strides().end() - 1);
  std::int64_t inner_stride = x.strides().back();
#pragma omp parallel for schedule(static) if (x.numel() > kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t rem = r, offset = 0;
    for (std::size_t d = outer_shape.size(); d-- > 0;) {
      offset += (rem % outer_shape[d]) * outer_strides[d];
      rem /= outer_shape[d];
    }
    if (unit) {
      std::memcpy(dst + r * inner * esize, src + offset * esize, inner * esize);
    } else if (esize == 4) {
      auto* d32 = reinterpret_cast<std::uint32_t*>(dst) + r * inner;
      auto* s32 = reinterpret_cast<const std::uint32_t*>(src) + offset;
      for (std::int64_t j = 0; j < inner; ++j)
        d32[j] = s32[j * inner_stride];
    } else {
      for (std::int64_t j = 0; j < inner; ++j)
        std::memcpy(dst + (r * inner + j) * esize, src + (offset + j * inner_stride) * esize,
                    esize);
    }
  }
}

void slice_backward(const OpCall& call) {
  // dx viewed as [outer, L, inner] is zero except rows [start, start + l) of each block.
  const Tensor& dy = call.inputs[0];
  Tensor& dx = call.outputs[0];
  int axis = normalize_axis(call.attrs.axis, dx.rank(), "slice_backward");
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d)
    outer *= dx.shape()[d];
  for (int d = axis + 1; d < dx.rank(); ++d)
    inner *= dx.shape()[d];
  std::int64_t full = dx.shape()[axis] * inner, part = dy.shape()[axis] * inner,
               at = call.attrs.start * inner;
  float* out = dx.data<float>();
  const float* in = dy.data<float>();
  if (part != full)
    std::memset(out, 0, dx.nbytes());
  for (std::int64_t o = 0; o < outer; ++o)
    std::memcpy(out + o * full + at, in + o * part, part * sizeof(float));
}

void fill(const OpCall& call) {
  Tensor& y = call.outputs[0];
  if (y.dtype() != DType::f32) {
    reference::fill(call);
    return;
  }
  float value = static_cast<float>(call.attrs.alpha);
  float* p = y.data<float>();
  std::int64_t n = y.numel();
  if (value == 0.0f) {
    std::memset(p, 0, n * sizeof(float));
    return;
  }
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i)
    p[i] = value;
}

// ---- elementwise -----------------------------------------------------------------
// c = f(a, b) where `full` has c's shape and `other` repeats inside it as `rep` says;
// `other_left` tells whether `other` is f's first argument (sub and div are not symmetric).
template <bool OtherLeft, class F>
bool broadcast_loop(const float* full, const float* other, Repeat rep, float* pc, std::int64_t n,
                    F f) {
  auto apply = [&](float x, float y) { return OtherLeft ? f(y, x) : f(x, y); };
  switch (rep.kind) {
    case Repeat::same:
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
      for (std::int64_t i = 0; i < n; ++i)
        pc[i] = apply(full[i], other[i]);
      return true;
    case Repeat::scalar: {
      float s = other[0];
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
      for (std::int64_t i = 0; i < n; ++i)
        pc[i] = apply(full[i], s);
      return true;
    }
    case Repeat::trailing: {
      std::int64_t period = rep.period, rows = n / period;
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
      for (std::int64_t r = 0; r < rows; ++r) {
#pragma omp simd
        for (std::int64_t j = 0; j < period; ++j)
          pc[r * period + j] = apply(full[r * period + j], other[j]);
      }
      return true;
    }
    case Repeat::per_row: {
      std::int64_t inner = rep.period, rows = n / inner;
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
      for (std::int64_t r = 0; r < rows; ++r) {
        float v = other[r];
#pragma omp simd
        for (std::int64_t j = 0; j < inner; ++j)
          pc[r * inner + j] = apply(full[r * inner + j], v);
      }
      return true;
    }
    case Repeat::other:
      return false;
  }
  return false;
}

template <class F>
bool binary_fast(const OpCall& call, F f) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  Tensor& c = call.outputs[0];
  Repeat ra = classify_broadcast(a.shape(), c.shape()),
         rb = classify_broadcast(b.shape(), c.shape());
  if (ra.kind == Repeat::same)
    return broadcast_loop<false>(a.data<float>(), b.data<float>(), rb, c.data<float>(), c.numel(),
                                 f);
  if (rb.kind == Repeat::same)
    return broadcast_loop<true>(b.data<float>(), a.data<float>(), ra, c.data<float>(), c.numel(),
                                f);
  return false;
}

#define LOOM_BINARY(name, expr)                     \
  void name(const OpCall& call) {                   \
    auto f = [](float a, float b) { return expr; }; \
    if (!binary_fast(call, f))                      \
      reference::name(call);                        \
  }
LOOM_BINARY(add, a + b)
LOOM_BINARY(sub, a - b)
LOOM_BINARY(mul, a* b)
LOOM_BINARY(div, a / b)
#undef LOOM_BINARY

template <class F>
void unary_fast(const OpCall& call, F f) {
  const float* x = call.inputs[0].data<float>();
  float* y = call.outputs[0].data<float>();
  std::int64_t n = call.inputs[0].numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i)
    y[i] = f(x[i]);
}

template <class F>
void pairwise_fast(const OpCall& call, F f) {
  const float* a = call.inputs[0].data<float>();
  const float* b = call.inputs[1].data<float>();
  float* y = call.outputs[0].data<float>();
  std::int64_t n = call.inputs[0].numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i)
    y[i] = f(a[i], b[i]);
}

void scale(const OpCall& call) {
  float alpha = static_cast<float>(call.attrs.alpha);
  unary_fast(call, [alpha](float x) { return alpha * x; });
}
void exp(const OpCall& call) {
  unary_fast(call, [](float x) { return std::exp(x); });
}
void log(const OpCall& call) {
  unary_fast(call, [](float x) { return std::log(x); });
}
void tanh(const OpCall& call) {
  unary_fast(call, [](float x) { return std::tanh(x); });
}
void relu(const OpCall& call) {
  unary_fast(call, [](float x) { return x > 0.0f ? x : 0.0f; });
}
void gelu(const OpCall& call) {
  unary_fast(call, [](float x) { return gelu_fast(x); });
}
void silu(const OpCall& call) {
  unary_fast(call, [](float x) { return x * sigmoid_fast(x); });
}
void silu_backward(const OpCall& call) {
  pairwise_fast(call, [](float dy, float x) {
    float s = sigmoid_fast(x);
    return dy * s * (1.0f + x * (1.0f - s));
  });
}
void swiglu(const OpCall& call) {
  pairwise_fast(call, [](float gate, float up) { return gate * sigmoid_fast(gate) * up; });
}
void swiglu_backward(const OpCall& call) {
  const float* dy = call.inputs[0].data<float>();
  const float* gate = call.inputs[1].data<float>();
  const float* up = call.inputs[2].data<float>();
  float* dgate = call.outputs[0].data<float>();
  float* dup = call.outputs[1].data<float>();
  std::int64_t n = call.inputs[0].numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) {
    float g = gate[i], s = sigmoid_fast(g);
    dgate[i] = dy[i] * up[i] * s * (1.0f + g * (1.0f - s));
    dup[i] = dy[i] * g * s;
  }
}
void relu_backward(const OpCall& call) {
  pairwise_fast(call, [](float dy, float x) { return x > 0.0f ? dy : 0.0f; });
}
void gelu_backward(const OpCall& call) {
  pairwise_fast(call, [](float dy, float x) { return dy * gelu_grad_fast(x); });
}
void tanh_backward(const OpCall& call) {
  pairwise_fast(call, [](float dy, float y) { return dy * (1.0f - y * y); });
}

void dropout(const OpCall& call) {
  const float* x = call.inputs[0].data<float>();
  float* y = call.outputs[0].data<float>();
  std::int64_t n = call.inputs[0].numel();
  float p = static_cast<float>(call.attrs.p);
  float keep_scale = 1.0f / (1.0f - p);
  std::uint64_t seed = call.attrs.seed;
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i)
    y[i] = dropout_uniform(seed, static_cast<std::uint64_t>(i)) >= p ? x[i] * keep_scale : 0.0f;
}

// ---- reductions ------------------------------------------------------------------
// Fast paths for reducing a prefix of axes (column sums, e.g. bias gradients) or a
// suffix (row sums); other axis sets use the reference kernel.
bool sum_fast(const OpCall& call, double divide_by_count) {
  const Tensor& x = call.inputs[0];
  std::vector<bool> reduce(x.rank(), call.attrs.axes.empty());
  for (auto a : call.attrs.axes)
    reduce[normalize_axis(a, x.rank(), "sum")] = true;
  int split = 0;
  while (split < x.rank() && reduce[split])
    ++split;
  bool prefix = std::all_of(reduce.begin() + split, reduce.end(), [](bool r) { return !r; });
  int kept_lead = 0;
  while (kept_lead < x.rank() && !reduce[kept_lead])
    ++kept_lead;
  bool suffix = std::all_of(reduce.begin() + kept_lead, reduce.end(), [](bool r) { return r; });
  const float* px = x.data<float>();
  float* py = call.outputs[0].data<float>();
  if (prefix) {  // [rows, cols] -> [cols]
    std::int64_t rows = 1;
    for (int d = 0; d < split; ++d)
      rows *= x.shape()[d];
    std::int64_t cols = rows == 0 ? call.outputs[0].numel() : x.numel() / rows;
    float inv = divide_by_count ? static_cast<float>(1.0 / std::max<std::int64_t>(rows, 1)) : 1.0f;
    int threads = cols >= 256 && rows * cols > kParallelGrain ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(threads)
    {
      int t = omp_get_thread_num(), nt = omp_get_num_threads();
      std::int64_t begin = cols * t / nt, end = cols * (t + 1) / nt;
      std::vector<double> acc(end - begin, 0.0);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = begin; j < end; ++j)
          acc[j - begin] += px[r * cols + j];
      for (std::int64_t j = begin; j < end; ++j)
        py[j] = static_cast<float>(acc[j - begin] * inv);
    }
    return true;
  }
  if (suffix) {  // [rows, cols] -> [rows]
    std::int64_t rows = 1;
    for (int d = 0; d < kept_lead; ++d)
      rows *= x.shape()[d];
    std::int64_t cols = rows == 0 ? 0 : x.numel() / rows;
    float inv = divide_by_count ? static_cast<float>(1.0 / std::max<std::int64_t>(cols, 1)) : 1.0f;
#pragma omp parallel for schedule(static) if (x.numel() > kParallelGrain)
    for (std::int64_t r = 0; r < rows; ++r) {
      double acc = 0.0;
      for (std::int64_t j = 0; j < cols; ++j)
        acc += px[r * cols + j];
      py[r] = static_cast<float>(acc * inv);
    }
    return true;
  }
  return false;
}

void sum(const OpCall& call) {
  if (!sum_fast(call, false))
    reference::sum(call);
}
void mean(const OpCall& call) {
  if (!sum_fast(call, true))
    reference::mean(call);
}

void sum_squares(const OpCall& call) {
  const float* x = call.inputs[0].data<float>();
  std::int64_t n = call.inputs[0].numel();
  // Fixed chunks, each summed in double lanes, then the chunks in order: the same
  // result whatever the thread count.
  constexpr std::int64_t kChunk = 1 << 16;
  std::int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<std::size_t>(chunks));
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (std::int64_t ch = 0; ch < chunks; ++ch) {
    const float* p = x + ch * kChunk;
    partial[ch] = lanes_sum<double>(std::min(kChunk, n - ch * kChunk), [&](std::int64_t i) {
      return static_cast<double>(p[i]) * p[i];
    });
  }
  double acc = 0.0;
  for (double v : partial)
    acc += v;
  call.outputs[0].data<float>()[0] = static_cast<float>(acc);
}

// ---- softmax family (rows of the last axis) ---------------------------------------
template <class RowFn>
void rows_parallel(const OpCall& call, RowFn f) {
  const Tensor& x = call.inputs[0];
  std::int64_t cols = x.rank() == 0 ? 1 : x.dim(-1);
  std::int64_t rows = cols == 0 ? 0 : x.numel() / cols;
#pragma omp parallel for schedule(static) if (x.numel() > kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r)
    f(r * cols, cols);
}

void softmax(const OpCall& call) {
  const float* x = call.inputs[0].data<float>();
  float* y = call.outputs[0].data<float>();
  rows_parallel(call, [&](std::int64_t at, std::int64_t n) {
    float m = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < n; ++j)
      m = std::max(m, x[at + j]);
    float s = 0.0f;
    for (std::int64_t j = 0; j < n; ++j) {
      y[at + j] = std::exp(x[at + j] - m);
      s += y[at + j];
    }
    float inv = 1.0f / s;
    for (std::int64_t j = 0; j < n; ++j)
      y[at + j] *= inv;
  });
}

void softmax_backward(const OpCall& call) {
  const float* dy = call.inputs[0].data<float>();
  const float* y = call.inputs[1].data<float>();
  float* dx = call.outputs[0].data<float>();
  rows_parallel(call, [&](std::int64_t at, std::int64_t n) {
    float dot = 0.0f;
    for (std::int64_t j = 0; j < n; ++j)
      dot += dy[at + j] * y[at + j];
    for (std::int64_t j = 0; j < n; ++j)
      dx[at + j] = y[at + j] * (dy[at + j] - dot);
  });
}

void log_softmax(const OpCall& call) {
  const float* x = call.inputs[0].data<float>();
  float* y = call.outputs[0].data<float>();
  rows_parallel(call, [&](std::int64_t at, std::int64_t n) {
    float m = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < n; ++j)
      m = std::max(m, x[at + j]);
    float s = 0.0f;
    for (std::int64_t j = 0; j < n; ++j)
      s += std::exp(x[at + j] - m);
    float lse = m + std::log(s);
    for (std::int64_t j = 0; j < n; ++j)
      y[at + j] = x[at + j] - lse;
  });
}

void log_softmax_backward(const OpCall& call) {
  const float* dy = call.inputs[0].data<float>();
  const float* y = call.inputs[1].data<float>();
  float* dx = call.outputs[0].data<float>();
  rows_parallel(call, [&](std::int64_t at, std::int64_t n) {
    float total = 0.0f;
    for (std::int64_t j = 0; j < n; ++j)
      total += dy[at + j];
    for (std::int64_t j = 0; j < n; ++j)
      dx[at + j] = dy[at + j] - std::exp(y[at + j]) * total;
  });
}

// ---- optimizer -------------------------------------------------------------------
void adamw_step(const OpCall& call) {
  const Attrs& a = call.attrs;
  const float* param_in = call.inputs[0].data<float>();
  const float* g = call.inputs[1].data<float>();
  const float* m_in = call.inputs[2].data<float>();
  const float* v_in = call.inputs[3].data<float>();
  float* p = call.outputs[0].data<float>();
  float* m = call.outputs[1].data<float>();
  float* v = call.outputs[2].data<float>();
  std::int64_t n = call.inputs[0].numel();
  const float b1 = static_cast<float>(a.beta1), b2 = static_cast<float>(a.beta2);
  const float step_size =
      static_cast<float>(a.lr / (1.0 - std::pow(a.beta1, static_cast<double>(a.step))));
  const float inv_sqrt_bc2 =
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(a.beta2, static_cast<double>(a.step))));
  const float decay = static_cast<float>(1.0 - a.lr * a.weight_decay);
  const float eps = static_cast<float>(a.eps);
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) {
    float mi = b1 * m_in[i] + (1.0f - b1) * g[i];
    float vi = b2 * v_in[i] + (1.0f - b2) * g[i] * g[i];
    m[i] = mi;
    v[i] = vi;
    p[i] = param_in[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

}  // namespace

void register_elementwise_kernels(std::array<KernelFn, kNumOps>& table) {
  auto set = [&](OpId op, KernelFn fn) { table[static_cast<std::size_t>(op)] = fn; };
  set(OpId::matmul, matmul);
  set(OpId::linear, linear);
  set(OpId::copy, copy);
  set(OpId::fill, fill);
  set(OpId::slice_backward, slice_backward);
  set(OpId::add, add);
  set(OpId::sub, sub);
  set(OpId::mul, mul);
  set(OpId::div, div);
  set(OpId::scale, scale);
  set(OpId::exp, exp);
  set(OpId::log, log);
  set(OpId::tanh, tanh);
  set(OpId::relu, relu);
  set(OpId::gelu, gelu);
  set(OpId::silu, silu);
  set(OpId::silu_backward, silu_backward);
  set(OpId::swiglu, swiglu);
  set(OpId::swiglu_backward, swiglu_backward);
  set(OpId::relu_backward, relu_backward);
  set(OpId::gelu_backward, gelu_backward);
  set(OpId::tanh_backward, tanh_backward);
  set(OpId::dropout, dropout);
  set(OpId::dropout_backward, dropout);
  set(OpId::sum, sum);
  set(OpId::mean, mean);
  set(OpId::sum_squares, sum_squares);
  set(OpId::softmax, softmax);
  set(OpId::softmax_backward, softmax_backward);
  set(OpId::log_softmax, log_softmax);
  set(OpId::log_softmax_backward, log_softmax_backward);
  set(OpId::adamw_step, adamw_step);
}

}  // namespace loom::cpu
