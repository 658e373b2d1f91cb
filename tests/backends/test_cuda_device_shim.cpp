// CUDA's device vocabulary on the host (backends/cuda/emulator/device_shim.h), as a kernel
// written in it sees it: built-in indices, block shared memory, barriers, warp barriers
// and atomics.
#include <gtest/gtest.h>

#include <vector>

#include "backends/cuda/emulator/device_shim.h"

namespace loom::testing {
namespace {

namespace emu = cuda::emulator;

// Every thread adds its global index to *total; thread 0 of each block also records how
// many of its block's threads passed the first barrier before anyone went on.
__global__ void count_threads(long long* total, int* seen_per_block, int* arrivals) {
  __shared__ int arrived;
  if (threadIdx.x == 0)
    arrived = 0;
  __syncthreads();
  atomicAdd(&arrived, 1);
  __syncthreads();
  if (threadIdx.x == 0)
    seen_per_block[blockIdx.x] = arrived;
  atomicAdd(total, static_cast<long long>(blockIdx.x * blockDim.x + threadIdx.x));
  __syncwarp();
  atomicMax(arrivals, static_cast<int>(threadIdx.x));
}

TEST(CudaDeviceShim, AKernelWrittenInCudaSeesItsIndicesBarriersAndAtomics) {
  long long total = 0;
  int max_thread = -1;
  std::vector<int> seen(5, 0);
  emu::KernelProfile profile;
  emu::run_grid(
      "count_threads", {5, 1, 1}, {96, 1, 1},
      [&] { count_threads(&total, seen.data(), &max_thread); }, profile);
  EXPECT_EQ(total, 480LL * 479 / 2);  // 0 + 1 + ... + 479
  for (int s : seen)
    EXPECT_EQ(s, 96);
  EXPECT_EQ(max_thread, 95);
  int value = 7;
  EXPECT_EQ(atomicCAS(&value, 7, 9), 7);
  EXPECT_EQ(value, 9);
  EXPECT_EQ(atomicCAS(&value, 7, 11), 9);
  EXPECT_EQ(value, 9);
}

}  // namespace
}  // namespace loom::testing
