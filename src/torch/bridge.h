// torch/bridge.h — a PyTorch tensor on a loom device seen as the loom::Tensor it is: the same
// Buffer, element offset, sizes and strides (no copy), and the dtype mapping between them.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "core/tensor.h"

namespace loom::torch_device {

// Loom's dtype for a PyTorch scalar type; a PyTorch error naming `op`, the device and the
// dtype when Loom holds no such dtype.
DType loom_dtype(c10::ScalarType type, const char* op, const c10::Device& device);
c10::ScalarType torch_dtype(DType dtype);

// The loom::Tensor viewing `t`'s storage (t on a loom device).
Tensor as_loom(const at::Tensor& t, const char* op);

// Copies the values of `from` (a loom::Tensor on `to`'s device, contiguous, `to`'s shape and
// dtype) into the PyTorch tensor `to`, whatever its strides.
void write_into(const at::Tensor& to, const Tensor& from, const char* op);

// An out= operator's end: `out` resized to `result`'s shape (as PyTorch's out= ops do) and
// `result` (Loom's, contiguous, on out's device) written into it.
at::Tensor& write_result(at::Tensor& out, const Tensor& result, const char* op);

}  // namespace loom::torch_device
