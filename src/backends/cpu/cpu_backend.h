// backends/cpu — the CPU backend: supports every catalog op but matmul_elementwise (run as
// its decomposition: sgemm has no epilogue hook), the universal fallback.
//
// Kernels come from a table indexed by OpId: fast kernels (oneDNN GEMM, OpenMP-threaded
// loops, fused layer norm / softmax-cross-entropy / attention / AdamW) where written,
// the reference kernel elsewhere. kernel_source() says which, for `loom ops`.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "core/backend.h"
#include "core/op_catalog.h"

namespace loom::cpu {

class CpuBackend final : public Backend {
 public:
  CpuBackend();
  ~CpuBackend() override { trim_cache(); }
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;
  std::string_view name() const override { return "cpu"; }
  DeviceInfo info() const override;
  bool host_accessible() const override { return true; }
  Buffer allocate(std::size_t bytes) override;
  std::unique_ptr<Stream> create_stream(StreamKind kind) override;
  bool supports(const OpCall& call) const override;
  void launch(const OpCall& call, Stream& stream) override;
  Stream& default_stream() override { return *default_stream_; }
  void upload(const void* host, Buffer& dst, std::size_t dst_offset, std::size_t bytes) override;
  void download(const Buffer& src, std::size_t src_offset, void* host, std::size_t bytes) override;
  // bf16: matmul and linear round their operands to bf16 first (attention stays f32).
  bool set_matmul_precision(DType dtype) override;
  bool set_threads(int threads) override;  // every CPU kernel's pool (OpenMP and oneDNN)
  void release_cached_memory() override { trim_cache(); }

  // "fast" when a CPU-specific kernel is registered for `op`, "reference" otherwise.
  std::string_view kernel_source(OpId op) const;
  // Bytes held by the allocator's free lists (reused by later allocations of that size).
  std::size_t cached_bytes() const;
  // Returns cached blocks to the system.
  void trim_cache();

 protected:
  void release(void* data, std::size_t bytes) noexcept override;

 private:
  std::array<KernelFn, kNumOps> kernels_{};
  std::array<bool, kNumOps> fast_{};
  std::unique_ptr<Stream> default_stream_;
  // Caching allocator: freed blocks wait in per-size free lists, because a training
  // step allocates the same sizes every iteration and fresh pages cost page faults.
  mutable std::mutex cache_mutex_;
  std::map<std::size_t, std::vector<void*>> free_blocks_;
  std::size_t cached_bytes_ = 0;
};

// The process's CPU backend (the CPU is always there; it is the oracle and fallback).
CpuBackend& backend();

// Sets the number of threads CPU kernels use (OpenMP and oneDNN).
void set_num_threads(int threads);
int num_threads();

// Registers the fast kernels (cpu_kernels.cpp, cpu_nn_kernels.cpp) into `table`.
void register_elementwise_kernels(std::array<KernelFn, kNumOps>& table);
void register_nn_kernels(std::array<KernelFn, kNumOps>& table);
void register_fused_kernels(std::array<KernelFn, kNumOps>& table);
// Precision bf16 for matmul and linear (cpu_kernels.cpp).
void set_bf16_operands(bool on);

// One GEMM the CPU kernels ran: C[m,n] = alpha op(A) op(B) + beta C, row-major.
struct GemmRecord {
  bool trans_a, trans_b;
  std::int64_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
  bool a_transposed;  // A transposed into a scratch buffer first, then the plain product
  bool b_padded;      // B copied into rows padded apart first (rows a multiple of 2 KiB apart)
  bool in_parallel;   // called inside an OpenMP parallel region (one thread)
  double seconds;     // host time of the call
};
// While `records` is set, every GEMM is appended to it (benchmarks: bench/src/gemm_floor.cpp);
// nullptr stops recording.
void record_gemms(std::vector<GemmRecord>* records);
// Whether a large product lays its operands out first where oneDNN runs the layout as
// called slowly: a transposed A transposed into place, a B with rows a multiple of 2 KiB
// apart padded (the default where oneDNN runs its AVX2 kernels, not its AVX-512 ones;
// LOOM_CPU_GEMM=relayout or as_called starts with it on or off everywhere). For benchmarks
// that compare both.
void set_gemm_transpose(bool on);
bool gemm_transpose();  // the current setting

}  // namespace loom::cpu
