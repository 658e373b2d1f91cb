// torch/ops_nn.cpp — the network layers' ATen operators on Loom's catalog: LayerNorm
// (native_layer_norm and its backward, over the last dimension) and the embedding
// (index_select along dimension 0 and embedding_dense_backward). Their results are Loom's
// tensors handed to PyTorch without a copy. Indices arrive as int64; Loom's kernels take
// int32, so they are converted on the host (a copy of the indices, not of the table).
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/embedding_dense_backward_ops.h>
#include <ATen/ops/index_select_ops.h>
#include <ATen/ops/native_layer_norm_backward_ops.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <ATen/ops/nll_loss_backward_ops.h>
#include <ATen/ops/nll_loss_forward_ops.h>
#include <torch/library.h>

#include <ATen/core/Reduction.h>
#include <limits>
#include <optional>
#include <tuple>

#include "dispatch/dispatch.h"
#include "torch/bridge.h"
#include "torch/coverage.h"
#include "torch/fallback.h"
#include "torch/runtime.h"

namespace loom::torch_device {
namespace {

// Integer indices on a loom device as Loom's int32 ids on the same backend, or undefined when
// one lies outside int32 (the caller then falls back).
Tensor int32_ids(const at::Tensor& index) {
  const at::Tensor host = index.cpu().to(at::kLong).contiguous();
  const int64_t* values = host.data_ptr<int64_t>();
  std::vector<std::int32_t> ids(static_cast<std::size_t>(host.numel()));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (values[i] < 0 || values[i] > std::numeric_limits<std::int32_t>::max())
      return Tensor();
    ids[i] = static_cast<std::int32_t>(values[i]);
  }
  return Tensor::from_ints(Shape(host.sizes().begin(), host.sizes().end()), ids,
                           backend(index.device().index()));
}

at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  const bool taken = is_float_on(self, self.device()) && self.dim() == 2 &&
                     c10::maybe_wrap_dim(dim, self.dim()) == 0 && index.dim() <= 1 &&
                     index.device() == self.device() &&
                     (index.scalar_type() == at::kLong || index.scalar_type() == at::kInt);
  const Tensor ids = taken ? int32_ids(index) : Tensor();
  if (!ids.defined())
    return at::native::call_fallback_fn<&pytorch_fallback, at::_ops::index_select>::call(self, dim,
                                                                                         index);
  RecordedCall record("index_select", self.device());
  // A row index beyond the table is the kernel's named error, as PyTorch's is.
  const Tensor rows = dispatch::call1(OpId::embedding, {as_loom(self, "index_select"), ids});
  at::Tensor out = as_torch(rows, self.device());
  record.done();
  return index.dim() == 0 ? out.view({self.size(1)}) : out;
}

at::Tensor embedding_dense_backward(const at::Tensor& grad_output, const at::Tensor& indices,
                                    c10::SymInt num_weights, c10::SymInt padding_idx,
                                    bool scale_grad_by_freq) {
  const bool taken = is_float_on(grad_output, grad_output.device()) &&
                     indices.device() == grad_output.device() && padding_idx == -1 &&
                     !scale_grad_by_freq;
  const Tensor ids = taken ? int32_ids(indices.reshape(-1)) : Tensor();
  if (!ids.defined())
    return at::native::call_fallback_fn_symint<
        &pytorch_fallback, at::_ops::embedding_dense_backward>::call(grad_output, indices,
                                                                     num_weights, padding_idx,
                                                                     scale_grad_by_freq);
  RecordedCall record("embedding_dense_backward", grad_output.device());
  const int64_t width = grad_output.size(-1);
  Attrs attrs;
  attrs.shape = {num_weights.expect_int(), width};
  const Tensor dy = as_loom(grad_output, "embedding_dense_backward").reshape({ids.numel(), width});
  at::Tensor out =
      as_torch(dispatch::call1(OpId::embedding_backward, {dispatch::contiguous(dy), ids}, attrs),
               grad_output.device());
  record.done();
  return out;
}

// The leading dimensions' shape of a norm over the last dimension, and PyTorch's shape for
// its mean and rstd ([..., 1]).
std::tuple<Shape, Shape> norm_shapes(const at::Tensor& input) {
  Shape rows(input.sizes().begin(), input.sizes().end() - 1), kept = rows;
  kept.push_back(1);
  return {rows, kept};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm(
    const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps) {
  const c10::Device device = input.device();
  const bool taken = is_float_on(input, device) && normalized_shape.size() == 1 &&
                     input.dim() >= 1 && weight.has_value() && is_float_on(*weight, device) &&
                     bias.has_value() && is_float_on(*bias, device);
  if (!taken)
    return at::native::call_fallback_fn_symint<&pytorch_fallback,
                                               at::_ops::native_layer_norm>::call(input,
                                                                                  normalized_shape,
                                                                                  weight, bias,
                                                                                  eps);
  RecordedCall record("native_layer_norm", device);
  Attrs attrs;
  attrs.eps = eps;
  const std::vector<Tensor> r = dispatch::call(
      OpId::layer_norm,
      {as_loom(input, "layer_norm"), as_loom(*weight, "layer_norm"), as_loom(*bias, "layer_norm")},
      attrs);
  const Shape kept = std::get<1>(norm_shapes(input));
  auto result = std::make_tuple(as_torch(r[0], device), as_torch(r[1].reshape(kept), device),
                                as_torch(r[2].reshape(kept), device));
  record.done();
  return result;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
    const at::Tensor& mean, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, std::array<bool, 3> output_mask) {
  const c10::Device device = input.device();
  const bool taken = is_float_on(input, device) && is_float_on(grad_out, device) &&
                     is_float_on(mean, device) && is_float_on(rstd, device) &&
                     normalized_shape.size() == 1 && weight.has_value() &&
                     is_float_on(*weight, device);
  if (!taken)
    return at::native::call_fallback_fn_symint<
        &pytorch_fallback, at::_ops::native_layer_norm_backward>::call(grad_out, input,
                                                                       normalized_shape, mean, rstd,
                                                                       weight, bias, output_mask);
  RecordedCall record("native_layer_norm_backward", device);
  const Shape rows = std::get<0>(norm_shapes(input));
  const std::vector<Tensor> r = dispatch::call(
      OpId::layer_norm_backward,
      {as_loom(grad_out, "layer_norm_backward"), as_loom(input, "layer_norm_backward"),
       as_loom(*weight, "layer_norm_backward"),
       dispatch::contiguous(as_loom(mean, "layer_norm_backward")).reshape(rows),
       dispatch::contiguous(as_loom(rstd, "layer_norm_backward")).reshape(rows)});
  auto result = std::make_tuple(output_mask[0] ? as_torch(r[0], device) : at::Tensor(),
                                output_mask[1] ? as_torch(r[1], device) : at::Tensor(),
                                output_mask[2] ? as_torch(r[2], device) : at::Tensor());
  record.done();
  return result;
}

// The negative log-likelihood of log-probabilities `self` [N, C] at `target` [N]: the
// picked entries are gathered as rows of self seen as an [N C, 1] table (ids i C + t_i, made
// on the host from the targets, the ignored ones left out), so the loss is Loom's gather and
// sum and its gradient Loom's scatter. Empty when Loom does not take the call.
struct Picks {
  Tensor ids;         // [K] int32 on the device
  std::int64_t kept;  // K
};
std::optional<Picks> picks(const at::Tensor& self, const at::Tensor& target,
                           const std::optional<at::Tensor>& weight, int64_t reduction,
                           int64_t ignore_index) {
  const c10::Device device = self.device();
  if (!is_float_on(self, device) || self.dim() != 2 || target.dim() != 1 ||
      target.device() != device || target.scalar_type() != at::kLong ||
      target.size(0) != self.size(0) || (weight.has_value() && weight->defined()) ||
      (reduction != at::Reduction::Mean && reduction != at::Reduction::Sum))
    return std::nullopt;
  const at::Tensor host = target.cpu().contiguous();
  const int64_t* t = host.data_ptr<int64_t>();
  const int64_t classes = self.size(1);
  std::vector<std::int32_t> ids;
  for (int64_t i = 0; i < host.numel(); ++i) {
    if (t[i] == ignore_index)
      continue;
    if (t[i] < 0 || t[i] >= classes ||
        i * classes + t[i] > std::numeric_limits<std::int32_t>::max())
      return std::nullopt;  // PyTorch's kernel names the bad target
    ids.push_back(static_cast<std::int32_t>(i * classes + t[i]));
  }
  if (ids.empty())
    return std::nullopt;
  const auto kept = static_cast<std::int64_t>(ids.size());
  return Picks{Tensor::from_ints({kept}, ids, backend(device.index())), kept};
}

std::tuple<at::Tensor&, at::Tensor&> nll_loss_forward(
    const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
    int64_t reduction, c10::SymInt ignore_index, at::Tensor& output, at::Tensor& total_weight) {
  const std::optional<Picks> p =
      output.scalar_type() == at::kFloat && total_weight.scalar_type() == at::kFloat
          ? picks(self, target, weight, reduction, ignore_index.expect_int())
          : std::nullopt;
  if (!p)
    return at::native::call_fallback_fn_symint<
        &pytorch_fallback, at::_ops::nll_loss_forward_output>::call(self, target, weight, reduction,
                                                                    ignore_index, output,
                                                                    total_weight);
  RecordedCall record("nll_loss_forward.output", self.device());
  const Tensor table = dispatch::contiguous(as_loom(self, "nll_loss")).reshape({self.numel(), 1});
  const Tensor picked = dispatch::call1(OpId::embedding, {table, p->ids});
  Attrs negate;
  negate.alpha = reduction == at::Reduction::Mean ? -1.0 / static_cast<double>(p->kept) : -1.0;
  write_result(output, dispatch::call1(OpId::scale, {dispatch::call1(OpId::sum, {picked})}, negate),
               "nll_loss");
  Attrs count;
  count.shape = {};
  count.alpha = static_cast<double>(p->kept);
  write_result(total_weight,
               dispatch::call(OpId::fill, {}, count, &backend(self.device().index())).front(),
               "nll_loss");
  record.done();
  return {output, total_weight};
}

at::Tensor& nll_loss_backward(const at::Tensor& grad_output, const at::Tensor& self,
                              const at::Tensor& target, const std::optional<at::Tensor>& weight,
                              int64_t reduction, c10::SymInt ignore_index,
                              const at::Tensor& total_weight, at::Tensor& grad_input) {
  const std::optional<Picks> p =
      is_float_on(grad_output, self.device()) && grad_output.dim() == 0 &&
              is_float_on(total_weight, self.device()) && grad_input.scalar_type() == at::kFloat
          ? picks(self, target, weight, reduction, ignore_index.expect_int())
          : std::nullopt;
  if (!p)
    return at::native::call_fallback_fn_symint<
        &pytorch_fallback, at::_ops::nll_loss_backward_grad_input>::call(grad_output, self, target,
                                                                         weight, reduction,
                                                                         ignore_index, total_weight,
                                                                         grad_input);
  RecordedCall record("nll_loss_backward.grad_input", self.device());
  // Each picked entry's gradient: -dloss / total weight (mean) or -dloss (sum).
  Attrs negate;
  negate.alpha = -1.0;
  Tensor g = dispatch::call1(OpId::scale, {as_loom(grad_output, "nll_loss_backward")}, negate);
  if (reduction == at::Reduction::Mean)
    g = dispatch::call1(OpId::div, {g, as_loom(total_weight, "nll_loss_backward")});
  Attrs rows;
  rows.shape = {p->kept, 1};
  const Tensor dy = dispatch::call1(OpId::expand, {g}, rows);
  Attrs table;
  table.shape = {self.numel(), 1};
  const Tensor grad = dispatch::call1(OpId::embedding_backward, {dy, p->ids}, table);
  write_result(grad_input, grad.reshape({self.size(0), self.size(1)}), "nll_loss_backward");
  record.done();
  return grad_input;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("nll_loss_forward.output", nll_loss_forward);
  m.impl("nll_loss_backward.grad_input", nll_loss_backward);
  m.impl("index_select", index_select);
  m.impl("embedding_dense_backward", embedding_dense_backward);
  m.impl("native_layer_norm", native_layer_norm);
  m.impl("native_layer_norm_backward", native_layer_norm_backward);
}

}  // namespace loom::torch_device
