// gemm_row_stride: how fast oneDNN's dnnl_sgemm runs a plain product C = A B (row-major,
// no transposes) when B's rows are a multiple of 2 KiB apart, against the same product
// with B's rows padded 16 floats (one cache line) further apart. Buffers are 64-byte
// aligned, as the CPU backend allocates tensors. This is the measurement behind the CPU
// backend's padding of B (src/backends/cpu/cpu_kernels.cpp): on some CPUs a product of
// few rows with such a B runs at about half the rate.
//
// Usage: gemm_row_stride [--threads 2] [--reps 9]
// Prints one markdown row per shape: GFLOP/s with B as it is, padded, and their ratio.
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Median GFLOP/s of `reps` products M x N x K with B's rows `ldb` floats apart.
double rate(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t ldb, int reps) {
  auto aligned = [](std::vector<float>& v) {
    const auto address = reinterpret_cast<std::uintptr_t>(v.data());
    return v.data() + (64 - address % 64) % 64 / sizeof(float);
  };
  std::vector<float> a_store(static_cast<std::size_t>(m * k) + 16),
      b_store(static_cast<std::size_t>(k * ldb) + 16),
      c_store(static_cast<std::size_t>(m * n) + 16);
  float *a = aligned(a_store), *b = aligned(b_store), *c = aligned(c_store);
  for (std::int64_t i = 0; i < m * k; ++i)
    a[i] = static_cast<float>(i % 13) * 0.01f;
  for (std::int64_t i = 0; i < k * ldb; ++i)
    b[i] = static_cast<float>(i % 7) * 0.02f;
  std::vector<double> seconds;
  for (int r = 0; r < reps + 1; ++r) {  // the first call warms the buffers
    const auto start = Clock::now();
    const dnnl_status_t status = dnnl_sgemm('N', 'N', m, n, k, 1.0f, a, k, b, ldb, 0.0f, c, n);
    if (status != dnnl_success) {
      std::fprintf(stderr, "gemm_row_stride: dnnl_sgemm failed with status %d\n", status);
      std::exit(1);
    }
    if (r > 0)
      seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * static_cast<double>(m * n * k) / seconds[seconds.size() / 2] * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (v <= 0 || (flag != "--threads" && flag != "--reps")) {
      std::fprintf(stderr, "usage: gemm_row_stride [--threads N] [--reps N]\n");
      return 2;
    }
    (flag == "--threads" ? threads : reps) = v;
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "usage: gemm_row_stride [--threads N] [--reps N]\n");
    return 2;
  }
  omp_set_num_threads(threads);
  std::printf("gemm_row_stride: dnnl_sgemm C = A B, %d threads, median of %d\n\n", threads, reps);
  std::printf("| M | N = B's row stride (floats) | K | GFLOP/s, B as it is | GFLOP/s, rows padded by 16 "
              "| padded / as it is |\n| ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (std::int64_t k : {256, 1024})
    for (std::int64_t m : {128, 256, 512, 1024})
      for (std::int64_t n : {512, 768, 1024, 2048}) {
        const double plain = rate(m, n, k, n, reps), padded = rate(m, n, k, n + 16, reps);
        std::printf("| %lld | %lld | %lld | %.0f | %.0f | %.2fx |\n", static_cast<long long>(m),
                    static_cast<long long>(n), static_cast<long long>(k), plain, padded,
                    padded / plain);
      }
  return 0;
}
