#include "backends/partial/partial_backend.h"

#include <cstdlib>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/host_stream.h"

namespace loom::partial {

PartialBackend::PartialBackend()
    : PartialBackend({OpId::matmul, OpId::add, OpId::mul, OpId::div, OpId::exp, OpId::log,
                      OpId::sum, OpId::max, OpId::fill, OpId::copy}) {}

namespace {
// f32 compute (i32 for ids), as a small chip would have.
bool f32_or_ids(const OpCall& call) {
  for (const Tensor& t : call.inputs)
    if (t.defined() && t.dtype() != DType::f32 && t.dtype() != DType::i32)
      return false;
  return true;
}

// One table entry per native op: the condition above, and the CPU's kernel.
std::vector<KernelTable<PartialBackend>::Entry> entries_for(const std::set<OpId>& native) {
  std::vector<KernelTable<PartialBackend>::Entry> entries;
  for (OpId op : native)
    entries.push_back({op, f32_or_ids, &PartialBackend::run_cpu_kernel});
  return entries;
}
}  // namespace

PartialBackend::PartialBackend(std::set<OpId> native)
    : native_(std::move(native)), kernels_("partial", entries_for(native_)) {}

Stream& PartialBackend::default_stream() {
  return cpu::backend().default_stream();
}

DeviceInfo PartialBackend::info() const {
  DeviceInfo i = cpu::backend().info();
  i.name = "partial (" + std::to_string(native_.size()) + " native ops on the CPU)";
  return i;
}

Buffer PartialBackend::allocate(std::size_t bytes) {
  std::size_t rounded = (bytes + 63) / 64 * 64;
  void* block = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  check(block != nullptr,
        [&] { return "partial: out of memory allocating " + std::to_string(bytes) + " bytes"; });
  return Buffer(block, rounded, this);
}

void PartialBackend::release(void* data, std::size_t) noexcept {
  std::free(data);
}

std::unique_ptr<Stream> PartialBackend::create_stream(StreamKind kind) {
  return cpu::backend().create_stream(kind);
}

bool PartialBackend::supports(const OpCall& call) const {
  return kernels_.supports(call);
}

void PartialBackend::launch(const OpCall& call, Stream& stream) {
  if (auto* created = dynamic_cast<HostStream*>(&stream)) {  // in order on its thread
    created->submit_call([this](const OpCall& deferred) { kernels_.launch(*this, deferred); },
                         call);
    return;
  }
  kernels_.launch(*this, call);
}

void PartialBackend::run_cpu_kernel(const OpCall& call) {
  // The memory is host memory, so the CPU's kernels run on it directly.
  cpu::backend().launch(call, cpu::backend().default_stream());
}

void PartialBackend::upload(const void* host, Buffer& dst, std::size_t dst_offset,
                            std::size_t bytes) {
  std::memcpy(static_cast<std::byte*>(dst.data()) + dst_offset, host, bytes);
}

void PartialBackend::download(const Buffer& src, std::size_t src_offset, void* host,
                              std::size_t bytes) {
  std::memcpy(host, static_cast<const std::byte*>(src.data()) + src_offset, bytes);
}

PartialBackend& backend() {
  static PartialBackend instance;
  return instance;
}

}  // namespace loom::partial
