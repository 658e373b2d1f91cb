// torch/ops_conv.cpp — the image layers' ATen operators on Loom's catalog: convolution
// (convolution_overrideable and its backward, which PyTorch calls for a device of its own),
// ReLU (relu, relu_, threshold_backward), max pooling with PyTorch's indices
// (max_pool2d_with_indices and its backward) and batch normalisation in training
// (native_batch_norm and its backward, composed of Loom's reductions and elementwise ops).
// Convolutions Loom's conv2d does not take (groups, dilation, unequal strides or paddings,
// transposed) run on PyTorch's CPU kernels, counted.
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/max_pool2d_with_indices_backward_ops.h>
#include <ATen/ops/max_pool2d_with_indices_ops.h>
#include <ATen/ops/native_batch_norm_backward_ops.h>
#include <ATen/ops/native_batch_norm_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/threshold_backward_ops.h>
#include <torch/library.h>

#include <array>
#include <chrono>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "dispatch/dispatch.h"
#include "torch/bridge.h"
#include "torch/coverage.h"
#include "torch/fallback.h"
#include "torch/runtime.h"

namespace loom::torch_device {
namespace {

// Loom's conv2d: a 2-D convolution with one stride and one padding for both axes, no
// dilation, no groups. The attributes when the call is one, else empty.
std::optional<Attrs> conv2d_attrs(const at::Tensor& input, const at::Tensor& weight,
                                  c10::SymIntArrayRef stride, c10::SymIntArrayRef padding,
                                  c10::SymIntArrayRef dilation, bool transposed,
                                  c10::SymIntArrayRef output_padding, const c10::SymInt& groups) {
  const c10::Device device = input.device();
  if (!is_float_on(input, device) || !is_float_on(weight, device) || input.dim() != 4 ||
      weight.dim() != 4 || transposed || groups != 1 || stride.size() != 2 || padding.size() != 2 ||
      stride[0] != stride[1] || padding[0] != padding[1])
    return std::nullopt;
  for (const c10::SymInt& d : dilation)
    if (d != 1)
      return std::nullopt;
  for (const c10::SymInt& p : output_padding)
    if (p != 0)
      return std::nullopt;
  Attrs attrs;
  attrs.stride = stride[0].expect_int();
  attrs.padding = padding[0].expect_int();
  return attrs;
}

// The bytes of the tensors a CPU fallback copied (both ways, for the report).
std::uint64_t bytes_of(std::initializer_list<const at::Tensor*> tensors) {
  std::uint64_t bytes = 0;
  for (const at::Tensor* t : tensors)
    if (t->defined())
      bytes += t->nbytes();
  return bytes;
}

// convolution_overrideable has no CPU kernel of its own (it is the device's entry point):
// PyTorch's fallback runs at::convolution on the CPU, counted.
at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, c10::SymIntArrayRef stride,
                       c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation, bool transposed,
                       c10::SymIntArrayRef output_padding, c10::SymInt groups) {
  const c10::Device device = input.device();
  const bool with_bias = bias.has_value() && bias->defined();
  const std::optional<Attrs> attrs =
      conv2d_attrs(input, weight, stride, padding, dilation, transposed, output_padding, groups);
  if (!attrs || (with_bias && !is_float_on(*bias, device))) {
    const auto start = std::chrono::steady_clock::now();
    TORCH_CHECK_NOT_IMPLEMENTED(!fallback_is_error(), "loom: aten::convolution_overrideable on ",
                                device, " has no Loom mapping for this call (groups ", groups,
                                ", dilation ", dilation, ", transposed ", transposed,
                                ") and LOOM_TORCH_FALLBACK=error");
    const std::optional<at::Tensor> host_bias =
        with_bias ? std::optional<at::Tensor>(bias->cpu()) : std::nullopt;
    const at::Tensor out =
        at::convolution_symint(input.cpu(), weight.cpu(), host_bias, stride, padding, dilation,
                               transposed, output_padding, groups)
            .to(device);
    record_pytorch_fallback(
        "convolution_overrideable",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
        bytes_of({&input, &weight, &out}));
    return out;
  }
  RecordedCall record("convolution_overrideable", device);
  Tensor b;
  if (with_bias) {
    b = as_loom(*bias, "conv2d");
  } else {  // Loom's conv2d takes a bias: zeros
    Attrs zeros;
    zeros.shape = {weight.size(0)};
    zeros.alpha = 0.0;
    b = dispatch::call(OpId::fill, {}, zeros, &backend(device.index())).front();
  }
  const Tensor y = dispatch::call1(
      OpId::conv2d, {as_loom(input, "conv2d"), as_loom(weight, "conv2d"), b}, *attrs);
  at::Tensor out = as_torch(y, device);
  record.done();
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::SymIntArrayRef stride, c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation,
    bool transposed, c10::SymIntArrayRef output_padding, c10::SymInt groups,
    std::array<bool, 3> output_mask) {
  const c10::Device device = input.device();
  const std::optional<Attrs> attrs =
      conv2d_attrs(input, weight, stride, padding, dilation, transposed, output_padding, groups);
  if (!attrs || !is_float_on(grad_output, device)) {
    const auto start = std::chrono::steady_clock::now();
    TORCH_CHECK_NOT_IMPLEMENTED(!fallback_is_error(),
                                "loom: aten::convolution_backward_overrideable on ", device,
                                " has no Loom mapping for this call and LOOM_TORCH_FALLBACK=error");
    const std::vector<c10::SymInt> bias_sizes{c10::SymInt(weight.size(0))};
    auto [dx, dw, db] = at::convolution_backward_symint(
        grad_output.cpu(), input.cpu(), weight.cpu(), c10::SymIntArrayRef(bias_sizes), stride,
        padding, dilation, transposed, output_padding, groups, output_mask);
    auto result =
        std::make_tuple(dx.defined() ? dx.to(device) : dx, dw.defined() ? dw.to(device) : dw,
                        db.defined() ? db.to(device) : db);
    record_pytorch_fallback(
        "convolution_backward_overrideable",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
        bytes_of({&grad_output, &input, &weight, &std::get<0>(result), &std::get<1>(result),
                  &std::get<2>(result)}));
    return result;
  }
  RecordedCall record("convolution_backward_overrideable", device);
  const std::vector<Tensor> r =
      dispatch::call(OpId::conv2d_backward,
                     {as_loom(grad_output, "conv2d_backward"), as_loom(input, "conv2d_backward"),
                      as_loom(weight, "conv2d_backward")},
                     *attrs);
  auto result = std::make_tuple(output_mask[0] ? as_torch(r[0], device) : at::Tensor(),
                                output_mask[1] ? as_torch(r[1], device) : at::Tensor(),
                                output_mask[2] ? as_torch(r[2], device) : at::Tensor());
  record.done();
  return result;
}

at::Tensor relu(const at::Tensor& self) {
  if (!is_float_on(self, self.device()))
    return at::native::call_fallback_fn<&pytorch_fallback, at::_ops::relu>::call(self);
  RecordedCall record("relu", self.device());
  at::Tensor out = as_torch(dispatch::call1(OpId::relu, {as_loom(self, "relu")}), self.device());
  record.done();
  return out;
}

at::Tensor& relu_(at::Tensor& self) {
  if (!is_float_on(self, self.device()))
    return at::native::call_fallback_fn<&pytorch_fallback, at::_ops::relu_>::call(self);
  RecordedCall record("relu_", self.device());
  write_into(self, dispatch::call1(OpId::relu, {as_loom(self, "relu_")}), "relu_");
  record.done();
  return self;
}

// ReLU's backward: grad_output where self (ReLU's output) > 0, as Loom's relu_backward (whose
// x > 0 is the same mask whether x is ReLU's input or output).
at::Tensor& threshold_backward_out(const at::Tensor& grad_output, const at::Tensor& self,
                                   const at::Scalar& threshold, at::Tensor& grad_input) {
  check_one_device("threshold_backward.grad_input", grad_input, {&grad_output, &self});
  if (threshold.toDouble() != 0.0 || !is_float_on(grad_output, grad_input.device()) ||
      !is_float_on(self, grad_input.device()) || grad_input.scalar_type() != at::kFloat ||
      grad_output.sizes() != self.sizes())
    return at::native::call_fallback_fn<&pytorch_fallback,
                                        at::_ops::threshold_backward_grad_input>::call(grad_output,
                                                                                       self,
                                                                                       threshold,
                                                                                       grad_input);
  RecordedCall record("threshold_backward.grad_input", grad_input.device());
  at::Tensor& r =
      write_result(grad_input,
                   dispatch::call1(OpId::relu_backward, {as_loom(grad_output, "threshold_backward"),
                                                         as_loom(self, "threshold_backward")}),
                   "threshold_backward");
  record.done();
  return r;
}

// Batch normalisation over (N, H, W) of x [N, C, ...] per channel, as PyTorch's CPU kernel
// computes it: mean = sum(x) / n, var = sum((x - mean)^2) / n, invstd = 1 / sqrt(var + eps),
// y = (x - mean) invstd w + b; running statistics moved by momentum toward the batch's mean
// and its unbiased variance (var n / (n - 1)).
struct ChannelStats {
  std::vector<std::int64_t> axes;  // every axis but 1
  Shape kept;                      // [1, C, 1, ...]
  std::int64_t n = 1;              // elements per channel
};

ChannelStats channel_stats(const at::Tensor& x) {
  ChannelStats s;
  s.kept = Shape(static_cast<std::size_t>(x.dim()), 1);
  s.kept[1] = x.size(1);
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != 1) {
      s.axes.push_back(d);
      s.n *= x.size(d);
    }
  return s;
}

Tensor reduce(OpId op, const Tensor& x, const ChannelStats& s) {
  Attrs attrs;
  attrs.axes = s.axes;
  attrs.keepdim = true;
  return dispatch::call1(op, {x}, attrs);
}

Tensor scaled(const Tensor& x, double alpha) {
  Attrs attrs;
  attrs.alpha = alpha;
  return dispatch::call1(OpId::scale, {x}, attrs);
}

Tensor filled(const Shape& shape, double value, const c10::Device& device) {
  Attrs attrs;
  attrs.shape = shape;
  attrs.alpha = value;
  return dispatch::call(OpId::fill, {}, attrs, &backend(device.index())).front();
}

// old (1 - momentum) + momentum value, into the running statistic `running` [C].
void move_running(const at::Tensor& running, const Tensor& value, double momentum) {
  const Tensor old = as_loom(running, "batch_norm");
  const Tensor moved = dispatch::call1(
      OpId::add, {scaled(old, 1.0 - momentum), scaled(value.reshape({running.size(0)}), momentum)});
  write_into(running, moved, "batch_norm");
}

// Training mode (the running statistics, when given, moved in place); evaluation mode runs on
// PyTorch's kernels.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(
    const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps) {
  const c10::Device device = input.device();
  const bool with_running = running_mean.has_value() && running_mean->defined();
  const bool taken =
      training && is_float_on(input, device) && input.dim() >= 2 && weight.has_value() &&
      is_float_on(*weight, device) && bias.has_value() && is_float_on(*bias, device) &&
      input.numel() > input.size(1) &&
      (!with_running || (is_float_on(*running_mean, device) && running_var.has_value() &&
                         is_float_on(*running_var, device)));
  if (!taken)
    return at::native::call_fallback_fn<&pytorch_fallback, at::_ops::native_batch_norm>::call(
        input, weight, bias, running_mean, running_var, training, momentum, eps);
  RecordedCall record("native_batch_norm", device);
  const ChannelStats s = channel_stats(input);
  const Tensor x = as_loom(input, "batch_norm");
  const Tensor mean = scaled(reduce(OpId::sum, x, s), 1.0 / static_cast<double>(s.n));
  const Tensor centred = dispatch::call1(OpId::sub, {x, mean});
  const Tensor var = scaled(reduce(OpId::sum, dispatch::call1(OpId::mul, {centred, centred}), s),
                            1.0 / static_cast<double>(s.n));
  const Tensor invstd = dispatch::call1(
      OpId::div,
      {filled(s.kept, 1.0, device),
       dispatch::call1(OpId::sqrt,
                       {dispatch::call1(OpId::add, {var, filled(s.kept, eps, device)})})});
  const Tensor w = as_loom(*weight, "batch_norm").reshape(s.kept);
  const Tensor b = as_loom(*bias, "batch_norm").reshape(s.kept);
  const Tensor y = dispatch::call1(
      OpId::add,
      {dispatch::call1(OpId::mul, {dispatch::call1(OpId::mul, {centred, invstd}), w}), b});
  if (with_running) {
    move_running(*running_mean, mean, momentum);
    move_running(*running_var, scaled(var, static_cast<double>(s.n) / static_cast<double>(s.n - 1)),
                 momentum);
  }
  const std::int64_t channels = input.size(1);
  auto result = std::make_tuple(as_torch(y, device), as_torch(mean.reshape({channels}), device),
                                as_torch(invstd.reshape({channels}), device));
  record.done();
  return result;
}

// The backward of training-mode batch normalisation, as PyTorch's CPU kernel: with
// dotp = sum((x - mean) dy) and k = dotp invstd^2 / n per channel,
// dx = (dy - sum(dy) / n - (x - mean) k) invstd w, dw = dotp invstd, db = sum(dy).
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    const std::optional<at::Tensor>& save_mean, const std::optional<at::Tensor>& save_invstd,
    bool train, double eps, std::array<bool, 3> output_mask) {
  const c10::Device device = input.device();
  const bool taken = train && is_float_on(input, device) && is_float_on(grad_out, device) &&
                     weight.has_value() && is_float_on(*weight, device) && save_mean.has_value() &&
                     is_float_on(*save_mean, device) && save_invstd.has_value() &&
                     is_float_on(*save_invstd, device) && input.dim() >= 2;
  if (!taken)
    return at::native::call_fallback_fn<
        &pytorch_fallback, at::_ops::native_batch_norm_backward>::call(grad_out, input, weight,
                                                                       running_mean, running_var,
                                                                       save_mean, save_invstd,
                                                                       train, eps, output_mask);
  RecordedCall record("native_batch_norm_backward", device);
  const ChannelStats s = channel_stats(input);
  const Tensor x = as_loom(input, "batch_norm_backward");
  const Tensor dy = as_loom(grad_out, "batch_norm_backward");
  const Tensor mean = as_loom(*save_mean, "batch_norm_backward").reshape(s.kept);
  const Tensor invstd = as_loom(*save_invstd, "batch_norm_backward").reshape(s.kept);
  const Tensor centred = dispatch::call1(OpId::sub, {x, mean});
  const Tensor sum_dy = reduce(OpId::sum, dy, s);
  const Tensor dotp = reduce(OpId::sum, dispatch::call1(OpId::mul, {centred, dy}), s);
  const std::int64_t channels = input.size(1);
  at::Tensor dx_out, dw_out, db_out;
  if (output_mask[0]) {
    const double inv_n = 1.0 / static_cast<double>(s.n);
    const Tensor k = scaled(
        dispatch::call1(OpId::mul, {dispatch::call1(OpId::mul, {dotp, invstd}), invstd}), inv_n);
    const Tensor w = as_loom(*weight, "batch_norm_backward").reshape(s.kept);
    const Tensor dx = dispatch::call1(
        OpId::mul,
        {dispatch::call1(
             OpId::mul,
             {dispatch::call1(OpId::sub, {dispatch::call1(OpId::sub, {dy, scaled(sum_dy, inv_n)}),
                                          dispatch::call1(OpId::mul, {centred, k})}),
              invstd}),
         w});
    dx_out = as_torch(dx, device);
  }
  if (output_mask[1])
    dw_out = as_torch(dispatch::call1(OpId::mul, {dotp, invstd}).reshape({channels}), device);
  if (output_mask[2])
    db_out = as_torch(sum_dy.reshape({channels}), device);
  record.done();
  return std::make_tuple(dx_out, dw_out, db_out);
}

// Max pooling as Loom's max_pool2d takes it: a square window, one stride, no dilation, floor
// mode; padding p (as wide as PyTorch allows, at most half the window) is added as -inf
// borders, concatenated on the device. The window, stride and padding when the call is one.
struct Window {
  std::int64_t kernel, stride, padding;
};
std::optional<Window> square_window(at::IntArrayRef kernel, at::IntArrayRef stride,
                                    at::IntArrayRef padding, at::IntArrayRef dilation,
                                    bool ceil_mode) {
  auto same = [](at::IntArrayRef v) { return v.size() == 1 || (v.size() == 2 && v[0] == v[1]); };
  if (ceil_mode || kernel.empty() || !same(kernel) || (!stride.empty() && !same(stride)) ||
      padding.empty() || !same(padding))
    return std::nullopt;
  for (const int64_t d : dilation)
    if (d != 1)
      return std::nullopt;
  if (padding[0] < 0 || 2 * padding[0] > kernel[0])  // PyTorch's kernel names the error
    return std::nullopt;
  return Window{kernel[0], stride.empty() ? kernel[0] : stride[0], padding[0]};
}

// x [N, C, H, W] with p rows and columns of `value` around its planes.
Tensor padded(const Tensor& x, std::int64_t p, double value, const c10::Device& device) {
  if (p == 0)
    return x;
  Tensor y = x;
  for (int axis : {2, 3}) {
    Shape border = y.shape();
    border[static_cast<std::size_t>(axis)] = p;
    const Tensor edge = filled(border, value, device);
    Attrs join;
    join.axis = axis;
    y = dispatch::call1(OpId::concat, {edge, y, edge}, join);
  }
  return y;
}

bool pool_taken(const at::Tensor& self, const std::optional<Window>& w) {
  return w && is_float_on(self, self.device()) && self.dim() == 4 &&
         self.size(2) + 2 * w->padding >= w->kernel && self.size(3) + 2 * w->padding >= w->kernel;
}

// PyTorch's indices are flat h W + w in the unpadded plane; Loom's argmax is flat in the
// padded one (W + 2p wide). Converted on the host, as the embedding's ids are.
std::tuple<at::Tensor&, at::Tensor&> max_pool_out(const at::Tensor& self, at::IntArrayRef kernel,
                                                  at::IntArrayRef stride, at::IntArrayRef padding,
                                                  at::IntArrayRef dilation, bool ceil_mode,
                                                  at::Tensor& out, at::Tensor& indices) {
  const std::optional<Window> w = square_window(kernel, stride, padding, dilation, ceil_mode);
  if (!pool_taken(self, w) || out.scalar_type() != at::kFloat || indices.scalar_type() != at::kLong)
    return at::native::call_fallback_fn<
        &pytorch_fallback, at::_ops::max_pool2d_with_indices_out>::call(self, kernel, stride,
                                                                        padding, dilation,
                                                                        ceil_mode, out, indices);
  const c10::Device device = self.device();
  RecordedCall record("max_pool2d_with_indices.out", device);
  Attrs attrs;
  attrs.kernel = w->kernel;
  attrs.stride = w->stride;
  const std::vector<Tensor> r =
      dispatch::call(OpId::max_pool2d,
                     {padded(as_loom(self, "max_pool2d"), w->padding,
                             -std::numeric_limits<double>::infinity(), device)},
                     attrs);
  write_result(out, r[0], "max_pool2d");
  const std::vector<std::int32_t> argmax = r[1].to_ints();
  const int64_t width = self.size(3), padded_width = width + 2 * w->padding;
  at::Tensor host = at::empty(out.sizes(), at::TensorOptions().dtype(at::kLong));
  int64_t* flat = host.data_ptr<int64_t>();
  for (std::size_t i = 0; i < argmax.size(); ++i)
    flat[i] =
        (argmax[i] / padded_width - w->padding) * width + argmax[i] % padded_width - w->padding;
  if (indices.sizes() != host.sizes())
    indices.resize_(host.sizes());
  indices.copy_(host);
  record.done();
  return {out, indices};
}

at::Tensor& max_pool_backward_out(const at::Tensor& grad_output, const at::Tensor& self,
                                  at::IntArrayRef kernel, at::IntArrayRef stride,
                                  at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
                                  const at::Tensor& indices, at::Tensor& grad_input) {
  const std::optional<Window> w = square_window(kernel, stride, padding, dilation, ceil_mode);
  if (!pool_taken(self, w) || !is_float_on(grad_output, self.device()) ||
      grad_input.scalar_type() != at::kFloat)
    return at::native::call_fallback_fn<
        &pytorch_fallback, at::_ops::max_pool2d_with_indices_backward_grad_input>::call(grad_output,
                                                                                        self,
                                                                                        kernel,
                                                                                        stride,
                                                                                        padding,
                                                                                        dilation,
                                                                                        ceil_mode,
                                                                                        indices,
                                                                                        grad_input);
  const c10::Device device = self.device();
  RecordedCall record("max_pool2d_with_indices_backward.grad_input", device);
  const int64_t p = w->padding, width = self.size(3), padded_width = width + 2 * p;
  const at::Tensor host = indices.cpu().contiguous();
  const int64_t* flat = host.data_ptr<int64_t>();
  std::vector<std::int32_t> argmax(static_cast<std::size_t>(host.numel()));
  for (std::size_t i = 0; i < argmax.size(); ++i)
    argmax[i] =
        static_cast<std::int32_t>((flat[i] / width + p) * padded_width + flat[i] % width + p);
  Attrs attrs;
  attrs.kernel = w->kernel;
  attrs.stride = w->stride;
  attrs.shape = {self.size(0), self.size(1), self.size(2) + 2 * p, padded_width};
  const Tensor dx_padded =
      dispatch::call1(OpId::max_pool2d_backward,
                      {as_loom(grad_output, "max_pool2d_backward"),
                       Tensor::from_ints(Shape(host.sizes().begin(), host.sizes().end()), argmax,
                                         backend(device.index()))},
                      attrs);
  const Tensor dx =
      p == 0 ? dx_padded
             : dispatch::contiguous(dx_padded.slice(2, p, p + self.size(2)).slice(3, p, p + width));
  at::Tensor& r = write_result(grad_input, dx, "max_pool2d_backward");
  record.done();
  return r;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("max_pool2d_with_indices.out", max_pool_out);
  m.impl("max_pool2d_with_indices_backward.grad_input", max_pool_backward_out);
  m.impl("convolution_overrideable", convolution);
  m.impl("convolution_backward_overrideable", convolution_backward);
  m.impl("relu", relu);
  m.impl("relu_", relu_);
  m.impl("threshold_backward.grad_input", threshold_backward_out);
  m.impl("native_batch_norm", native_batch_norm);
  m.impl("native_batch_norm_backward", native_batch_norm_backward);
}

}  // namespace loom::torch_device
