// torch/ops_pointwise.cpp — the pointwise operators of the optimizer step and the
// activations (addcmul, addcdiv, lerp, pow, rsqrt, sigmoid, gelu), where, cat and addmm,
// composed of Loom's catalog ops in the order PyTorch's CPU kernels evaluate them, so the
// roundings match where both libraries' elementary kernels do (docs/pytorch.md). A call
// Loom cannot take runs on PyTorch's CPU kernels, counted.
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/addcdiv_ops.h>
#include <ATen/ops/addcmul_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/cat_ops.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu_backward_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/lerp_ops.h>
#include <ATen/ops/pow_ops.h>
#include <ATen/ops/result_type.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/where_ops.h>
#include <torch/library.h>

#include <cmath>
#include <string>
#include <vector>

#include "dispatch/dispatch.h"
#include "torch/bridge.h"
#include "torch/coverage.h"
#include "torch/fallback.h"
#include "torch/runtime.h"

namespace loom::torch_device {
namespace {

Tensor scale(const Tensor& x, double alpha) {
  Attrs attrs;
  attrs.alpha = alpha;
  return dispatch::call1(OpId::scale, {x}, attrs);
}

Tensor binary(OpId op, const Tensor& a, const Tensor& b) {
  return dispatch::call1(op, {a, b});
}

Tensor constant(float value, const at::Tensor& out) {
  return Tensor::from_floats({}, std::span<const float>(&value, 1), backend(out.device().index()));
}

bool all_float(const at::Tensor& out, std::initializer_list<const at::Tensor*> operands) {
  if (out.scalar_type() != c10::ScalarType::Float)
    return false;
  for (const at::Tensor* t : operands)
    if (!takes_float(*t, out))
      return false;
  return true;
}

// self + value * t1 * t2 (addcmul) and self + value * t1 / t2 (addcdiv), in PyTorch's order:
// (value t1) combined with t2, then the sum.
template <class AtenOp, OpId kCombine>
at::Tensor& addc_out(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                     const at::Scalar& value, at::Tensor& out) {
  const char* name = name_of<AtenOp>();
  check_one_device(name, out, {&self, &t1, &t2});
  if (!all_float(out, {&self, &t1, &t2}))
    return at::native::call_fallback_fn<&pytorch_fallback, AtenOp>::call(self, t1, t2, value, out);
  RecordedCall record(name, out.device());
  const Tensor combined = binary(kCombine, scale(float_operand(t1, out, name), value.toDouble()),
                                 float_operand(t2, out, name));
  write_result(out, binary(OpId::add, float_operand(self, out, name), combined), name);
  record.done();
  return out;
}

// PyTorch's lerp: |w| < 0.5 ? self + w (end - self) : end - (end - self) (1 - w).
at::Tensor& lerp_out(const at::Tensor& self, const at::Tensor& end, const at::Scalar& weight,
                     at::Tensor& out) {
  check_one_device("lerp.Scalar_out", out, {&self, &end});
  if (!all_float(out, {&self, &end}))
    return at::native::call_fallback_fn<&pytorch_fallback, at::_ops::lerp_Scalar_out>::call(
        self, end, weight, out);
  RecordedCall record("lerp.Scalar_out", out.device());
  const double w = weight.toDouble();
  const Tensor a = float_operand(self, out, "lerp"), b = float_operand(end, out, "lerp");
  const Tensor diff = binary(OpId::sub, b, a);
  write_result(out,
               std::abs(w) < 0.5 ? binary(OpId::add, a, scale(diff, w))
                                 : binary(OpId::sub, b, scale(diff, 1.0 - w)),
               "lerp");
  record.done();
  return out;
}

// x^p for the exponents PyTorch's CPU kernel computes by products, roots and reciprocals.
at::Tensor& pow_out(const at::Tensor& self, const at::Scalar& exponent, at::Tensor& out) {
  const double p = exponent.toDouble();
  const bool taken = p == 1.0 || p == 2.0 || p == 3.0 || p == 0.5 || p == -0.5 || p == -1.0;
  if (!taken || !all_float(out, {&self}) || self.device() != out.device())
    return at::native::call_fallback_fn<&pytorch_fallback, at::_ops::pow_Tensor_Scalar_out>::call(
        self, exponent, out);
  RecordedCall record("pow.Tensor_Scalar_out", out.device());
  const Tensor x = as_loom(self, "pow");
  Tensor y;
  if (p == 1.0)
    y = dispatch::contiguous(x);
  else if (p == 2.0)
    y = binary(OpId::mul, x, x);
  else if (p == 3.0)
    y = binary(OpId::mul, binary(OpId::mul, x, x), x);
  else if (p == 0.5)
    y = dispatch::call1(OpId::sqrt, {x});
  else if (p == -0.5)
    y = binary(OpId::div, constant(1.0f, out), dispatch::call1(OpId::sqrt, {x}));
  else
    y = binary(OpId::div, constant(1.0f, out), x);
  write_result(out, y, "pow");
  record.done();
  return out;
}

at::Tensor& rsqrt_out(const at::Tensor& self, at::Tensor& out) {
  if (!all_float(out, {&self}) || self.device() != out.device())
    return at::native::call_fallback_fn<&pytorch_fallback, at::_ops::rsqrt_out>::call(self, out);
  RecordedCall record("rsqrt.out", out.device());
  write_result(
      out,
      binary(OpId::div, constant(1.0f, out), dispatch::call1(OpId::sqrt, {as_loom(self, "rsqrt")})),
      "rsqrt");
  record.done();
  return out;
}

// 1 / (1 + exp(-x)).
at::Tensor& sigmoid_out(const at::Tensor& self, at::Tensor& out) {
  if (!all_float(out, {&self}) || self.device() != out.device())
    return at::native::call_fallback_fn<&pytorch_fallback, at::_ops::sigmoid_out>::call(self, out);
  RecordedCall record("sigmoid.out", out.device());
  const Tensor e = dispatch::call1(OpId::exp, {scale(as_loom(self, "sigmoid"), -1.0)});
  write_result(out,
               binary(OpId::div, constant(1.0f, out), binary(OpId::add, constant(1.0f, out), e)),
               "sigmoid");
  record.done();
  return out;
}

// approximate "tanh": Loom's gelu (GPT-2's form); "none": x/2 (1 + erf(x / sqrt 2)).
at::Tensor& gelu_out(const at::Tensor& self, c10::string_view approximate, at::Tensor& out) {
  if (!all_float(out, {&self}) || self.device() != out.device())
    return at::native::call_fallback_fn<&pytorch_fallback, at::_ops::gelu_out>::call(
        self, approximate, out);
  RecordedCall record("gelu.out", out.device());
  const Tensor x = as_loom(self, "gelu");
  if (approximate == "tanh") {
    write_result(out, dispatch::call1(OpId::gelu, {x}), "gelu");
  } else {
    const Tensor cdf =
        binary(OpId::add, constant(1.0f, out), dispatch::call1(OpId::erf, {scale(x, M_SQRT1_2)}));
    write_result(out, binary(OpId::mul, scale(x, 0.5), cdf), "gelu");
  }
  record.done();
  return out;
}

// tanh form: Loom's gelu_backward; exact form, in PyTorch's order: dy (cdf + x pdf), cdf =
// (1 + erf(x / sqrt 2)) / 2, pdf = exp(-x^2 / 2) / sqrt(2 pi).
at::Tensor& gelu_backward_out(const at::Tensor& grad_output, const at::Tensor& self,
                              c10::string_view approximate, at::Tensor& grad_input) {
  if (!all_float(grad_input, {&grad_output, &self}) || self.device() != grad_input.device() ||
      grad_output.device() != grad_input.device())
    return at::native::call_fallback_fn<&pytorch_fallback,
                                        at::_ops::gelu_backward_grad_input>::call(grad_output, self,
                                                                                  approximate,
                                                                                  grad_input);
  RecordedCall record("gelu_backward.grad_input", grad_input.device());
  const Tensor dy = as_loom(grad_output, "gelu_backward"), x = as_loom(self, "gelu_backward");
  if (approximate == "tanh") {
    write_result(grad_input, binary(OpId::gelu_backward, dy, x), "gelu_backward");
  } else {
    constexpr double kBeta = M_2_SQRTPI * M_SQRT1_2 * 0.5;  // 1 / sqrt(2 pi)
    const Tensor cdf = scale(binary(OpId::add, constant(1.0f, grad_input),
                                    dispatch::call1(OpId::erf, {scale(x, M_SQRT1_2)})),
                             0.5);
    const Tensor pdf =
        scale(dispatch::call1(OpId::exp, {scale(binary(OpId::mul, x, x), -0.5)}), kBeta);
    write_result(grad_input,
                 binary(OpId::mul, dy, binary(OpId::add, cdf, binary(OpId::mul, x, pdf))),
                 "gelu_backward");
  }
  record.done();
  return grad_input;
}

at::Tensor& where_out(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other,
                      at::Tensor& out) {
  check_one_device("where.self_out", out, {&condition, &self, &other});
  if (!all_float(out, {&self, &other}) || condition.device() != out.device() ||
      condition.scalar_type() != c10::ScalarType::Bool)
    return at::native::call_fallback_fn<&pytorch_fallback, at::_ops::where_self_out>::call(
        condition, self, other, out);
  RecordedCall record("where.self_out", out.device());
  write_result(
      out,
      dispatch::call1(OpId::where, {as_loom(condition, "where"), float_operand(self, out, "where"),
                                    float_operand(other, out, "where")}),
      "where");
  record.done();
  return out;
}

// The functional form reaches the device too (its composite kernel is the CPU's): a fresh
// result, then the out= form.
at::Tensor where_self(const at::Tensor& condition, const at::Tensor& self,
                      const at::Tensor& other) {
  const at::Tensor& on_device = self.device().is_privateuseone() ? self : other;
  at::Tensor out = at::empty({0}, on_device.options().dtype(at::result_type(self, other)));
  return where_out(condition, self, other, out);
}

at::Tensor& cat_out(const at::ITensorListRef& tensors, int64_t dim, at::Tensor& out) {
  std::vector<Tensor> parts;
  bool taken = out.scalar_type() == c10::ScalarType::Float;
  int64_t rank = -1;
  for (const at::Tensor& t : tensors) {
    check_one_device("cat.out", out, {&t});
    taken = taken && t.device() == out.device() && t.scalar_type() == c10::ScalarType::Float &&
            t.numel() > 0 && (rank < 0 || t.dim() == rank);
    rank = t.dim();
  }
  if (!taken || rank <= 0)
    return at::native::call_fallback_fn<&pytorch_fallback, at::_ops::cat_out>::call(tensors, dim,
                                                                                    out);
  RecordedCall record("cat.out", out.device());
  for (const at::Tensor& t : tensors)
    parts.push_back(as_loom(t, "cat"));
  Attrs attrs;
  attrs.axis = c10::maybe_wrap_dim(dim, rank);
  write_result(out, dispatch::call(OpId::concat, parts, attrs).front(), "cat");
  record.done();
  return out;
}

// beta self + alpha (mat1 mat2); Linear's forward (beta = alpha = 1, self its bias).
at::Tensor& addmm_out(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                      const at::Scalar& beta, const at::Scalar& alpha, at::Tensor& out) {
  check_one_device("addmm.out", out, {&self, &mat1, &mat2});
  if (!all_float(out, {&self, &mat1, &mat2}) || mat1.device() != out.device() ||
      mat2.device() != out.device())
    return at::native::call_fallback_fn<&pytorch_fallback, at::_ops::addmm_out>::call(
        self, mat1, mat2, beta, alpha, out);
  RecordedCall record("addmm.out", out.device());
  Tensor product = binary(OpId::matmul, as_loom(mat1, "addmm"), as_loom(mat2, "addmm"));
  if (alpha.toDouble() != 1.0)
    product = scale(product, alpha.toDouble());
  Tensor result = product;
  if (beta.toDouble() != 0.0) {  // beta 0: self is ignored, NaN or not (PyTorch's rule)
    Tensor bias = float_operand(self, out, "addmm");
    if (beta.toDouble() != 1.0)
      bias = scale(bias, beta.toDouble());
    result = binary(OpId::add, bias, product);
  }
  write_result(out, result, "addmm");
  record.done();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("addcmul.out", addc_out<at::_ops::addcmul_out, OpId::mul>);
  m.impl("addcdiv.out", addc_out<at::_ops::addcdiv_out, OpId::div>);
  m.impl("lerp.Scalar_out", lerp_out);
  m.impl("pow.Tensor_Scalar_out", pow_out);
  m.impl("rsqrt.out", rsqrt_out);
  m.impl("sigmoid.out", sigmoid_out);
  m.impl("gelu.out", gelu_out);
  m.impl("gelu_backward.grad_input", gelu_backward_out);
  m.impl("where.self_out", where_out);
  m.impl("where.self", where_self);
  m.impl("cat.out", cat_out);
  m.impl("addmm.out", addmm_out);
}

}  // namespace loom::torch_device
