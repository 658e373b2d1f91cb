#include "backends/cuda/emulator/emulated_kernels.h"

#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/cuda/emulator/device_shim.h"
#include "backends/cuda/kernel_args.h"

namespace loom::cuda::emulator {
namespace device_code {
#include "backends/cuda/kernels.cu"
}  // namespace device_code

namespace {

// Reads each parameter from cuLaunchKernel's array as the type the kernel declares, as
// the driver does with the kernel's parameter layout, and keeps the values.
template <class... Args, std::size_t... I>
std::function<void()> bind_with(void (*kernel)(Args...), void** params, std::index_sequence<I...>) {
  auto values = std::make_shared<std::tuple<std::remove_cvref_t<Args>...>>(
      *static_cast<std::remove_cvref_t<Args>*>(params[I])...);
  return [kernel, values] { std::apply(kernel, *values); };
}
template <class... Args>
EmulatedKernel entry(const char* name, void (*kernel)(Args...)) {
  return {name,
          [kernel](void** params) {
            return bind_with(kernel, params, std::index_sequence_for<Args...>{});
          },
          {}};
}

std::vector<EmulatedKernel>& registry() {
  static std::vector<EmulatedKernel> kernels = {
#define LOOM_EMULATED_KERNEL(name) entry(#name, &device_code::name),
#include "backends/cuda/emulated_kernel_list.inc"  // generated from kernels.cu
#undef LOOM_EMULATED_KERNEL
  };
  return kernels;
}

}  // namespace

EmulatedKernel* find_kernel(const char* name) {
  for (EmulatedKernel& k : registry())
    if (k.name == name)
      return &k;
  return nullptr;
}

}  // namespace loom::cuda::emulator
