// opencl_gemm: the OpenCL backend's matmul through CLBlast against Loom's own kernels
// (gemm_nn, gemm_tn, gemm_nt in src/backends/opencl/kernels.cl), side by side in one run
// on the same device, for the products of the imported GPT block's training step (the
// forward x W, the backward dY W^T and X^T dY, attention's per-head batches) and two
// larger ones. Each figure is the median over rounds of the mean time of calls + 1 calls
// (calls / 5 + 1 for the large products; each enqueued, then one wait for the queue), so
// it includes the host's launch cost.
//
// Usage: opencl_gemm [--rounds 7] [--calls 50]
// Prints one markdown row per product: microseconds per call with each GEMM, their
// ratio, and gemm_*'s GFLOP/s.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/opencl/opencl_backend.h"
#include "core/error.h"
#include "dispatch/dispatch.h"

namespace {

using loom::Shape;
using loom::Tensor;
using Gemm = loom::opencl::OpenClBackend::Gemm;

struct Product {
  const char* what;
  Shape a, b;
  bool trans_a, trans_b;
};

Tensor filled(const Shape& shape, float step, loom::Backend& device) {
  std::vector<float> v(static_cast<std::size_t>(loom::shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(i % 17) * step - 0.1f;
  return Tensor::from_floats(shape, v, loom::cpu::backend()).to(device);
}

double micros_per_call(loom::opencl::OpenClBackend& device, const Product& p, Gemm gemm, int rounds,
                       int calls) {
  device.set_gemm(gemm);
  const Tensor a = filled(p.a, 0.01f, device), b = filled(p.b, 0.02f, device);
  loom::Attrs attrs;
  attrs.trans_a = p.trans_a;
  attrs.trans_b = p.trans_b;
  for (int w = 0; w < 3; ++w)
    (void)loom::dispatch::call(loom::OpId::matmul, {a, b}, attrs, &device);
  device.default_stream().synchronize();
  std::vector<double> means;
  for (int r = 0; r < rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c)
      (void)loom::dispatch::call(loom::OpId::matmul, {a, b}, attrs, &device);
    device.default_stream().synchronize();
    means.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count() /
        calls);
  }
  std::sort(means.begin(), means.end());
  return means[means.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7, calls = 50;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc || (flag != "--rounds" && flag != "--calls")) {
      std::fprintf(stderr, "usage: opencl_gemm [--rounds 7] [--calls 50]\n");
      return 2;
    }
    const int v = std::atoi(argv[++i]);
    if (v < 1) {
      std::fprintf(stderr, "opencl_gemm: %s %s: expected a positive count\n", flag.c_str(),
                   argv[i]);
      return 2;
    }
    (flag == "--rounds" ? rounds : calls) = v;
  }
  try {
    loom::opencl::OpenClBackend* device = loom::opencl::backend();
    if (device == nullptr) {
      std::fprintf(stderr, "opencl_gemm: no OpenCL device\n");
      return 1;
    }
    const Gemm chosen = device->gemm();
    std::printf("device %s; the default GEMM here: %s; %d rounds of %d calls\n\n",
                device->info().name.c_str(), chosen == Gemm::gemm_nt ? "Loom's" : "CLBlast", rounds,
                calls);
    const std::vector<Product> products{
        {"x W (QKV projection)", {64, 64}, {64, 192}, false, false},
        {"x W (MLP up)", {64, 64}, {64, 256}, false, false},
        {"dY W^T (MLP down, backward)", {64, 64}, {256, 64}, false, true},
        {"X^T dY (weight gradient)", {64, 64}, {64, 256}, true, false},
        {"Q K^T (8 heads)", {8, 32, 16}, {8, 32, 16}, false, true},
        {"P V (8 heads)", {8, 32, 32}, {8, 32, 16}, false, false},
        {"512 x 512 x 512", {512, 512}, {512, 512}, false, false},
        {"1024 x 768 x 768, B^T", {1024, 768}, {768, 768}, false, true},
    };
    std::printf(
        "| product | A | B | CLBlast us/call | Loom us/call | CLBlast / Loom | Loom GFLOP/s |\n");
    std::printf("| --- | --- | --- | ---: | ---: | ---: | ---: |\n");
    for (const Product& p : products) {
      const int big = loom::shape_numel(p.a) > 100000 ? 5 : 1;  // fewer calls of the large ones
      const double clblast = micros_per_call(*device, p, Gemm::clblast, rounds, calls / big + 1);
      const double own = micros_per_call(*device, p, Gemm::gemm_nt, rounds, calls / big + 1);
      const std::int64_t m = p.trans_a ? p.a[p.a.size() - 1] : p.a[p.a.size() - 2];
      const std::int64_t k = p.trans_a ? p.a[p.a.size() - 2] : p.a[p.a.size() - 1];
      const std::int64_t n = p.trans_b ? p.b[p.b.size() - 2] : p.b[p.b.size() - 1];
      const std::int64_t batch = loom::shape_numel(p.a) / (m * k);
      std::printf("| %s | %s%s | %s%s | %.1f | %.1f | %.2fx | %.1f |\n", p.what,
                  loom::shape_str(p.a).c_str(), p.trans_a ? " (T)" : "",
                  loom::shape_str(p.b).c_str(), p.trans_b ? " (T)" : "", clblast, own,
                  clblast / own, 2.0 * static_cast<double>(batch * m * n * k) / own * 1e-3);
    }
    device->set_gemm(chosen);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "opencl_gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
