// torch/fallback.h — PyTorch's CPU kernels for an ATen op on loom tensors, counted in the
// coverage report (coverage.h); an error under LOOM_TORCH_FALLBACK=error.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace loom::torch_device {

void pytorch_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace loom::torch_device
