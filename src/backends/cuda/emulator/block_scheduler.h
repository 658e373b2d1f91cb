// backends/cuda/emulator/block_scheduler.h — runs a CUDA kernel's threads on the CPU.
//
// The emulator compiles Loom's CUDA kernels as ordinary C++ (device_shim.h) and runs each
// launch here: blocks one after another; inside a block, every CUDA thread is a fiber
// (ucontext) that runs until it reaches a synchronisation point (__syncthreads or a warp
// shuffle), so threads meet at barriers exactly as the CUDA model requires. The
// scheduler checks what hardware would leave undefined: a barrier some threads skip, a
// shuffle with exited lanes or a partial warp, a deadlock. Each is a loom::Error naming
// the kernel. A kernel whose first launch never synchronised runs later launches without
// fibers (one plain call per thread); if such a launch ever reaches a barrier, that too
// is an error, never a wrong result.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace loom::cuda::emulator {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  unsigned count() const { return x * y * z; }
};

// What one emulated thread sees: CUDA's built-in threadIdx, blockIdx, blockDim, gridDim.
struct ThreadState {
  Dim3 thread_idx, block_idx, block_dim, grid_dim;
  unsigned linear = 0;  // threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)
};

// The thread the calling code runs as (valid only inside a kernel launch).
const ThreadState& current_thread();

// __syncthreads(): wait until every live thread of the block reaches the barrier.
void sync_threads();
// __shfl_xor_sync(mask, value, lane_mask) on the bit pattern of a value of up to 8 bytes;
// mask must be the full warp.
std::uint64_t shuffle_xor(unsigned mask, std::uint64_t bits, int lane_mask);

// How a kernel has been seen to behave; kept by the caller, one per kernel.
struct KernelProfile {
  bool launched = false;
  bool synchronises = false;
};

// Runs `body` as every thread of a grid of `grid` blocks of `block` threads.
void run_grid(const std::string& kernel, Dim3 grid, Dim3 block, const std::function<void()>& body,
              KernelProfile& profile);

}  // namespace loom::cuda::emulator
