// torch/ops_attention.cpp — scaled_dot_product_attention on Loom's fused attention kernel.
// PyTorch asks a device which attention it runs (_fused_sdp_choice_stub); Loom answers
// "overrideable" for what its `attention` op computes — causal, no mask, no dropout, the
// default scale 1/sqrt(D), float32, as many query as key positions, grouped-query allowed —
// and "math" (PyTorch's composite: bmm, softmax, masks) for the rest. The overrideable pair
// then runs Loom's attention and attention_backward: one kernel each way instead of a
// dozen, with Loom's log-sum-exp kept for the backward.
#include <ATen/SDPBackend.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>

#include "dispatch/dispatch.h"
#include "torch/bridge.h"
#include "torch/coverage.h"
#include "torch/runtime.h"

namespace loom::torch_device {
namespace {

bool loom_float4(const at::Tensor& t, const c10::Device& device) {
  return t.defined() && t.device() == device && t.scalar_type() == c10::ScalarType::Float &&
         t.dim() == 4;
}

int64_t choose_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool /*enable_gqa*/) {
  const c10::Device device = q.device();
  const bool taken =
      loom_float4(q, device) && loom_float4(k, device) && loom_float4(v, device) &&
      !(mask.has_value() && mask->defined()) && dropout_p == 0.0 && is_causal &&
      q.size(0) == k.size(0) && k.sizes() == v.sizes() && q.size(3) == k.size(3) &&
      q.size(2) == k.size(2) && k.size(1) > 0 && q.size(1) % k.size(1) == 0 &&
      (!scale.has_value() || std::abs(*scale - 1.0 / std::sqrt(static_cast<double>(q.size(3)))) <
                                 1e-12 * (1.0 / std::sqrt(static_cast<double>(q.size(3)))));
  return static_cast<int64_t>(taken ? at::SDPBackend::overrideable : at::SDPBackend::math);
}

// PyTorch's [B, H, T, D] as Loom's [B, T, H, D] (a view; dispatch gathers it).
Tensor heads_second(const at::Tensor& t, const char* op) {
  return as_loom(t.transpose(1, 2), op);
}

at::Tensor empty_on(const c10::Device& device) {
  return at::empty({0}, at::TensorOptions().device(device).dtype(at::kFloat));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor,
           at::Tensor, at::Tensor>
attention_forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                  const std::optional<at::Tensor>& /*attn_bias*/, double /*dropout_p*/,
                  bool /*is_causal*/, bool /*return_debug_mask*/, std::optional<double> /*scale*/) {
  // Only reached when choose_attention said overrideable.
  const c10::Device device = query.device();
  RecordedCall record("_scaled_dot_product_fused_attention_overrideable", device);
  const std::vector<Tensor> r = dispatch::call(
      OpId::attention, {heads_second(query, "attention"), heads_second(key, "attention"),
                        heads_second(value, "attention")});
  at::Tensor out = as_torch(r[0], device).transpose(1, 2);  // [B, H, T, D], a view
  at::Tensor lse = as_torch(r[1], device);                  // [B, H, T]
  const c10::SymInt tq = query.size(2), tk = key.size(2);
  auto result = std::make_tuple(out, lse, empty_on(device), empty_on(device), tq, tk,
                                empty_on(device), empty_on(device), empty_on(device));
  record.done();
  return result;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& /*attn_bias*/, std::array<bool, 4> /*mask*/,
    const at::Tensor& out, const at::Tensor& logsumexp, const at::Tensor& /*cum_seq_q*/,
    const at::Tensor& /*cum_seq_k*/, c10::SymInt /*max_q*/, c10::SymInt /*max_k*/,
    double /*dropout_p*/, bool /*is_causal*/, const at::Tensor& /*philox_seed*/,
    const at::Tensor& /*philox_offset*/, std::optional<double> /*scale*/) {
  const c10::Device device = query.device();
  RecordedCall record("_scaled_dot_product_fused_attention_overrideable_backward", device);
  const std::vector<Tensor> r = dispatch::call(
      OpId::attention_backward,
      {heads_second(grad_out, "attention_backward"), heads_second(query, "attention_backward"),
       heads_second(key, "attention_backward"), heads_second(value, "attention_backward"),
       heads_second(out, "attention_backward"),
       dispatch::contiguous(as_loom(logsumexp, "attention_backward"))});
  auto result = std::make_tuple(as_torch(r[0], device).transpose(1, 2),
                                as_torch(r[1], device).transpose(1, 2),
                                as_torch(r[2], device).transpose(1, 2), at::Tensor());
  record.done();
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_scaled_dot_product_fused_attention_overrideable", attention_forward);
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", attention_backward);
}

}  // namespace loom::torch_device

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &loom::torch_device::choose_attention);
}  // namespace at::native
