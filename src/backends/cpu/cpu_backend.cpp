#include "backends/cpu/cpu_backend.h"

#include <malloc.h>
#include <omp.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"
#include "core/host_stream.h"

namespace loom::cpu {
namespace {

constexpr std::size_t kAlignment = 64;  // one cache line; AVX-512 loads

class CpuStream final : public Stream {
 public:
  // CPU kernels run synchronously on the calling thread, so work is complete on return.
  void copy(const Buffer& src, std::size_t src_offset, Buffer& dst, std::size_t dst_offset,
            std::size_t bytes) override {
    std::memcpy(static_cast<std::byte*>(dst.data()) + dst_offset,
                static_cast<const std::byte*>(src.data()) + src_offset, bytes);
  }
  void signal(Timeline& timeline, std::uint64_t value) override { timeline.signal(value); }
  void wait(Timeline& timeline, std::uint64_t value) override { timeline.wait(value); }
  void synchronize() override {}
};

}  // namespace

CpuBackend::CpuBackend() : default_stream_(std::make_unique<CpuStream>()) {
  for (std::size_t i = 0; i < kNumOps; ++i)
    kernels_[i] = all_ops()[i].reference;
  std::array<KernelFn, kNumOps> fast{};
  register_elementwise_kernels(fast);
  register_nn_kernels(fast);
  register_fused_kernels(fast);
  for (std::size_t i = 0; i < kNumOps; ++i) {
    if (fast[i] != nullptr) {
      kernels_[i] = fast[i];
      fast_[i] = true;
    }
  }
}

DeviceInfo CpuBackend::info() const {
  DeviceInfo info;
  info.name = "cpu (" + std::to_string(num_threads()) + " threads)";
  long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  info.memory_bytes = pages > 0 && page_size > 0 ? static_cast<std::size_t>(pages) * page_size : 0;
  info.host_accessible = true;
  return info;
}

Buffer CpuBackend::allocate(std::size_t bytes) {
  std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0)
    rounded = kAlignment;
  {
    std::lock_guard lock(cache_mutex_);
    auto it = free_blocks_.find(rounded);
    if (it != free_blocks_.end() && !it->second.empty()) {
      void* block = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= rounded;
      return Buffer(block, rounded, this);
    }
  }
  void* block = std::aligned_alloc(kAlignment, rounded);
  if (block == nullptr) {
    trim_cache();
    block = std::aligned_alloc(kAlignment, rounded);
  }
  check(block != nullptr,
        [&] { return "cpu: out of memory allocating " + std::to_string(rounded) + " bytes"; });
  return Buffer(block, rounded, this);
}

void CpuBackend::release(void* data, std::size_t bytes) noexcept {
  std::lock_guard lock(cache_mutex_);
  try {
    free_blocks_[bytes].push_back(data);
    cached_bytes_ += bytes;
  } catch (...) {
    std::free(data);  // could not cache it: give it back
  }
}

std::size_t CpuBackend::cached_bytes() const {
  std::lock_guard lock(cache_mutex_);
  return cached_bytes_;
}

void CpuBackend::trim_cache() {
  std::lock_guard lock(cache_mutex_);
  for (auto& [size, blocks] : free_blocks_)
    for (void* block : blocks)
      std::free(block);
  free_blocks_.clear();
  cached_bytes_ = 0;
  // glibc keeps freed heap pages resident (blocks below its mmap threshold); hand the
  // free ones back so the next large allocation does not add to them.
  malloc_trim(0);
}

std::unique_ptr<Stream> CpuBackend::create_stream(StreamKind) {
  // Every kind is a host thread: the CPU has no copy engine, and its collectives (MPI on
  // host memory) are host calls too.
  return std::make_unique<HostStream>();
}

bool CpuBackend::supports(const OpCall& call) const {
  // Every op but one: matmul_elementwise exists to run a chain inside a GEMM kernel, and
  // oneDNN's sgemm has no hook for it (its matmul primitive with post-ops was slower,
  // bench/RESULTS.md). Its decomposition runs here instead (the GEMM, then the chain's
  // block loop), and the graph's epilogue pass leaves the CPU's products alone.
  return call.op != OpId::matmul_elementwise;
}

void CpuBackend::launch(const OpCall& call, Stream& stream) {
  KernelFn kernel = kernels_[static_cast<std::size_t>(call.op)];
  auto* host_stream = dynamic_cast<HostStream*>(&stream);
  if (host_stream == nullptr) {  // the default stream: synchronous, on the calling thread
    kernel(call);
    return;
  }
  host_stream->submit_call(kernel, call);  // a created stream: on its thread, in order
}

void CpuBackend::upload(const void* host, Buffer& dst, std::size_t dst_offset, std::size_t bytes) {
  std::memcpy(static_cast<std::byte*>(dst.data()) + dst_offset, host, bytes);
}

void CpuBackend::download(const Buffer& src, std::size_t src_offset, void* host,
                          std::size_t bytes) {
  std::memcpy(host, static_cast<const std::byte*>(src.data()) + src_offset, bytes);
}

std::string_view CpuBackend::kernel_source(OpId op) const {
  return fast_[static_cast<std::size_t>(op)] ? "fast" : "reference";
}

CpuBackend& backend() {
  // One per process. Tensors must not outlive it, so Loom keeps no static tensors.
  static CpuBackend instance;
  return instance;
}

bool CpuBackend::set_matmul_precision(DType dtype) {
  if (dtype != DType::f32 && dtype != DType::bf16)
    return false;
  set_bf16_operands(dtype == DType::bf16);
  return true;
}

bool CpuBackend::set_threads(int threads) {
  set_num_threads(threads);
  return true;
}

void set_num_threads(int threads) {
  check(threads >= 1, [&] { return "threads = " + std::to_string(threads) + ", expected >= 1"; });
  omp_set_num_threads(threads);
}

int num_threads() {
  return omp_get_max_threads();
}

}  // namespace loom::cpu
