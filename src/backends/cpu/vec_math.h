// backends/cpu/vec_math.h — elementary functions written so GCC vectorises them inside
// `omp simd` loops (std::exp / std::tanh are scalar library calls without -ffast-math).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace loom::cpu {

// sum_{j<n} term(j) with kLanes independent partial sums combined pairwise at the end.
// A single running sum is a chain of dependent adds that the compiler may not reorder
// (no -ffast-math), so it neither vectorises nor pipelines; fixed lanes do both, and the
// order stays fixed, so results are the same on every run. T: float or double.
template <class T = float, class Term>
inline T lanes_sum(std::int64_t n, Term term) {
  constexpr int kLanes = 64 / sizeof(T);  // one AVX-512 register
  T acc[kLanes] = {};
  std::int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l)
      acc[l] += term(j + l);
  }
  T tail = 0;
  for (; j < n; ++j)
    tail += term(j);
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l)
      acc[l] += acc[l + width];
  return acc[0] + tail;
}

// max_{j<n} value(j) (n >= 1), in kLanes fixed lanes like lanes_sum (max is exact in any order).
template <class Value>
inline float lanes_max(std::int64_t n, Value value) {
  constexpr int kLanes = 16;
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l)
    acc[l] = -std::numeric_limits<float>::infinity();
  std::int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) {
      float v = value(j + l);
      acc[l] = acc[l] > v ? acc[l] : v;  // a ternary vectorises; std::max's NaN rules do not
    }
  }
  float m = -std::numeric_limits<float>::infinity();
  for (; j < n; ++j)
    m = m > value(j) ? m : value(j);
  for (int l = 0; l < kLanes; ++l)
    m = m > acc[l] ? m : acc[l];
  return m;
}

// e^x to about 2 ulp (Cephes expf): x = n ln2 + r with |r| <= ln2/2, e^r by a degree-6
// polynomial, 2^n assembled in the exponent bits. Inputs are clamped to the finite range.
inline float exp_approx(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);  // ternaries vectorise; fmin/fmax do not
  float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  auto bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

// tanh(x) = 1 - 2 / (e^{2x} + 1): absolute error ~1e-7, enough where tanh is added to 1
// (GELU); the tanh operator itself keeps std::tanh.
inline float tanh_approx(float x) {
  return 1.0f - 2.0f / (exp_approx(2.0f * x) + 1.0f);
}

// sigmoid(x) = 1 / (1 + e^-x); SiLU is x sigmoid(x), its derivative s (1 + x (1 - s)).
inline float sigmoid_fast(float x) {
  return 1.0f / (1.0f + exp_approx(-x));
}

inline float gelu_fast(float x) {
  constexpr float k = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + tanh_approx(k * (x + 0.044715f * x * x * x)));
}

inline float gelu_grad_fast(float x) {
  constexpr float k = 0.7978845608028654f;
  float x2 = x * x;
  float t = tanh_approx(k * (x + 0.044715f * x2 * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * x2);
}

}  // namespace loom::cpu
