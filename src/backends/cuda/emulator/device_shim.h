// backends/cuda/emulator/device_shim.h — CUDA's device-side vocabulary for a host compiler,
// so kernels.cu compiles as ordinary C++ for the emulator (block_scheduler.h runs it).
// Include it, then kernels.cu, inside a namespace of their own.
#pragma once

#include <cuda_bf16.h>  // its conversions are host functions too

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backends/cuda/emulator/block_scheduler.h"

// The toolkit's host_defines.h gives these attribute meanings for nvcc's host pass.
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// Shared memory is per block; the emulator runs one block at a time on each OS thread.
#define __shared__ static thread_local
// Kernels get internal linkage here: the host binary has its own functions named like them.
#define LOOM_KERNEL static void

#define threadIdx (::loom::cuda::emulator::current_thread().thread_idx)
#define blockIdx (::loom::cuda::emulator::current_thread().block_idx)
#define blockDim (::loom::cuda::emulator::current_thread().block_dim)
#define gridDim (::loom::cuda::emulator::current_thread().grid_dim)

inline void __syncthreads() {
  ::loom::cuda::emulator::sync_threads();
}

template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = ::loom::cuda::emulator::shuffle_xor(mask, bits, lane_mask);
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

// __syncwarp: a barrier for the 32 lanes of the warp (a shuffle that exchanges nothing).
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::loom::cuda::emulator::shuffle_xor(mask, 0, 0);
}

// Atomics: emulated threads are fibers that switch only at barriers and shuffles, so a
// read-modify-write here is never interleaved with another thread's.
template <class T>
T atomicAdd(T* address, T value) {
  T old = *address;
  *address = old + value;
  return old;
}
template <class T>
T atomicMax(T* address, T value) {
  T old = *address;
  *address = old < value ? value : old;
  return old;
}
template <class T>
T atomicCAS(T* address, T compare, T value) {
  T old = *address;
  if (old == compare)
    *address = value;
  return old;
}
inline void __threadfence() {}

// Device math the host library lacks.
inline float rsqrtf(float x) {
  return 1.0f / std::sqrt(x);
}
