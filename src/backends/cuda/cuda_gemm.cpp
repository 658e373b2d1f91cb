// The CUDA backend's products: cuBLAS GEMMs in f32 or bf16 operands, the bf16 copies of
// f32 operands kept between them, matmul and linear.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/cuda/cuda_backend_internal.h"
#include "core/broadcast.h"

namespace loom::cuda {

using namespace detail;

Tensor CudaBackend::bf16_copy_of(const float* data, i64 count) {
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  const auto end = begin + static_cast<std::uintptr_t>(count) * sizeof(float);
  {
    std::lock_guard lock(bf16_copies_mutex_);
    for (const Bf16Copy& c : bf16_copies_)
      if (c.begin == begin && c.end == end)
        return c.copy;
  }
  Tensor copy = Tensor::empty({count}, DType::bf16, *this);
  run_1d("to_bf16", count, data, ptr<void>(copy), count);
  // Kept only from the default stream: a copy made on a created stream lives in that
  // stream's order, and a later call on another stream could not see it is done.
  if (current_stream() != stream_)
    return copy;
  std::vector<Tensor> evicted;  // freed after the lock is released (release() locks it)
  {
    std::lock_guard lock(bf16_copies_mutex_);
    const std::size_t bytes = static_cast<std::size_t>(count) * 2;
    while (!bf16_copies_.empty() && bf16_copy_bytes_ + bytes > bf16_copy_budget_) {
      bf16_copy_bytes_ -= static_cast<std::size_t>(bf16_copies_.front().copy.numel()) * 2;
      evicted.push_back(std::move(bf16_copies_.front().copy));
      bf16_copies_.erase(bf16_copies_.begin());
    }
    bf16_copy_count_.store(bf16_copies_.size());
    if (bytes <= bf16_copy_budget_) {
      bf16_copies_.push_back({begin, end, copy});
      bf16_copy_bytes_ += bytes;
      bf16_copy_count_.store(bf16_copies_.size());
    }
  }
  return copy;
}

void CudaBackend::forget_copies_of(std::uintptr_t begin, std::uintptr_t end) noexcept {
  if (bf16_copy_count_.load(std::memory_order_relaxed) == 0)
    return;                   // f32 products keep no copies: launches skip the lock
  std::vector<Tensor> stale;  // freed after the lock is released (their release locks it)
  {
    std::lock_guard lock(bf16_copies_mutex_);
    for (std::size_t i = 0; i < bf16_copies_.size();) {
      Bf16Copy& c = bf16_copies_[i];
      if (c.begin < end && begin < c.end) {
        bf16_copy_bytes_ -= static_cast<std::size_t>(c.copy.numel()) * 2;
        stale.push_back(std::move(c.copy));
        bf16_copies_.erase(bf16_copies_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    bf16_copy_count_.store(bf16_copies_.size());
  }
}

void CudaBackend::gemm(bool ta, bool tb, i64 m, i64 n, i64 k, GemmOperand a, GemmOperand b, void* c,
                       i64 ldc, i64 c_stride, i64 batch, float beta, bool c_bf16) {
  if (m == 0 || n == 0 || batch == 0)
    return;
  const void* a_data = a.data;
  const void* b_data = b.data;
  cudaDataType operand_type = CUDA_R_32F;
  Tensor a16, b16;  // the operands' bf16 copies, alive until the GEMM is enqueued
  if (matmul_precision_ == DType::bf16) {
    operand_type = CUDA_R_16BF;
    if (a.bf16 == nullptr)
      a16 = bf16_copy_of(a.data, a.numel);
    if (b.bf16 == nullptr)
      b16 = bf16_copy_of(b.data, b.numel);
    a_data = a.bf16 != nullptr ? a.bf16 : ptr<void>(a16);
    b_data = b.bf16 != nullptr ? b.bf16 : ptr<void>(b16);
  } else {
    check(a.bf16 == nullptr && b.bf16 == nullptr && !c_bf16,
          "cuda: a bf16 GEMM operand or result under f32 products");
  }
  // cuBLAS is column-major: a row-major C = A B is the column-major C^T = B^T A^T.
  const float alpha = 1.0f;
  check_cublas(api_.cublasGemmStridedBatchedEx(
                   cublas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                   static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b_data,
                   operand_type, static_cast<int>(b.ld), b.batch_stride, a_data, operand_type,
                   static_cast<int>(a.ld), a.batch_stride, &beta, c,
                   c_bf16 ? CUDA_R_16BF : CUDA_R_32F, static_cast<int>(ldc), c_stride,
                   static_cast<int>(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx");
}

void CudaBackend::matmul(const OpCall& call) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  const Tensor& c = call.outputs[0];
  bool ta = call.attrs.trans_a, tb = call.attrs.trans_b;
  i64 m = c.dim(-2), n = c.dim(-1), k = ta ? a.dim(-2) : a.dim(-1);
  GemmOperand ga{ptr(a), numel(a), a.dim(-1), 0}, gb{ptr(b), numel(b), b.dim(-1), 0};
  if (k == 0) {  // an empty sum: C = 0
    run_1d("fill", numel(c), ptr(c), numel(c), 0.0f);
    return;
  }
  if (b.rank() == 2 && !ta) {  // fold the batch into M
    gemm(ta, tb, numel(c) / std::max<i64>(n, 1), n, k, ga, gb, ptr(c), n, 0, 1, 0.0f);
    return;
  }
  auto offsets = matmul_batch_offsets(a.shape(), b.shape(), c.shape());
  // One strided-batched call when each operand's matrices are evenly spaced (broadcast: 0).
  auto even = [&](auto member) {
    if (offsets.size() < 2)
      return true;
    i64 step = member(offsets[1]) - member(offsets[0]);
    for (std::size_t i = 1; i < offsets.size(); ++i)
      if (member(offsets[i]) - member(offsets[i - 1]) != step)
        return false;
    return true;
  };
  auto first = [](const auto& p) { return static_cast<i64>(p.first); };
  auto second = [](const auto& p) { return static_cast<i64>(p.second); };
  if (even(first) && even(second)) {
    ga.batch_stride = offsets.size() > 1 ? first(offsets[1]) - first(offsets[0]) : 0;
    gb.batch_stride = offsets.size() > 1 ? second(offsets[1]) - second(offsets[0]) : 0;
    gemm(ta, tb, m, n, k, ga, gb, ptr(c), n, m * n, static_cast<i64>(offsets.size()), 0.0f);
    return;
  }
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    GemmOperand ai{ga.data + first(offsets[i]), ga.numel - first(offsets[i]), ga.ld, 0};
    GemmOperand bi{gb.data + second(offsets[i]), gb.numel - second(offsets[i]), gb.ld, 0};
    gemm(ta, tb, m, n, k, ai, bi, ptr(c) + static_cast<i64>(i) * m * n, n, 0, 1, 0.0f);
  }
}

void CudaBackend::linear(const OpCall& call) {
  // y = x w (+ b): the bias is broadcast into y first and the GEMM accumulates onto it.
  const Tensor& x = call.inputs[0];
  const Tensor& w = call.inputs[1];
  const Tensor& bias = call.inputs[2];
  const Tensor& y = call.outputs[0];
  bool tb = call.attrs.trans_b;
  i64 n = y.dim(-1), k = x.dim(-1), rows = n == 0 ? 0 : numel(y) / n;
  if (bias.defined())
    run_1d("broadcast_rows", numel(y), ptr(bias), ptr(y), numel(y), n);
  if (k == 0) {
    if (!bias.defined())
      run_1d("fill", numel(y), ptr(y), numel(y), 0.0f);
    return;
  }
  gemm(false, tb, rows, n, k, {ptr(x), numel(x), k, 0}, {ptr(w), numel(w), w.dim(-1), 0}, ptr(y), n,
       0, 1, bias.defined() ? 1.0f : 0.0f);
}

}  // namespace loom::cuda
