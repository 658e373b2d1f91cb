// The CUDA backend's attention (causal_attention's fused qkv and attention's grouped-query
// q, k, v): batched GEMMs around softmax kernels, in chunks of query rows.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/cuda/cuda_backend_internal.h"

namespace loom::cuda {

using namespace detail;

namespace {
// Attention runs in chunks of query rows: chunk [q0, q1) needs keys [0, q1 + Tk - Tq) only,
// so the score matrices hold about half of Tq x Tk (56% with 8 chunks) and so do the GEMMs.
i64 attention_chunk(i64 T) {
  const i64 chunk = std::max<i64>(64, (T + 7) / 8);
  return (chunk + 15) / 16 * 16;
}

// Where q, k and v (and dq, dk, dv) start in their tensors: causal_attention's fused qkv
// holds them side by side in each row (columns 0, C, 2C), attention has three tensors.
struct AttentionOperands {
  device_ops::AttentionLayout l;
  bool fused;
  i64 col_k() const { return fused ? l.h * l.d : 0; }
  i64 col_v() const { return fused ? 2 * l.h * l.d : 0; }
};
AttentionOperands attention_operands(const OpCall& call, bool forward) {
  const auto& in = call.inputs;
  const std::size_t first = forward ? 0 : 1;
  if (call.op == OpId::causal_attention || call.op == OpId::causal_attention_backward)
    return {device_ops::fused_attention_layout(in[first], call.attrs.heads), true};
  return {device_ops::grouped_attention_layout(in[first], in[first + 1]), false};
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

// q, k, v as [B, H, T, D] blocks (each key/value head repeated for its H/G query heads).
void CudaBackend::split_heads(const Tensor& from, i64 ld, i64 col0, i64 t, i64 group,
                              const device_ops::AttentionLayout& l, bool bf16, Tensor& to) {
  const i64 n = l.b * l.h * t * l.d;
  run_1d("heads_split", n, ptr(from), ptr<void>(to), static_cast<int>(bf16), n, t, l.h, l.d, ld,
         col0, group);
}

// Per chunk and (batch, head): S = q k^T, then P = causal softmax(scale S) in place,
// out = P v (see kernels.cu). Scores and probabilities are f32 under f32 products and bf16
// under bf16 products (written by the GEMM, read as the next GEMM's operand, as
// PyTorch's eager attention does under autocast); the softmax itself computes in f32.
void CudaBackend::attention_forward(const OpCall& call) {
  const AttentionOperands a = attention_operands(call, true);
  const device_ops::AttentionLayout& l = a.l;
  const Tensor& q_in = call.inputs[0];
  const Tensor& k_in = a.fused ? q_in : call.inputs[1];
  const Tensor& v_in = a.fused ? q_in : call.inputs[2];
  const bool bf16 = matmul_precision_ == DType::bf16;
  const DType operand_type = bf16 ? DType::bf16 : DType::f32;
  const i64 BH = l.b * l.h, nq = BH * l.tq * l.d, nk = BH * l.tk * l.d;
  Tensor q = Tensor::empty({nq}, operand_type, *this), k = Tensor::empty({nk}, operand_type, *this),
         v = Tensor::empty({nk}, operand_type, *this), o = Tensor::empty({nq}, DType::f32, *this);
  split_heads(q_in, l.ld_q, 0, l.tq, 1, l, bf16, q);
  split_heads(k_in, l.ld_kv, a.col_k(), l.tk, l.group(), l, bf16, k);
  split_heads(v_in, l.ld_kv, a.col_v(), l.tk, l.group(), l, bf16, v);
  const i64 chunk = attention_chunk(l.tq);
  for (i64 q0 = 0; q0 < l.tq; q0 += chunk) {
    const i64 rows = std::min(chunk, l.tq - q0), keys = q0 + rows + l.offset(),
              ns = BH * rows * keys;
    Tensor s = Tensor::empty({ns}, operand_type, *this);
    gemm(false, true, rows, keys, l.d, head_operand(q, q0 * l.d, l.d, l.tq * l.d),
         head_operand(k, 0, l.d, l.tk * l.d), ptr<void>(s), keys, rows * keys, BH, 0.0f, bf16);
    run_rows("causal_softmax", BH * rows, ptr<void>(s), static_cast<int>(bf16),
             ptr(call.outputs[1]), BH * rows, rows, keys, l.tq, q0, l.offset(), l.scale());
    gemm(false, false, rows, l.d, keys, head_operand(s, 0, keys, rows * keys),
         head_operand(v, 0, l.d, l.tk * l.d), ptr(o) + q0 * l.d, l.d, l.tq * l.d, BH, 0.0f);
  }
  run_1d("heads_merge", nq, ptr(o), ptr(call.outputs[0]), nq, l.tq, l.h, l.h, l.d, l.ld_o, i64{0});
}

// Per chunk, with S recomputed and P from the saved lse: dP = dO v^T, then in place
// P and dS = scale P (dP - rowsum(dO * O)); dQ = dS k for the chunk's rows, and
// dV += P^T dO, dK += dS^T q over the keys it reaches; a key/value head's gradient is the
// sum over its query heads' blocks (heads_merge).
void CudaBackend::attention_backward(const OpCall& call) {
  const AttentionOperands a = attention_operands(call, false);
  const device_ops::AttentionLayout& l = a.l;
  const Tensor& dout = call.inputs[0];
  const Tensor& q_in = call.inputs[1];
  const Tensor& k_in = a.fused ? q_in : call.inputs[2];
  const Tensor& v_in = a.fused ? q_in : call.inputs[3];
  const Tensor& out = call.inputs[a.fused ? 2 : 4];
  const Tensor& lse = call.inputs[a.fused ? 3 : 5];
  const Tensor& dq_out = call.outputs[0];
  const Tensor& dk_out = a.fused ? dq_out : call.outputs[1];
  const Tensor& dv_out = a.fused ? dq_out : call.outputs[2];
  const bool bf16 = matmul_precision_ == DType::bf16;
  const DType operand_type = bf16 ? DType::bf16 : DType::f32;
  const i64 BH = l.b * l.h, nq = BH * l.tq * l.d, nk = BH * l.tk * l.d;
  auto scratch = [&](i64 count) { return Tensor::empty({count}, DType::f32, *this); };
  auto operand_scratch = [&](i64 count) { return Tensor::empty({count}, operand_type, *this); };
  Tensor q = operand_scratch(nq), k = operand_scratch(nk), v = operand_scratch(nk),
         d_o = operand_scratch(nq);
  split_heads(q_in, l.ld_q, 0, l.tq, 1, l, bf16, q);
  split_heads(k_in, l.ld_kv, a.col_k(), l.tk, l.group(), l, bf16, k);
  split_heads(v_in, l.ld_kv, a.col_v(), l.tk, l.group(), l, bf16, v);
  split_heads(dout, l.ld_o, 0, l.tq, 1, l, bf16, d_o);
  Tensor delta = scratch(BH * l.tq), dq = scratch(nq), dk = scratch(nk), dv = scratch(nk);
  run_1d("attention_delta", BH * l.tq, ptr(dout), ptr(out), ptr(delta), BH * l.tq, l.tq, l.h, l.d);
  run_1d("fill", nk, ptr(dk), nk, 0.0f);  // dK and dV accumulate over the chunks
  run_1d("fill", nk, ptr(dv), nk, 0.0f);
  const i64 chunk = attention_chunk(l.tq);
  for (i64 q0 = 0; q0 < l.tq; q0 += chunk) {
    const i64 rows = std::min(chunk, l.tq - q0), keys = q0 + rows + l.offset(),
              ns = BH * rows * keys;
    GemmOperand q_rows = head_operand(q, q0 * l.d, l.d, l.tq * l.d);
    GemmOperand do_rows = head_operand(d_o, q0 * l.d, l.d, l.tq * l.d);
    GemmOperand k_all = head_operand(k, 0, l.d, l.tk * l.d),
                v_all = head_operand(v, 0, l.d, l.tk * l.d);
    Tensor s = operand_scratch(ns), dp = operand_scratch(ns);
    gemm(false, true, rows, keys, l.d, q_rows, k_all, ptr<void>(s), keys, rows * keys, BH, 0.0f,
         bf16);
    gemm(false, true, rows, keys, l.d, do_rows, v_all, ptr<void>(dp), keys, rows * keys, BH, 0.0f,
         bf16);
    run_1d("attention_backward_scores", ns, ptr<void>(s), ptr<void>(dp), static_cast<int>(bf16),
           ptr(lse), ptr<const float>(delta), ns, rows, keys, l.tq, q0, l.offset(), l.scale());
    GemmOperand p = head_operand(s, 0, keys, rows * keys);
    GemmOperand ds = head_operand(dp, 0, keys, rows * keys);
    gemm(true, false, keys, l.d, rows, p, do_rows, ptr(dv), l.d, l.tk * l.d, BH, 1.0f);
    gemm(false, false, rows, l.d, keys, ds, k_all, ptr(dq) + q0 * l.d, l.d, l.tq * l.d, BH, 0.0f);
    gemm(true, false, keys, l.d, rows, ds, q_rows, ptr(dk), l.d, l.tk * l.d, BH, 1.0f);
  }
  run_1d("heads_merge", nq, ptr(dq), ptr(dq_out), nq, l.tq, l.h, l.h, l.d, l.ld_q, i64{0});
  const i64 n_kv = l.b * l.tk * l.g * l.d;
  run_1d("heads_merge", n_kv, ptr(dk), ptr(dk_out), n_kv, l.tk, l.h, l.g, l.d, l.ld_kv, a.col_k());
  run_1d("heads_merge", n_kv, ptr(dv), ptr(dv_out), n_kv, l.tk, l.h, l.g, l.d, l.ld_kv, a.col_v());
}

}  // namespace loom::cuda
