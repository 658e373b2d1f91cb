// backends/cuda — NVIDIA GPUs through the CUDA driver API, cuBLAS and cuBLASLt, loaded at
// run time (cuda_api.h), so the same binary runs where there is no driver. Kernels are a
// fatbin built by nvcc and embedded at build time; GEMMs and the products inside
// attention are cuBLAS, in f32 or (set_matmul_precision) bf16 operands with f32
// accumulation. Memory comes from the driver's stream-ordered pool.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/cuda_api.h"
#include "backends/device_ops.h"
#include "core/backend.h"
#include "core/op_catalog.h"

namespace loom {
template <class Device>
class KernelTable;
struct ElementwiseProgram;
namespace device_ops {
template <class B, int MaxCopyRank>
struct SharedKernelRows;
}  // namespace device_ops
}  // namespace loom

namespace loom::cuda {

class CudaBackend final : public Backend {
 public:
  // Device `ordinal` (LOOM_CUDA_DEVICE, default 0); nullptr with `why` set when unusable.
  static std::unique_ptr<CudaBackend> open(std::string* why);
  CudaBackend(const Api& api, CUdevice device);  // prefer open()
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  DeviceInfo info() const override;
  bool host_accessible() const override { return false; }
  Buffer allocate(std::size_t bytes) override;
  std::unique_ptr<Stream> create_stream(StreamKind kind) override;
  bool supports(const OpCall& call) const override;
  // On `stream`'s CUDA stream: the default stream, or a created one (which starts the
  // call after the default stream's work so far and keeps its tensors until it has run).
  void launch(const OpCall& call, Stream& stream) override;
  Stream& default_stream() override { return *stream_wrapper_; }
  bool set_matmul_precision(DType dtype) override;
  void upload(const void* host, Buffer& dst, std::size_t dst_offset, std::size_t bytes) override;
  void download(const Buffer& src, std::size_t src_offset, void* host, std::size_t bytes) override;

  const Api& api() const { return api_; }
  CUstream stream() const { return stream_; }  // the default stream's
  // The stream of the launch this thread is inside, else the default stream.
  CUstream current_stream() const;
  // Device bytes [begin, end) are about to be written or freed: bf16 copies made from them
  // are stale and dropped.
  void forget_copies_of(std::uintptr_t begin, std::uintptr_t end) noexcept;
  // matmul_elementwise calls run as one cublasLtMatmul with an epilogue (the others ran
  // as cuBLAS's GEMM and the chain kernel): for tests and `loom ops`.
  std::uint64_t lt_epilogue_calls() const { return lt_epilogue_calls_.load(); }

 protected:
  void release(void* data, std::size_t bytes) noexcept override;

 private:
  CUfunction function(const char* name);
  template <class... Args>
  void run(const char* name, unsigned grid_x, unsigned grid_y, unsigned block_x, unsigned block_y,
           Args... args);
  template <class... Args>
  void run_1d(const char* name, long long n, Args... args);
  template <class... Args>
  void run_rows(const char* name, long long rows, Args... args);  // one warp per row
  // Row-major, batched: C[b] = beta C[b] + op(A[b]) op(B[b]), in f32 or bf16 operands.
  struct GemmOperand {
    const float* data;
    long long numel;  // elements of the whole operand tensor (converted at once for bf16)
    long long ld, batch_stride;
    const void* bf16 = nullptr;  // the operand already in bf16 (then `data` is unused)
  };
  // c is f32, or bf16 when c_bf16 (allowed under bf16 products only).
  void gemm(bool trans_a, bool trans_b, long long m, long long n, long long k, GemmOperand a,
            GemmOperand b, void* c, long long ldc, long long c_stride, long long batch, float beta,
            bool c_bf16 = false);
  // y[c] = scale * sum_r x[r, c] for x [rows, cols], split over chunks of rows when tall.
  void sum_columns(const float* x, float* y, long long rows, long long cols, float scale);
  // The kernel table (kernels() in cuda_backend.cpp) and its launchers.
  static const KernelTable<CudaBackend>& kernels();
  template <class B, int MaxCopyRank>
  friend struct device_ops::SharedKernelRows;  // the launchers the device backends share
  void fill(const OpCall& call);
  void binary(const OpCall& call);
  template <device_ops::UnaryKernel Code>
  void unary(const OpCall& call);
  void math(const OpCall& call);  // the unary kernel with the math function's code
  template <device_ops::UnaryBackwardKernel Code>
  void unary_backward(const OpCall& call);
  void reduce(const OpCall& call);
  void copy(const OpCall& call);
  void slice_backward(const OpCall& call);
  void sum_squares(const OpCall& call);
  void embedding(const OpCall& call);
  void cross_entropy(const OpCall& call);
  void cross_entropy_backward(const OpCall& call);
  void layer_norm(const OpCall& call);
  void layer_norm_backward(const OpCall& call);
  void adamw(const OpCall& call);
  void fused(const OpCall& call);  // fused_elementwise: the interpreter kernel
  void matmul(const OpCall& call);
  void linear(const OpCall& call);
  // A GEMM with a chain on its product (cuda_epilogue.cpp): one cublasLtMatmul where the
  // chain is one of cuBLASLt's epilogues, else the GEMM and then the chain kernel.
  void matmul_elementwise(const OpCall& call);
  bool lt_matmul_elementwise(const OpCall& call);  // false: not an epilogue cuBLASLt runs
  GemmOperand head_operand(const Tensor& t, long long offset, long long ld, long long stride);
  // A strided q, k or v view (row stride ld, from column col0; key/value heads repeated for
  // `group` query heads each) as [B, H, t, D] blocks in `to`.
  void split_heads(const Tensor& from, long long ld, long long col0, long long t, long long group,
                   const device_ops::AttentionLayout& layout, bool bf16, Tensor& to);
  void attention_forward(const OpCall& call);
  void attention_backward(const OpCall& call);
  void rms_norm(const OpCall& call);
  void rms_norm_backward(const OpCall& call);
  void rope(const OpCall& call);
  void gated(const OpCall& call);  // silu, swiglu and their backwards
  void embedding_backward(const OpCall& call);

  // bf16 copies of f32 GEMM operands under bf16 products, kept until their source bytes
  // are written or freed: an operand is usually multiplied again in the backward pass
  // (a linear layer's input by its weight gradient, an output gradient by both of its
  // gradients), and its copy is then made once instead of twice. Oldest first, within
  // a budget of device memory.
  struct Bf16Copy {
    std::uintptr_t begin, end;  // the f32 source bytes
    Tensor copy;
  };
  Tensor bf16_copy_of(const float* data, long long numel);
  std::vector<Bf16Copy> bf16_copies_;
  std::size_t bf16_copy_bytes_ = 0, bf16_copy_budget_ = 0;
  std::mutex bf16_copies_mutex_;
  std::atomic<std::size_t> bf16_copy_count_{0};  // bf16_copies_.size(), read without the lock

  // Token ids are checked by the kernels that read them (device_ops::IdCheckOp): the
  // first out-of-range id is recorded in `id_fault_` (4 ints) and reported, as an error
  // naming the op, by the next download, which then clears it.
  Tensor id_fault_;
  std::atomic<bool> id_fault_possible_{false};  // an id-checking kernel ran since the last look
  int* id_fault();  // for a launch: marks that a fault may now be recorded
  void report_id_fault();

  const Api& api_;
  CUdevice device_;
  CUcontext context_ = nullptr;  // the device's primary context, retained
  CUstream stream_ = nullptr;
  CUmodule module_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t cublas_lt_ = nullptr;  // null without cuBLASLt
  std::atomic<std::uint64_t> lt_epilogue_calls_{0};
  DType matmul_precision_ = DType::f32;
  std::unique_ptr<Stream> stream_wrapper_;
  std::map<std::string, CUfunction, std::less<>> functions_;
  std::mutex mutex_;
  device_ops::LaunchTarget<CUstream> launch_target_;
};

// A matmul_elementwise chain (core/fused_elementwise.h) as one cublasLtMatmul, D =
// epilogue(A B + C): which epilogue, and where its bias, its C (a tensor added whole: a
// residual), its GELU input (read: DGELU; written: GELU_AUX_BIAS) and its result are among
// the op's inputs and outputs. nullopt: not one of them.
struct LtEpilogue {
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  int bias_input = -1;      // index into the op's inputs, or -1; a full [M, N] tensor
                            // there is added as cuBLASLt's C instead (beta 1, no epilogue)
  int residual_input = -1;  // added as C after the bias (a residual connection), or -1
  int aux_input = -1;       // DGELU: the GELU input, an index into the op's inputs
  int aux_output = -1;      // GELU_AUX_BIAS: the output that receives GELU's input
  int result_output = 0;    // the output that receives the epilogue's result
};
std::optional<LtEpilogue> lt_epilogue_of(const ElementwiseProgram& program);

// The process's CUDA backend, or nullptr when there is no usable device.
CudaBackend* backend();
// Why backend() is nullptr ("no NVIDIA driver: ...", "no CUDA device", ...); empty if it is not.
std::string unavailable_reason();

}  // namespace loom::cuda
