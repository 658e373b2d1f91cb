#include "backends/partial/partial_backend.h"

#include <cstdlib>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"

namespace loom::partial {

PartialBackend::PartialBackend()
    : PartialBackend({OpId::matmul, OpId::add, OpId::mul, OpId::div, OpId::exp, OpId::log, OpId::sum, OpId::max,
                      OpId::fill, OpId::copy}) {}

PartialBackend::PartialBackend(std::set<OpId> native)
    : native_(std::move(native)), stream_(cpu::backend().create_stream(StreamKind::compute)) {}

DeviceInfo PartialBackend::info() const {
  DeviceInfo i = cpu::backend().info();
  i.name = "partial (" + std::to_string(native_.size()) + " native ops on the CPU)";
  return i;
}

Buffer PartialBackend::allocate(std::size_t bytes, MemoryKind) {
  std::size_t rounded = (bytes + 63) / 64 * 64;
  void* block = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  check(block != nullptr, "partial: out of memory allocating " + std::to_string(bytes) + " bytes");
  return Buffer(block, rounded, this);
}

void PartialBackend::release(void* data, std::size_t) noexcept { std::free(data); }

std::unique_ptr<Stream> PartialBackend::create_stream(StreamKind kind) { return cpu::backend().create_stream(kind); }

bool PartialBackend::supports(const OpCall& call) const {
  if (!native_.count(call.op)) return false;
  for (const Tensor& t : call.inputs)  // f32 compute (ids for gathers), as a small chip would
    if (t.defined() && t.dtype() != DType::f32 && t.dtype() != DType::i32) return false;
  return true;
}

void PartialBackend::launch(const OpCall& call, Stream&) {
  // The memory is host memory, so the CPU's kernels run on it directly.
  cpu::backend().launch(call, cpu::backend().default_stream());
}

void PartialBackend::upload(const void* host, Buffer& dst, std::size_t dst_offset, std::size_t bytes) {
  std::memcpy(static_cast<std::byte*>(dst.data()) + dst_offset, host, bytes);
}

void PartialBackend::download(const Buffer& src, std::size_t src_offset, void* host, std::size_t bytes) {
  std::memcpy(host, static_cast<const std::byte*>(src.data()) + src_offset, bytes);
}

PartialBackend& backend() {
  static PartialBackend instance;
  return instance;
}

}  // namespace loom::partial
