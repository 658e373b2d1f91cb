// backends/cuda/emulator/emulated_api.h — the CUDA driver and cuBLAS entry points Loom
// calls (cuda_api.h), implemented on the CPU.
//
// LOOM_CUDA_EMULATOR=1 makes cuda::api() hand out this table instead of the NVIDIA
// driver's, so the unchanged CUDA backend (host code and kernels.cu) runs on a machine
// without a GPU: device memory is host memory, kernels run thread by thread
// (block_scheduler.h), GEMMs follow cuBLAS's column-major definition, and each stream
// runs its work in order as late as CUDA allows (when the host waits for it, or another
// stream being run waits on an event of it), so a missing cross-stream wait reads
// memory not yet written every time. It checks what the hardware would not: copies and
// GEMM operands outside a live allocation (when enqueued and when run), invalid leading
// dimensions, launch shapes beyond CUDA's limits, kernels missing from kernels.cu. It proves the
// CUDA code's logic, never its speed, and is no substitute for a run on an NVIDIA GPU.
#pragma once

#include <string>

#include "backends/cuda/cuda_api.h"

namespace loom::cuda::emulator {

const Api& api();

// Why the last emulated call on this OS thread failed, or "" (cuda_api's error messages
// append it; the driver's status codes alone cannot say which bound was crossed).
std::string last_problem();

}  // namespace loom::cuda::emulator
