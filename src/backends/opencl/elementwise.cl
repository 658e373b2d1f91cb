// Elementwise functions shared by Loom's OpenCL kernels (kernels.cl) and the kernels
// generated for fused chains (opencl_fusion.cpp, fused_source): both programs are
// compiled with this text first, so a fused chain computes what the unfused kernels do.

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

// erf in single precision without a library call: the OpenCL library's erf is a scalar
// call on CPU devices (PoCL) that keeps the work-group loop from vectorizing and cost
// about 25 ns an element. Two polynomial pieces, both evaluated, one selected (no branch):
//   |x| < 0.9:        erf(x) = x * P(x^2),       P(s) ~ erf(sqrt s) / sqrt s, degree 6;
//   0.9 <= |x|:       erf(x) = sign(x) (1 - exp(Q(min(|x|, 4)))), Q(t) ~ log erfc(t),
//                     degree 9; erfc(4) = 1.5e-8 is below half an ulp of 1, so 1 beyond.
// Coefficients: tools/fit_erf.py (weighted least squares refined toward minimax against
// mpmath); error at most 2.4 ulp over [-5, 5] (the script measures it in float32 with fma).
float loom_erf(const float x) {
#pragma OPENCL FP_CONTRACT OFF
  const float a = fabs(x), s = x * x, t = fmin(a, 4.0f);
  float p = 0x1.6510bcp-14f;
  p = fma(p, s, -0x1.aca392p-11f);
  p = fma(p, s, 0x1.550a44p-8f);
  p = fma(p, s, -0x1.b81524p-6f);
  p = fma(p, s, 0x1.ce2e54p-4f);
  p = fma(p, s, -0x1.812744p-2f);
  p = fma(p, s, 0x1.20dd76p+0f);
  float q = -0x1.3b0a9cp-26f;
  q = fma(q, t, 0x1.0e87fep-19f);
  q = fma(q, t, -0x1.9e5ddep-15f);
  q = fma(q, t, 0x1.41800ep-11f);
  q = fma(q, t, -0x1.3b23d8p-8f);
  q = fma(q, t, 0x1.b2610cp-6f);
  q = fma(q, t, -0x1.c34f7cp-4f);
  q = fma(q, t, -0x1.43762ep-1f);
  q = fma(q, t, -0x1.21582ap+0f);
  q = fma(q, t, 0x1.503884p-12f);
  const float tail = copysign(1.0f - exp(q), x);
  return a < 0.9f ? x * p : tail;
}
