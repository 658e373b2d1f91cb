// backends/cuda/emulator/emulated_kernels.h — Loom's CUDA kernels compiled for the CPU,
// found by name as cuModuleGetFunction finds them in the fatbin.
#pragma once

#include <functional>
#include <string>

#include "backends/cuda/emulator/block_scheduler.h"

namespace loom::cuda::emulator {

struct EmulatedKernel {
  std::string name;
  // Copies the values of cuLaunchKernel's parameter array (one pointer per kernel
  // parameter, each pointing at a value of that parameter's type), as the driver does
  // before cuLaunchKernel returns, into a call of the kernel for the current thread: the
  // launch may run after the caller's parameter values are gone.
  std::function<std::function<void()>(void** params)> bind;
  KernelProfile profile;
};

// The kernel named `name` in kernels.cu, or nullptr.
EmulatedKernel* find_kernel(const char* name);

}  // namespace loom::cuda::emulator
