// torch/bridge.h — a PyTorch tensor on a loom device seen as the loom::Tensor it is: the same
// Buffer, element offset, sizes and strides (no copy), and the dtype mapping between them.
#pragma once

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <string>

#include "core/tensor.h"

namespace loom::torch_device {

// Loom's dtype for a PyTorch scalar type; a PyTorch error naming `op`, the device and the
// dtype when Loom holds no such dtype.
DType loom_dtype(c10::ScalarType type, const char* op, const c10::Device& device);
c10::ScalarType torch_dtype(DType dtype);

// The loom::Tensor viewing `t`'s storage (t on a loom device).
Tensor as_loom(const at::Tensor& t, const char* op);

// The loom::Tensor `t` (on loom `device`'s backend) as a PyTorch tensor over the same bytes:
// a functional operator's result, without a copy.
at::Tensor as_torch(const Tensor& t, const c10::Device& device);

// Copies the values of `from` (a loom::Tensor on `to`'s device, contiguous, `to`'s shape and
// dtype) into the PyTorch tensor `to`, whatever its strides.
void write_into(const at::Tensor& to, const Tensor& from, const char* op);

// Tensors of one op on two loom devices: a PyTorch error naming the op and both devices (a
// CPU scalar beside them, PyTorch's wrapped number, is allowed).
void check_one_device(const char* op, const at::Tensor& out,
                      std::initializer_list<const at::Tensor*> operands);

// Whether `t` is a float32 tensor on `device` (defined).
bool is_float_on(const at::Tensor& t, const c10::Device& device);

// Whether Loom's kernels take `t` as an operand of an op writing into a float32 `out`:
// float32 on out's device, or a CPU scalar (PyTorch's wrapped numbers: `x * 2.0` passes a
// double), taken as a float.
bool takes_float(const at::Tensor& t, const at::Tensor& out);
// The operand as a loom::Tensor on out's device (a CPU scalar: a new 0-d float32 tensor).
Tensor float_operand(const at::Tensor& t, const at::Tensor& out, const char* op);

// An out= operator's end: `out` resized to `result`'s shape (as PyTorch's out= ops do) and
// `result` (Loom's, contiguous, on out's device) written into it.
at::Tensor& write_result(at::Tensor& out, const Tensor& result, const char* op);

}  // namespace loom::torch_device
