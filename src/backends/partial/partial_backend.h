// backends/partial — a backend that natively has only a handful of primitives.
//
// It is the worked example of porting a chip (docs/porting.md): its memory is its own
// (a separate device as far as dispatch is concerned) and its native operator set is
// data: a kernel table built from the set of native ops. Everything else reaches it
// through the catalog's decompositions or a counted CPU fallback with explicit copies,
// and it still trains the default GPT to the CPU's losses. Its kernels are the CPU's, so
// differences come only from the paths.
#pragma once

#include <set>
#include <string>

#include "backends/kernel_table.h"
#include "core/backend.h"
#include "core/op_catalog.h"

namespace loom::partial {

class PartialBackend final : public Backend {
 public:
  // The default native set: matmul, add, mul, div, exp, log, sum, max, fill, copy.
  PartialBackend();
  explicit PartialBackend(std::set<OpId> native);
  std::string_view name() const override { return "partial"; }
  DeviceInfo info() const override;
  bool host_accessible() const override {
    return true;
  }  // unified memory, like a CPU-attached accelerator
  Buffer allocate(std::size_t bytes) override;
  std::unique_ptr<Stream> create_stream(StreamKind kind) override;
  bool supports(const OpCall& call) const override;
  void launch(const OpCall& call, Stream& stream) override;
  // The CPU's: synchronous, on the calling thread. Created streams are the CPU's too.
  Stream& default_stream() override;
  void upload(const void* host, Buffer& dst, std::size_t dst_offset, std::size_t bytes) override;
  void download(const Buffer& src, std::size_t src_offset, void* host, std::size_t bytes) override;
  const std::set<OpId>& native_ops() const { return native_; }
  // The launcher of every entry of its kernel table: the CPU's kernel, on host memory.
  void run_cpu_kernel(const OpCall& call);

 protected:
  void release(void* data, std::size_t bytes) noexcept override;

 private:
  std::set<OpId> native_;
  KernelTable<PartialBackend> kernels_;
};

PartialBackend& backend();

}  // namespace loom::partial
