// torch/ops_math.cpp — ATen operators mapped onto Loom's catalog: each runs through Loom's
// dispatch on the tensor's backend (native, decomposed or Loom's counted CPU fallback), and
// is recorded in the coverage report under its ATen name. A call Loom cannot take (a dtype
// other than float32, operands on two devices) goes to PyTorch's CPU kernels, counted too.
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <torch/library.h>

#include "dispatch/dispatch.h"
#include "torch/bridge.h"
#include "torch/coverage.h"
#include "torch/fallback.h"
#include "torch/runtime.h"

namespace loom::torch_device {
namespace {

at::Tensor& add_out(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha,
                    at::Tensor& out) {
  check_one_device("add.out", out, {&self, &other});
  if (!takes_float(self, out) || !takes_float(other, out) ||
      out.scalar_type() != c10::ScalarType::Float)
    return at::native::call_fallback_fn<&pytorch_fallback, at::_ops::add_out>::call(self, other,
                                                                                    alpha, out);
  RecordedCall record("add.out", out.device());
  Tensor b = float_operand(other, out, "add");
  if (alpha.toDouble() != 1.0) {  // self + alpha other
    Attrs scale;
    scale.alpha = alpha.toDouble();
    b = dispatch::call1(OpId::scale, {b}, scale);
  }
  at::Tensor& r =
      write_result(out, dispatch::call1(OpId::add, {float_operand(self, out, "add"), b}), "add");
  record.done();
  return r;
}

at::Tensor& mul_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  check_one_device("mul.out", out, {&self, &other});
  if (!takes_float(self, out) || !takes_float(other, out) ||
      out.scalar_type() != c10::ScalarType::Float)
    return at::native::call_fallback_fn<&pytorch_fallback, at::_ops::mul_out>::call(self, other,
                                                                                    out);
  RecordedCall record("mul.out", out.device());
  at::Tensor& r = write_result(out,
                               dispatch::call1(OpId::mul, {float_operand(self, out, "mul"),
                                                           float_operand(other, out, "mul")}),
                               "mul");
  record.done();
  return r;
}

at::Tensor& mm_out(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  check_one_device("mm.out", out, {&self, &mat2});
  if (self.device() != out.device() || mat2.device() != out.device() ||
      self.scalar_type() != c10::ScalarType::Float ||
      mat2.scalar_type() != c10::ScalarType::Float || out.scalar_type() != c10::ScalarType::Float)
    return at::native::call_fallback_fn<&pytorch_fallback, at::_ops::mm_out>::call(self, mat2, out);
  RecordedCall record("mm.out", out.device());
  at::Tensor& r = write_result(
      out, dispatch::call1(OpId::matmul, {as_loom(self, "mm"), as_loom(mat2, "mm")}), "mm");
  record.done();
  return r;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("add.out", add_out);
  m.impl("mul.out", mul_out);
  m.impl("mm.out", mm_out);
}

}  // namespace loom::torch_device
