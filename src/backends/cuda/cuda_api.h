// backends/cuda/cuda_api.h — the CUDA driver API, cuBLAS and cuBLASLt, loaded at run time.
//
// Loom never links libcuda or libcublas: it opens them with dlopen when a CUDA device is
// first asked for (as IREE's dynamic symbol tables do), so one `loom` binary runs on
// machines with and without an NVIDIA driver. The toolkit's headers are used at build
// time for the types and prototypes only.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>

#include <string>

namespace loom::cuda {

// Each driver entry point Loom calls. The header's macros map some names to their
// versioned symbols (cuMemAlloc -> cuMemAlloc_v2), and the table resolves those.
// clang-format off
#define LOOM_CUDA_DRIVER_FUNCTIONS(X) \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet)                     \
  X(cuDeviceGetName) X(cuDeviceTotalMem) X(cuDeviceGetAttribute)                         \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent)            \
  X(cuGetErrorString) X(cuGetErrorName) X(cuMemAllocAsync) X(cuMemFreeAsync)             \
  X(cuDeviceGetDefaultMemPool) X(cuMemPoolSetAttribute) X(cuMemcpyHtoD)                  \
  X(cuMemcpyDtoH) X(cuMemcpyDtoDAsync) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)         \
  X(cuMemsetD32Async) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)        \
  X(cuStreamWaitEvent) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord)               \
  X(cuEventQuery) X(cuEventSynchronize) X(cuEventElapsedTime) X(cuModuleLoadData)        \
  X(cuModuleUnload) X(cuModuleGetFunction) X(cuLaunchKernel)
// clang-format on

// cuBLAS: typed by hand, because cublas_api.h also declares C++ overloads of some names.
using CublasCreateFn = cublasStatus_t (*)(cublasHandle_t*);
using CublasDestroyFn = cublasStatus_t (*)(cublasHandle_t);
using CublasSetStreamFn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
using CublasSetMathModeFn = cublasStatus_t (*)(cublasHandle_t, cublasMath_t);
using CublasGemmStridedBatchedExFn = cublasStatus_t (*)(
    cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
    cudaDataType, int, long long, const void*, cudaDataType, int, long long, const void*, void*,
    cudaDataType, int, long long, int, cublasComputeType_t, cublasGemmAlgo_t);

// cuBLASLt, for GEMMs with an epilogue (bias, ReLU, GELU and GELU's gradient applied as the
// product is stored). Optional: without the library these stay null, and the backend runs
// such a product as cuBLAS's GEMM and its chain kernel.
// clang-format off
#define LOOM_CUBLASLT_FUNCTIONS(X) \
  X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) \
  X(cublasLtMatmulDescSetAttribute) X(cublasLtMatrixLayoutCreate)                              \
  X(cublasLtMatrixLayoutDestroy) X(cublasLtMatmul)
// clang-format on

struct Api {
#define LOOM_CUDA_MEMBER(name) decltype(&::name) name = nullptr;
  LOOM_CUDA_DRIVER_FUNCTIONS(LOOM_CUDA_MEMBER)
#undef LOOM_CUDA_MEMBER
  CublasCreateFn cublasCreate = nullptr;
  CublasDestroyFn cublasDestroy = nullptr;
  CublasSetStreamFn cublasSetStream = nullptr;
  CublasSetMathModeFn cublasSetMathMode = nullptr;
  CublasGemmStridedBatchedExFn cublasGemmStridedBatchedEx = nullptr;
#define LOOM_CUBLASLT_MEMBER(name) decltype(&::name) name = nullptr;
  LOOM_CUBLASLT_FUNCTIONS(LOOM_CUBLASLT_MEMBER)
#undef LOOM_CUBLASLT_MEMBER
  // Every cuBLASLt entry point above was found.
  bool has_cublaslt() const {
    return cublasLtMatmul != nullptr;
  }
};

// The loaded API, or nullptr with `why` set (no driver, no cuBLAS, no device, a stub
// library, a driver older than the kernels need). Loads once per process. With
// LOOM_CUDA_EMULATOR=1 it is the CPU emulator's table (emulator/emulated_api.h) instead.
const Api* api(std::string* why = nullptr);
// Whether LOOM_CUDA_EMULATOR=1 put the emulator in the driver's place.
bool emulated();

// Throws loom::Error naming the call and the driver's error name when status != CUDA_SUCCESS.
void check_cu(CUresult status, const char* what);
void check_cublas(cublasStatus_t status, const char* what);

}  // namespace loom::cuda
