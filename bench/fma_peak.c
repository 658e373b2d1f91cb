// Empirical fp32 FMA throughput (the practical compute ceiling) per thread and for N threads.
// Build: gcc -O3 -march=native -fopenmp bench/fma_peak.c -o build/bench/fma_peak
// Run:   build/bench/fma_peak [threads=2]      (bench/run-all does both: fma_peak)
// Without AVX-512 (no __AVX512F__ under -march=native) only the AVX2 lines are measured.
// Uses 12 independent accumulator chains so FMA latency (4 cycles) x 2 ports is covered.
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#define CHAINS 12
#define INNER 1000000L

#ifdef __AVX512F__
static double run512(long iters) {
  __m512 acc[CHAINS];
  __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_set1_ps((float)i);
  for (long it = 0; it < iters; it++)
#pragma GCC unroll 12
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  float s = 0, tmp[16];
  for (int i = 0; i < CHAINS; i++) { _mm512_storeu_ps(tmp, acc[i]); s += tmp[0]; }
  return s;
}
#endif

static double run256(long iters) {
  __m256 acc[CHAINS];
  __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < CHAINS; i++) acc[i] = _mm256_set1_ps((float)i);
  for (long it = 0; it < iters; it++)
#pragma GCC unroll 12
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  float s = 0, tmp[8];
  for (int i = 0; i < CHAINS; i++) { _mm256_storeu_ps(tmp, acc[i]); s += tmp[0]; }
  return s;
}

static void measure(const char *name, int lanes, double (*fn)(long), int threads) {
  volatile double sink = 0;
  fn(INNER / 10);  // warm-up / frequency ramp
  double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  sink += fn(INNER * 20);
  double dt = omp_get_wtime() - t0;
  double flop = 2.0 * lanes * CHAINS * (double)INNER * 20 * threads;
  printf("%s threads=%d  %.1f GFLOP/s  (%.1f per thread)\n", name, threads, flop / dt / 1e9,
         flop / dt / 1e9 / threads);
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 2;
  for (int rep = 0; rep < 3; rep++) {
#ifdef __AVX512F__
    measure("avx512-fma", 16, run512, 1);
    measure("avx512-fma", 16, run512, threads);
#endif
    measure("avx2-fma  ", 8, run256, 1);
    measure("avx2-fma  ", 8, run256, threads);
  }
  return 0;
}
