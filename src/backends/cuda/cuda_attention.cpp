// The CUDA backend's causal attention: batched GEMMs around softmax kernels, in chunks of
// query rows.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/cuda/cuda_backend_internal.h"

namespace loom::cuda {

using namespace detail;

namespace {
// Causal attention runs in chunks of query rows: chunk [q0, q1) needs keys [0, q1) only,
// so the score matrices hold about half of T x T (56% with 8 chunks) and so do the GEMMs.
// qkv [B, T, 3C] with H heads of width D = C / H: B T C elements per q, k, v; scores
// scaled by 1 / sqrt(D).
struct AttentionShape {
  i64 B, T, C, H, D, BH, n;
  float scale;
};
AttentionShape attention_shape(const Tensor& qkv, i64 heads) {
  const i64 B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3, D = C / heads;
  return {B, T, C, heads, D, B * heads, B * T * C, 1.0f / std::sqrt(static_cast<float>(D))};
}

i64 attention_chunk(i64 T) {
  const i64 chunk = std::max<i64>(64, (T + 7) / 8);
  return (chunk + 15) / 16 * 16;
}
}  // namespace

// A batched GEMM operand inside attention's buffers (f32, or bf16 under bf16 products),
// from element `offset` on: matrices of leading dimension ld, one every `stride` elements.
CudaBackend::GemmOperand CudaBackend::head_operand(const Tensor& t, i64 offset, i64 ld,
                                                   i64 stride) {
  const i64 count = numel(t) - offset;
  if (t.dtype() == DType::bf16)
    return {nullptr, count, ld, stride, ptr<std::uint16_t>(t) + offset};
  return {ptr(t) + offset, count, ld, stride};
}

// Per chunk and (batch, head): S = q k^T, then P = causal softmax(scale S) in place,
// out = P v (see kernels.cu). Scores and probabilities are f32 under f32 products and bf16
// under bf16 products (written by the GEMM, read as the next GEMM's operand, as
// PyTorch's eager attention does under autocast); the softmax itself computes in f32.
void CudaBackend::attention_forward(const OpCall& call) {
  const Tensor& qkv = call.inputs[0];
  const auto [B, T, C, H, D, BH, n, scale] = attention_shape(qkv, call.attrs.heads);
  const bool bf16 = matmul_precision_ == DType::bf16;
  const DType operand_type = bf16 ? DType::bf16 : DType::f32;
  Tensor q = Tensor::empty({n}, operand_type, *this), k = Tensor::empty({n}, operand_type, *this),
         v = Tensor::empty({n}, operand_type, *this), o = Tensor::empty({n}, DType::f32, *this);
  for (auto [part, col] : {std::pair{&q, 0LL}, {&k, C}, {&v, 2 * C}})
    run_1d("heads_split", n, ptr(qkv), ptr<void>(*part), static_cast<int>(bf16), n, T, H, D, 3 * C,
           col);
  const i64 chunk = attention_chunk(T);
  for (i64 q0 = 0; q0 < T; q0 += chunk) {
    const i64 rows = std::min(chunk, T - q0), keys = q0 + rows, ns = BH * rows * keys;
    Tensor s = Tensor::empty({ns}, operand_type, *this);
    gemm(false, true, rows, keys, D, head_operand(q, q0 * D, D, T * D),
         head_operand(k, 0, D, T * D), ptr<void>(s), keys, rows * keys, BH, 0.0f, bf16);
    run_rows("causal_softmax", BH * rows, ptr<void>(s), static_cast<int>(bf16),
             ptr(call.outputs[1]), BH * rows, rows, keys, T, q0, scale);
    gemm(false, false, rows, D, keys, head_operand(s, 0, keys, rows * keys),
         head_operand(v, 0, D, T * D), ptr(o) + q0 * D, D, T * D, BH, 0.0f);
  }
  run_1d("heads_merge", n, ptr(o), ptr(call.outputs[0]), n, T, H, D, C, 0LL);
}

// Per chunk, with S recomputed and P from the saved lse: dP = dO v^T, then in place
// P and dS = scale P (dP - rowsum(dO * O)); dQ = dS k for the chunk's rows, and
// dV += P^T dO, dK += dS^T q over the keys it reaches.
void CudaBackend::attention_backward(const OpCall& call) {
  const Tensor& dout = call.inputs[0];
  const Tensor& qkv = call.inputs[1];
  const Tensor& out = call.inputs[2];
  const Tensor& lse = call.inputs[3];
  const Tensor& dqkv = call.outputs[0];
  const auto [B, T, C, H, D, BH, n, scale] = attention_shape(qkv, call.attrs.heads);
  const bool bf16 = matmul_precision_ == DType::bf16;
  const DType operand_type = bf16 ? DType::bf16 : DType::f32;
  auto scratch = [&](i64 count) { return Tensor::empty({count}, DType::f32, *this); };
  auto operand_scratch = [&](i64 count) { return Tensor::empty({count}, operand_type, *this); };
  Tensor q = operand_scratch(n), k = operand_scratch(n), v = operand_scratch(n),
         d_o = operand_scratch(n);
  for (auto [part, col] : {std::pair{&q, 0LL}, {&k, C}, {&v, 2 * C}})
    run_1d("heads_split", n, ptr(qkv), ptr<void>(*part), static_cast<int>(bf16), n, T, H, D, 3 * C,
           col);
  run_1d("heads_split", n, ptr(dout), ptr<void>(d_o), static_cast<int>(bf16), n, T, H, D, C, 0LL);
  Tensor delta = scratch(BH * T), dq = scratch(n), dk = scratch(n), dv = scratch(n);
  run_1d("attention_delta", BH * T, ptr(dout), ptr(out), ptr(delta), BH * T, T, H, D);
  run_1d("fill", n, ptr(dk), n, 0.0f);  // dK and dV accumulate over the chunks
  run_1d("fill", n, ptr(dv), n, 0.0f);
  const i64 chunk = attention_chunk(T);
  for (i64 q0 = 0; q0 < T; q0 += chunk) {
    const i64 rows = std::min(chunk, T - q0), keys = q0 + rows, ns = BH * rows * keys;
    GemmOperand q_rows = head_operand(q, q0 * D, D, T * D);
    GemmOperand do_rows = head_operand(d_o, q0 * D, D, T * D);
    GemmOperand k_all = head_operand(k, 0, D, T * D), v_all = head_operand(v, 0, D, T * D);
    Tensor s = operand_scratch(ns), dp = operand_scratch(ns);
    gemm(false, true, rows, keys, D, q_rows, k_all, ptr<void>(s), keys, rows * keys, BH, 0.0f,
         bf16);
    gemm(false, true, rows, keys, D, do_rows, v_all, ptr<void>(dp), keys, rows * keys, BH, 0.0f,
         bf16);
    run_1d("attention_backward_scores", ns, ptr<void>(s), ptr<void>(dp), static_cast<int>(bf16),
           ptr(lse), ptr<const float>(delta), ns, rows, keys, T, q0, scale);
    GemmOperand p = head_operand(s, 0, keys, rows * keys);
    GemmOperand ds = head_operand(dp, 0, keys, rows * keys);
    gemm(true, false, keys, D, rows, p, do_rows, ptr(dv), D, T * D, BH, 1.0f);
    gemm(false, false, rows, D, keys, ds, k_all, ptr(dq) + q0 * D, D, T * D, BH, 0.0f);
    gemm(true, false, keys, D, rows, ds, q_rows, ptr(dk), D, T * D, BH, 1.0f);
  }
  for (auto [part, col] : {std::pair{&dq, 0LL}, {&dk, C}, {&dv, 2 * C}})
    run_1d("heads_merge", n, ptr(*part), ptr(dqkv), n, T, H, D, 3 * C, col);
}

}  // namespace loom::cuda
