// backends/opencl — OpenCL 1.2 through the ICD loader, so any vendor's driver works
// (PoCL runs it on a CPU in CI). Kernels are embedded OpenCL C compiled at run time
// with an on-disk binary cache; GEMM is CLBlast on GPUs and Loom's gemm_nt kernel on CPU
// devices (see matmul_dot). The native operator set is the kernel
// table (kernels() in opencl_ops.cpp); every other op reaches the device by
// decomposition or counted fallback.
#pragma once

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backends/device_ops.h"
#include "core/backend.h"
#include "core/fused_elementwise.h"
#include "core/op_catalog.h"

namespace loom {
template <class Device>
class KernelTable;
namespace device_ops {
template <class B, int MaxCopyRank>
struct SharedKernelRows;
}  // namespace device_ops
}  // namespace loom

namespace loom::opencl {

// Owns one OpenCL object; releases it with the matching clRelease* call.
template <class T, cl_int (*Release)(T)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(T h) : h_(h) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : h_(o.h_) { o.h_ = nullptr; }
  Handle& operator=(Handle&& o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  ~Handle() {
    if (h_ != nullptr)
      Release(h_);
  }
  T get() const { return h_; }

 private:
  T h_ = nullptr;
};
using Context = Handle<cl_context, clReleaseContext>;
using Queue = Handle<cl_command_queue, clReleaseCommandQueue>;
using Program = Handle<cl_program, clReleaseProgram>;
using Kernel = Handle<cl_kernel, clReleaseKernel>;
using Memory = Handle<cl_mem, clReleaseMemObject>;

class OpenClBackend final : public Backend {
 public:
  // The first OpenCL device (GPUs before others); nullptr when there is none.
  static std::unique_ptr<OpenClBackend> open();
  OpenClBackend(cl_platform_id platform, cl_device_id device);  // prefer open()
  // Waits for the queue first: a driver may still be compiling or running enqueued work
  // on its own threads (PoCL does), which must not outlive the process's teardown.
  ~OpenClBackend() override;

  std::string_view name() const override { return "opencl"; }
  DeviceInfo info() const override;
  Buffer allocate(std::size_t bytes) override;
  std::unique_ptr<Stream> create_stream(StreamKind kind) override;
  bool supports(const OpCall& call) const override;
  void launch(const OpCall& call, Stream& stream) override;
  Stream& default_stream() override { return *stream_; }
  void upload(const void* host, Buffer& dst, std::size_t dst_offset, std::size_t bytes) override;
  void download(const Buffer& src, std::size_t src_offset, void* host, std::size_t bytes) override;

  cl_command_queue queue() const { return queue_.get(); }  // the default stream's
  cl_context context() const { return context_.get(); }
  // The command queue behind a stream this backend made (interop: other OpenCL code
  // enqueueing in the stream's order).
  static cl_command_queue queue_of(Stream& stream);
  static constexpr int kMaxCopyRank = 6;  // copy_strided's shape and stride arguments

  // Which GEMM runs matmul: CLBlast, or the gemm_nt kernel (kernels.cl). The default is
  // gemm_nt on a CPU device and CLBlast on any other; LOOM_OPENCL_GEMM=clblast or =gemm_nt
  // chooses at start-up, and benchmarks and tests switch here to run both side by side.
  enum class Gemm { clblast, gemm_nt };
  Gemm gemm() const { return gemm_; }
  void set_gemm(Gemm gemm) { gemm_ = gemm; }
  // How many matmul calls each GEMM has served (a test's proof that the switch took
  // effect: the two may give bit-equal products on some devices).
  std::uint64_t gemm_calls(Gemm gemm) const {
    return gemm_calls_[static_cast<std::size_t>(gemm)].load(std::memory_order_relaxed);
  }

  // The index arithmetic of the kernels generated for fused chains: 32-bit where every
  // index of the call fits in 31 bits (narrowest, the default: a 64-bit division per
  // element kept PoCL's kernels scalar), or 64-bit always (wide). Tests run every fused
  // case both ways; the counts show which kind each launch used.
  enum class FusedIndex { narrowest, wide };
  void set_fused_index(FusedIndex index) { fused_index_ = index; }
  std::uint64_t fused_calls(bool wide) const {
    return fused_calls_[wide ? 1 : 0].load(std::memory_order_relaxed);
  }

 protected:
  void release(void* data, std::size_t bytes) noexcept override;

 private:
  void build_program();
  // Builds `source` (from the on-disk binary cache when it holds it); `what` names it in
  // a build error.
  Program compile(const std::string& source, const std::string& what);
  cl_kernel kernel(const char* name);
  // The queue of the launch this thread is inside, else the default stream's.
  cl_command_queue current_queue() const;
  template <class... Args>
  void run(const char* name, std::size_t global, Args... args);
  // A two-dimensional range: `columns` work-items along dimension 0 by `rows` along 1.
  template <class... Args>
  void run_rows(const char* name, std::size_t columns, std::size_t rows, Args... args);

  // The kernel table and its launchers, one per entry (or per family of entries).
  static const KernelTable<OpenClBackend>& kernels();
  template <class B, int MaxCopyRank>
  friend struct device_ops::SharedKernelRows;  // the launchers the device backends share
  struct StridedView {  // a view's shape and strides, padded to kMaxCopyRank dimensions
    cl_ulong shape[kMaxCopyRank] = {1, 1, 1, 1, 1, 1};
    cl_ulong stride[kMaxCopyRank] = {0, 0, 0, 0, 0, 0};
  };
  void copy_strided(const Tensor& x, Tensor& y, int rank, const StridedView& view);
  void fill(const OpCall& call);
  void binary(const OpCall& call);
  // The binary kernel on `full` and the broadcast `other` as `plan` reads them.
  void launch_binary(const device_ops::BinaryPlan& plan, const Tensor& full, const Tensor& other,
                     const Tensor& y);
  template <device_ops::UnaryKernel Code>
  void unary(const OpCall& call);
  void math(const OpCall& call);  // the unary kernel with the math function's code
  template <device_ops::UnaryBackwardKernel Code>
  void unary_backward(const OpCall& call);
  void reduce(const OpCall& call);
  void matmul(const OpCall& call);
  // x w + b: Loom's GEMM kernels add the bias after the sum over k, CLBlast's product gets
  // it in place after; either way the bits of matmul then add.
  void linear(const OpCall& call);
  // Whether matmul runs Loom's kernels (matmul_dot) for these operands.
  bool uses_gemm_nt(const Tensor& a, const Tensor& b, const Tensor& c) const;
  // What a launch of Loom's GEMM kernels does with the product: store it, with linear's
  // bias (one value per column) added when `bias` is set; or, with `kernels` (generated
  // gemm_nn, gemm_tn, gemm_nt), run a chain on it, whose arguments after c_off
  // `set_args` sets (matmul_elementwise).
  struct GemmTail {
    const Tensor* bias = nullptr;
    const std::array<cl_kernel, 3>* kernels = nullptr;
    std::function<void(cl_kernel, cl_uint)> set_args;
  };
  // matmul by Loom's kernels (gemm_nn, gemm_tn, gemm_nt): one launch per evenly spaced
  // batch, A transposed first only when both operands are.
  void matmul_dot(const OpCall& call);
  void matmul_dot(const OpCall& call, const GemmTail& tail);
  // matmul then an elementwise chain on the product: in the GEMM kernels' store hook
  // (gemm.cl) where Loom's kernels run the product, else CLBlast's product then the chain.
  void matmul_elementwise(const OpCall& call);
  // Whether a chain kernel over `space` may index in 32 bits (every index of `elements`
  // outputs and every input's read fits in 31 bits, and fused_index() allows it).
  bool narrow_index(const BroadcastSpace& space, std::size_t elements) const;
  // matmul by CLBlast.
  void matmul_clblast(const OpCall& call);
  // x [..., R, C] as a contiguous [..., C, R] on this device.
  Tensor transposed_copy(const Tensor& x);
  void copy(const OpCall& call);
  void expand(const OpCall& call);
  void slice_backward(const OpCall& call);
  void concat(const OpCall& call);
  void top_k(const OpCall& call);
  void sum_squares(const OpCall& call);
  void embedding(const OpCall& call);
  void embedding_backward(const OpCall& call);
  void cross_entropy(const OpCall& call);
  void cross_entropy_backward(const OpCall& call);
  void layer_norm_backward(const OpCall& call);
  void attention(const OpCall& call);
  void rms_norm(const OpCall& call);
  void rms_norm_backward(const OpCall& call);
  void rope(const OpCall& call);
  void gated(const OpCall& call);  // silu, swiglu and their backwards
  void adamw(const OpCall& call);
  // fused_elementwise: a kernel generated for the chain, built once per chain and way of
  // reading its inputs (kept here and in the disk cache).
  void fused(const OpCall& call);

  cl_device_id device_;
  Gemm gemm_ = Gemm::clblast;
  std::array<std::atomic<std::uint64_t>, 2> gemm_calls_{};
  FusedIndex fused_index_ = FusedIndex::narrowest;
  std::array<std::atomic<std::uint64_t>, 2> fused_calls_{};  // narrow, wide
  std::string device_name_, driver_version_;
  Context context_;
  Queue queue_;
  Program program_;
  std::map<std::string, Kernel> kernels_;
  struct FusedKernel {
    Program program;
    Kernel kernel;
  };
  std::map<std::string, FusedKernel> fused_kernels_;  // by generated source
  // By program and the way each input is read (one digit per input): the program, kept
  // alive, and its kernel (owned by fused_kernels_).
  std::map<std::pair<const ElementwiseProgram*, std::string>,
           std::pair<std::shared_ptr<const ElementwiseProgram>, cl_kernel>>
      fused_by_program_;
  struct EpilogueKernels {  // a generated GEMM program's three kernels
    Program program;
    Kernel nn, tn, nt;
  };
  std::map<std::string, EpilogueKernels> epilogue_kernels_;  // by generated source
  // By program and read kinds, as fused_by_program_: gemm_nn, gemm_tn, gemm_nt.
  std::map<std::pair<const ElementwiseProgram*, std::string>,
           std::pair<std::shared_ptr<const ElementwiseProgram>, std::array<cl_kernel, 3>>>
      epilogue_by_program_;
  // Token ids are checked on the device (a host check would wait for the queue to drain,
  // four times a step): a kernel that meets an id outside its range reads and writes
  // nothing with it and records the first such in `id_fault_` (the op's code, the
  // position, the id, the limit); the next read of a result on the host (download)
  // reports it as an error naming the op, and clears it.
  Memory id_fault_;
  std::atomic<bool> id_fault_possible_{false};  // an id-checking kernel ran since the last look
  void report_id_fault(cl_command_queue queue);
  std::unique_ptr<Stream> stream_;
  std::mutex mutex_;  // kernel arguments are per cl_kernel object: one launch at a time
  device_ops::LaunchTarget<cl_command_queue> launch_target_;
};

// The process's OpenCL backend, or nullptr when no device is present.
OpenClBackend* backend();

}  // namespace loom::opencl
