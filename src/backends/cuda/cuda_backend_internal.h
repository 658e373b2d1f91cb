// backends/cuda/cuda_backend_internal.h — what the CUDA backend's source files share:
// tensor addresses, launch shapes and the kernel launchers. Not for use outside
// backends/cuda.
#pragma once

#include <algorithm>
#include <cstddef>

#include "backends/cuda/cuda_backend.h"
#include "core/error.h"

namespace loom::cuda::detail {

using i64 = long long;
constexpr unsigned kBlock = 256;  // threads per block of the 1-D and row kernels
constexpr unsigned kRowsPerBlock = kBlock / 32;

inline CUdeviceptr address(const Buffer& b, std::size_t offset) {
  return reinterpret_cast<CUdeviceptr>(b.data()) + offset;
}
template <class T = float>
T* ptr(const Tensor& t) {
  if (!t.defined())
    return nullptr;
  return reinterpret_cast<T*>(static_cast<std::byte*>(t.storage()->data()) +
                              static_cast<std::size_t>(t.offset()) * dtype_size(t.dtype()));
}
inline i64 numel(const Tensor& t) {
  return static_cast<i64>(t.numel());
}

}  // namespace loom::cuda::detail

namespace loom::cuda {

template <class... Args>
void CudaBackend::run(const char* name, unsigned grid_x, unsigned grid_y, unsigned block_x,
                      unsigned block_y, Args... args) {
  if (grid_x == 0 || grid_y == 0)
    return;
  // cuLaunchKernel copies the parameter values before it returns.
  void* params[] = {const_cast<void*>(static_cast<const void*>(&args))...};
  check_cu(api_.cuLaunchKernel(function(name), grid_x, grid_y, 1, block_x, block_y, 1, 0,
                               current_stream(), params, nullptr),
           name);
}

template <class... Args>
void CudaBackend::run_1d(const char* name, detail::i64 n, Args... args) {
  // Grid-stride kernels: a bounded grid covers any n.
  using namespace detail;
  i64 blocks = std::min<i64>((n + kBlock - 1) / kBlock, 65536);
  run(name, static_cast<unsigned>(blocks), 1, kBlock, 1, args...);
}

template <class... Args>
void CudaBackend::run_rows(const char* name, detail::i64 rows, Args... args) {
  using namespace detail;
  run(name, static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), 1, kBlock, 1,
      args...);
}

}  // namespace loom::cuda
