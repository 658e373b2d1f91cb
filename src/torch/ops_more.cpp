// torch/ops_more.cpp — more ATen operators on Loom's catalog: the elementwise functions,
// sums and means, the softmax family along the last dimension and batched products: what
// the GPT- and Llama-shaped training loops send to a device most often (docs/pytorch.md).
// Each runs through Loom's dispatch and is recorded under its ATen name; a call Loom cannot
// take (a dtype other than float32, a softmax along another dimension) runs on PyTorch's CPU
// kernels through the counted fallback.
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_log_softmax_backward_data_ops.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_softmax_backward_data_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/erf_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/log_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/sqrt_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <torch/library.h>

#include <string>

#include "dispatch/dispatch.h"
#include "torch/bridge.h"
#include "torch/coverage.h"
#include "torch/fallback.h"
#include "torch/runtime.h"

namespace loom::torch_device {
namespace {

bool float_on(const at::Tensor& out, std::initializer_list<const at::Tensor*> inputs) {
  if (out.scalar_type() != c10::ScalarType::Float)
    return false;
  for (const at::Tensor* t : inputs)
    if (t->device() != out.device() || t->scalar_type() != c10::ScalarType::Float)
      return false;
  return true;
}

// out = f(self), f Loom's `kOp` (with `attrs`).
template <class AtenOp, OpId kOp>
at::Tensor& unary(const at::Tensor& self, at::Tensor& out) {
  if (!float_on(out, {&self}))
    return at::native::call_fallback_fn<&pytorch_fallback, AtenOp>::call(self, out);
  RecordedCall record(name_of<AtenOp>(), out.device());
  Attrs attrs;
  if constexpr (kOp == OpId::scale)
    attrs.alpha = -1.0;  // neg
  write_result(out, dispatch::call1(kOp, {as_loom(self, name_of<AtenOp>())}, attrs),
               name_of<AtenOp>());
  record.done();
  return out;
}

at::Tensor& sub_out(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha,
                    at::Tensor& out) {
  using Op = at::_ops::sub_out;
  if (!float_on(out, {&self, &other}))
    return at::native::call_fallback_fn<&pytorch_fallback, Op>::call(self, other, alpha, out);
  RecordedCall record(name_of<Op>(), out.device());
  Tensor b = as_loom(other, "sub");
  if (alpha.toDouble() != 1.0) {
    Attrs scale;
    scale.alpha = alpha.toDouble();
    b = dispatch::call1(OpId::scale, {b}, scale);
  }
  write_result(out, dispatch::call1(OpId::sub, {as_loom(self, "sub"), b}), "sub");
  record.done();
  return out;
}

at::Tensor& div_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  using Op = at::_ops::div_out;
  check_one_device("div.out", out, {&self, &other});
  if (out.scalar_type() != c10::ScalarType::Float || !takes_float(self, out) ||
      !takes_float(other, out))
    return at::native::call_fallback_fn<&pytorch_fallback, Op>::call(self, other, out);
  RecordedCall record(name_of<Op>(), out.device());
  write_result(out,
               dispatch::call1(OpId::div,
                               {float_operand(self, out, "div"), float_operand(other, out, "div")}),
               "div");
  record.done();
  return out;
}

// The axes `dim` names in a tensor of `rank` dimensions (none or empty: all).
std::vector<std::int64_t> axes_of(at::OptionalIntArrayRef dim, std::int64_t rank) {
  std::vector<std::int64_t> axes;
  if (dim.has_value())
    for (std::int64_t d : *dim)
      axes.push_back(c10::maybe_wrap_dim(d, rank));
  return axes;
}

template <class AtenOp, OpId kOp>
at::Tensor& reduce(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                   std::optional<at::ScalarType> dtype, at::Tensor& out) {
  if (!float_on(out, {&self}) || (dtype.has_value() && *dtype != c10::ScalarType::Float) ||
      self.dim() == 0)
    return at::native::call_fallback_fn<&pytorch_fallback, AtenOp>::call(self, dim, keepdim, dtype,
                                                                         out);
  RecordedCall record(name_of<AtenOp>(), out.device());
  Attrs attrs;
  attrs.axes = axes_of(dim, self.dim());
  attrs.keepdim = keepdim;
  write_result(out, dispatch::call1(kOp, {as_loom(self, name_of<AtenOp>())}, attrs),
               name_of<AtenOp>());
  record.done();
  return out;
}

// softmax and log_softmax: Loom's take the last dimension.
template <class AtenOp, OpId kOp>
at::Tensor& softmax(const at::Tensor& self, int64_t dim, bool half_to_float, at::Tensor& out) {
  if (!float_on(out, {&self}) || half_to_float || self.dim() == 0 ||
      c10::maybe_wrap_dim(dim, self.dim()) != self.dim() - 1)
    return at::native::call_fallback_fn<&pytorch_fallback, AtenOp>::call(self, dim, half_to_float,
                                                                         out);
  RecordedCall record(name_of<AtenOp>(), out.device());
  write_result(out, dispatch::call1(kOp, {as_loom(self, name_of<AtenOp>())}), name_of<AtenOp>());
  record.done();
  return out;
}

template <class AtenOp, OpId kOp>
at::Tensor& softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                             at::ScalarType input_dtype, at::Tensor& grad_input) {
  if (!float_on(grad_input, {&grad_output, &output}) || input_dtype != c10::ScalarType::Float ||
      output.dim() == 0 || c10::maybe_wrap_dim(dim, output.dim()) != output.dim() - 1)
    return at::native::call_fallback_fn<&pytorch_fallback, AtenOp>::call(grad_output, output, dim,
                                                                         input_dtype, grad_input);
  RecordedCall record(name_of<AtenOp>(), grad_input.device());
  write_result(grad_input,
               dispatch::call1(kOp, {as_loom(grad_output, name_of<AtenOp>()),
                                     as_loom(output, name_of<AtenOp>())}),
               name_of<AtenOp>());
  record.done();
  return grad_input;
}

at::Tensor& bmm_out(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  using Op = at::_ops::bmm_out;
  if (!float_on(out, {&self, &mat2}))
    return at::native::call_fallback_fn<&pytorch_fallback, Op>::call(self, mat2, out);
  RecordedCall record(name_of<Op>(), out.device());
  write_result(out, dispatch::call1(OpId::matmul, {as_loom(self, "bmm"), as_loom(mat2, "bmm")}),
               "bmm");
  record.done();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("sub.out", sub_out);
  m.impl("div.out", div_out);
  m.impl("neg.out", unary<at::_ops::neg_out, OpId::scale>);
  m.impl("sqrt.out", unary<at::_ops::sqrt_out, OpId::sqrt>);
  m.impl("exp.out", unary<at::_ops::exp_out, OpId::exp>);
  m.impl("log.out", unary<at::_ops::log_out, OpId::log>);
  m.impl("tanh.out", unary<at::_ops::tanh_out, OpId::tanh>);
  m.impl("erf.out", unary<at::_ops::erf_out, OpId::erf>);
  m.impl("silu.out", unary<at::_ops::silu_out, OpId::silu>);
  m.impl("sum.IntList_out", reduce<at::_ops::sum_IntList_out, OpId::sum>);
  m.impl("mean.out", reduce<at::_ops::mean_out, OpId::mean>);
  m.impl("_softmax.out", softmax<at::_ops::_softmax_out, OpId::softmax>);
  m.impl("_log_softmax.out", softmax<at::_ops::_log_softmax_out, OpId::log_softmax>);
  m.impl("_softmax_backward_data.out",
         softmax_backward<at::_ops::_softmax_backward_data_out, OpId::softmax_backward>);
  m.impl("_log_softmax_backward_data.out",
         softmax_backward<at::_ops::_log_softmax_backward_data_out, OpId::log_softmax_backward>);
  m.impl("bmm.out", bmm_out);
}

}  // namespace loom::torch_device
