// Elementwise functions shared by Loom's OpenCL kernels (kernels.cl) and the kernels
// generated for fused chains (opencl_backend.cpp, fused_source): both programs are
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
