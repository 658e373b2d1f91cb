// The CUDA emulator (backends/cuda/emulator) runs the CUDA backend on the CPU, so it must
// itself be right: barriers and shuffles follow CUDA's rules, what hardware leaves
// undefined is an error, GEMMs follow cuBLAS's column-major definition, and copies or
// operands outside live memory are caught. The backend's own suites run on it from CTest
// (LOOM_CUDA_EMULATOR=1); these tests check the emulator.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/emulator/block_scheduler.h"
#include "backends/cuda/emulator/emulated_api.h"
#include "core/error.h"
#include "core/fused_elementwise.h"
#include "dispatch/dispatch.h"
#include "test_util.h"

namespace loom::testing {
namespace {

namespace emu = cuda::emulator;

std::string launch_error(emu::Dim3 grid, emu::Dim3 block, const std::function<void()>& body,
                         emu::KernelProfile profile = {}) {
  return error_of([&] { emu::run_grid("test_kernel", grid, block, body, profile); });
}

float shuffle(float value, int lane_mask) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof value);
  bits = emu::shuffle_xor(0xffffffffu, bits, lane_mask);
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

TEST(CudaEmulatorScheduler, EveryThreadRunsOnceWithItsIndices) {
  std::vector<int> seen(2 * 3 * 4 * 2, 0);
  emu::KernelProfile profile;
  emu::run_grid(
      "indices", {2, 3, 1}, {4, 2, 1},
      [&] {
        const auto& s = emu::current_thread();
        unsigned block = s.block_idx.x + s.grid_dim.x * s.block_idx.y;
        unsigned thread = s.thread_idx.x + s.block_dim.x * s.thread_idx.y;
        EXPECT_EQ(thread, s.linear);
        ++seen[block * 8 + thread];
      },
      profile);
  for (int count : seen)
    EXPECT_EQ(count, 1);
  EXPECT_TRUE(profile.launched);
  EXPECT_FALSE(profile.synchronises);
}

TEST(CudaEmulatorScheduler, ABarrierOrdersWritesBeforeReads) {
  // Each thread writes its slot, waits, then reads its neighbour's: without the barrier
  // the early threads would read slots nobody has written yet.
  std::vector<int> shared(96, -1), read(96, -1);
  emu::KernelProfile profile;
  emu::run_grid(
      "barrier", {1, 1, 1}, {96, 1, 1},
      [&] {
        unsigned t = emu::current_thread().linear;
        shared[t] = static_cast<int>(t) * 7;
        emu::sync_threads();
        read[t] = shared[(t + 1) % 96];
      },
      profile);
  for (unsigned t = 0; t < 96; ++t)
    EXPECT_EQ(read[t], static_cast<int>((t + 1) % 96) * 7);
  EXPECT_TRUE(profile.synchronises);
}

TEST(CudaEmulatorScheduler, AButterflyOfShufflesSumsTheWarp) {
  std::vector<float> sums(64);
  emu::KernelProfile profile;
  emu::run_grid(
      "warp_sum", {1, 1, 1}, {64, 1, 1},
      [&] {
        unsigned t = emu::current_thread().linear;
        float v = static_cast<float>(t);
        for (int offset = 16; offset > 0; offset >>= 1)
          v += shuffle(v, offset);
        sums[t] = v;
      },
      profile);
  for (unsigned t = 0; t < 64; ++t)  // warp 0: 0+..+31 = 496; warp 1: 32+..+63 = 1520
    EXPECT_EQ(sums[t], t < 32 ? 496.0f : 1520.0f) << t;
}

TEST(CudaEmulatorScheduler, SyncwarpOrdersALanesWritesBeforeItsNeighboursRead) {
  std::vector<int> slots(64, -1), read(64, -1);
  emu::KernelProfile profile;
  emu::run_grid(
      "syncwarp", {1, 1, 1}, {64, 1, 1},
      [&] {
        unsigned t = emu::current_thread().linear;
        slots[t] = static_cast<int>(t);
        emu::shuffle_xor(0xffffffffu, 0, 0);  // what __syncwarp() is
        read[t] = slots[(t & ~31u) | ((t + 1) & 31u)];
      },
      profile);
  for (unsigned t = 0; t < 64; ++t)
    EXPECT_EQ(read[t], static_cast<int>((t & ~31u) | ((t + 1) & 31u)));
}

TEST(CudaEmulatorScheduler, WhatHardwareLeavesUndefinedIsAnError) {
  // Lanes of one warp at a shuffle while the others wait at a barrier: a deadlock.
  EXPECT_NE(launch_error({1, 1, 1}, {32, 1, 1},
                         [] {
                           if (emu::current_thread().linear < 16)
                             shuffle(1.0f, 1);
                           else
                             emu::sync_threads();
                         })
                .find("deadlock"),
            std::string::npos);
  // A full-warp shuffle after one lane returned.
  EXPECT_NE(launch_error({1, 1, 1}, {32, 1, 1},
                         [] {
                           if (emu::current_thread().linear != 31)
                             shuffle(1.0f, 1);
                         })
                .find("exited while its warp waits"),
            std::string::npos);
  // A shuffle in a warp of 16 threads.
  EXPECT_NE(launch_error({1, 1, 1}, {48, 1, 1}, [] { shuffle(1.0f, 1); }).find("partial warp"),
            std::string::npos);
  // Lanes of a warp at different shuffles.
  EXPECT_NE(launch_error({1, 1, 1}, {32, 1, 1},
                         [] {
                           shuffle(1.0f, 1);
                           if (emu::current_thread().linear == 0)
                             return;
                           shuffle(1.0f, 1);
                         })
                .find("test_kernel"),
            std::string::npos);
  // A kernel whose first launch never synchronised runs without fibers; if it then does,
  // the launch fails instead of computing a wrong result.
  emu::KernelProfile plain{true, false};
  EXPECT_NE(launch_error(
                {1, 1, 1}, {32, 1, 1}, [] { emu::sync_threads(); }, plain)
                .find("without fibers"),
            std::string::npos);
  // An exception inside a thread reaches the launcher.
  EXPECT_EQ(launch_error({2, 1, 1}, {64, 1, 1},
                         [] {
                           emu::sync_threads();
                           if (emu::current_thread().block_idx.x == 1 &&
                               emu::current_thread().linear == 40)
                             throw Error("thread 40 of block 1");
                         }),
            "thread 40 of block 1");
}

// ---- the emulated driver and cuBLAS -----------------------------------------------------

struct DeviceBuffer {
  CUdeviceptr address = 0;
  explicit DeviceBuffer(std::size_t bytes) {
    cuda::check_cu(emu::api().cuMemAllocAsync(&address, bytes, nullptr), "alloc");
  }
  ~DeviceBuffer() { emu::api().cuMemFreeAsync(address, nullptr); }
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(address);
  }
};

TEST(CudaEmulatorDriver, CopiesOutsideLiveMemoryAreRefusedAndNamed) {
  const cuda::Api& api = emu::api();
  std::vector<float> host(8, 1.0f);
  DeviceBuffer buffer(4 * sizeof(float));
  EXPECT_EQ(api.cuMemcpyHtoD(buffer.address, host.data(), 4 * sizeof(float)), CUDA_SUCCESS);
  EXPECT_EQ(api.cuMemcpyHtoD(buffer.address, host.data(), 8 * sizeof(float)),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_NE(emu::last_problem().find("16 bytes past the allocation"), std::string::npos);
  EXPECT_EQ(api.cuMemcpyDtoH(host.data(), buffer.address + 8, 12), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr freed = 0;
  api.cuMemAllocAsync(&freed, 64, nullptr);
  api.cuMemFreeAsync(freed, nullptr);
  EXPECT_NE(api.cuMemsetD32Async(freed, 0, 4, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(api.cuMemFreeAsync(freed, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_NE(emu::last_problem().find("not the start of a live allocation"), std::string::npos);
  // New memory reads as NaN until written, so a kernel that reads it shows it.
  std::vector<float> fresh(4);
  api.cuMemcpyDtoH(fresh.data(), buffer.address, 0);
  DeviceBuffer unwritten(16);
  api.cuMemcpyDtoH(fresh.data(), unwritten.address, 16);
  EXPECT_TRUE(std::isnan(fresh[0]));
}

TEST(CudaEmulatorDriver, KernelsAreFoundByNameAndLaunchShapesChecked) {
  const cuda::Api& api = emu::api();
  CUmodule module = nullptr;
  std::uint64_t image = 0;
  ASSERT_EQ(api.cuModuleLoadData(&module, &image), CUDA_SUCCESS);
  CUfunction fill = nullptr, missing = nullptr;
  ASSERT_EQ(api.cuModuleGetFunction(&fill, module, "fill"), CUDA_SUCCESS);
  EXPECT_EQ(api.cuModuleGetFunction(&missing, module, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
  EXPECT_NE(emu::last_problem().find("no_such_kernel"), std::string::npos);
  DeviceBuffer y(1000 * sizeof(float));
  float* data = y.as<float>();
  long long n = 1000;
  float value = 2.5f;
  void* params[] = {&data, &n, &value};
  ASSERT_EQ(api.cuLaunchKernel(fill, 3, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr),
            CUDA_SUCCESS);
  std::vector<float> host(1000);
  api.cuMemcpyDtoH(host.data(), y.address, host.size() * sizeof(float));
  for (float v : host)
    ASSERT_EQ(v, 2.5f);
  EXPECT_EQ(api.cuLaunchKernel(fill, 1, 1, 1, 2048, 1, 1, 0, nullptr, params, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_NE(emu::last_problem().find("outside CUDA's limits"), std::string::npos);
}

// Streams run late: a copy on one stream that reads what another stream writes sees the
// write only when it waits for it (cuStreamWaitEvent); without the wait it reads the
// memory as it was, every time. That is what makes a missing wait a failing test here.
TEST(CudaEmulatorDriver, AStreamSeesAnotherStreamsWriteOnlyWhenItWaitsForIt) {
  const cuda::Api& api = emu::api();
  CUstream writer = nullptr, reader = nullptr;
  ASSERT_EQ(api.cuStreamCreate(&writer, 0), CUDA_SUCCESS);
  ASSERT_EQ(api.cuStreamCreate(&reader, 0), CUDA_SUCCESS);
  CUevent written = nullptr;
  ASSERT_EQ(api.cuEventCreate(&written, 0), CUDA_SUCCESS);
  DeviceBuffer source(16), copied(16);
  for (bool wait : {false, true}) {
    SCOPED_TRACE(wait ? "with the wait" : "without the wait");
    std::vector<unsigned> zeros(4, 0), got(4, 1);
    ASSERT_EQ(api.cuMemcpyHtoD(source.address, zeros.data(), 16), CUDA_SUCCESS);
    ASSERT_EQ(api.cuMemsetD32Async(source.address, 7, 4, writer), CUDA_SUCCESS);
    ASSERT_EQ(api.cuEventRecord(written, writer), CUDA_SUCCESS);
    EXPECT_EQ(api.cuEventQuery(written), CUDA_ERROR_NOT_READY);  // nothing waited: not run
    if (wait) {
      ASSERT_EQ(api.cuStreamWaitEvent(reader, written, 0), CUDA_SUCCESS);
    }
    ASSERT_EQ(api.cuMemcpyDtoDAsync(copied.address, source.address, 16, reader), CUDA_SUCCESS);
    ASSERT_EQ(api.cuStreamSynchronize(reader), CUDA_SUCCESS);
    EXPECT_EQ(api.cuEventQuery(written), wait ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
    ASSERT_EQ(api.cuMemcpyDtoH(got.data(), copied.address, 16), CUDA_SUCCESS);  // runs all
    EXPECT_EQ(got, std::vector<unsigned>(4, wait ? 7u : 0u));
    EXPECT_EQ(api.cuEventQuery(written), CUDA_SUCCESS);
  }
  // A free queued on a stream happens when the stream reaches it.
  CUdeviceptr later = 0;
  ASSERT_EQ(api.cuMemAllocAsync(&later, 64, writer), CUDA_SUCCESS);
  ASSERT_EQ(api.cuMemFreeAsync(later, writer), CUDA_SUCCESS);
  EXPECT_EQ(api.cuMemFreeAsync(later, writer), CUDA_ERROR_INVALID_VALUE);  // already queued
  ASSERT_EQ(api.cuMemsetD32Async(later, 0, 4, reader), CUDA_SUCCESS);      // still live when queued
  ASSERT_EQ(api.cuStreamSynchronize(writer), CUDA_SUCCESS);
  EXPECT_EQ(api.cuStreamSynchronize(reader), CUDA_ERROR_INVALID_VALUE);  // freed when it ran
  EXPECT_NE(emu::last_problem().find("when it ran"), std::string::npos);
  api.cuEventDestroy(written);
  api.cuStreamDestroy(writer);
  api.cuStreamDestroy(reader);
}

// C = alpha op(A) op(B) + beta C in column-major storage, batched with strides.
TEST(CudaEmulatorCublas, GemmFollowsTheColumnMajorDefinition) {
  const cuda::Api& api = emu::api();
  const int m = 3, n = 2, k = 4, batch = 2, lda = 5, ldb = 4, ldc = 3;
  const long long stride_a = lda * m, stride_b = ldb * n, stride_c = ldc * n;  // A is op T
  std::vector<float> a(stride_a * batch), b(stride_b * batch), c(stride_c * batch, 1.0f);
  for (std::size_t i = 0; i < a.size(); ++i)
    a[i] = static_cast<float>(i % 7) - 3.0f;
  for (std::size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<float>(i % 5) * 0.5f;
  DeviceBuffer da(a.size() * 4), db(b.size() * 4), dc(c.size() * 4);
  api.cuMemcpyHtoD(da.address, a.data(), a.size() * 4);
  api.cuMemcpyHtoD(db.address, b.data(), b.size() * 4);
  api.cuMemcpyHtoD(dc.address, c.data(), c.size() * 4);
  cublasHandle_t handle = nullptr;
  api.cublasCreate(&handle);
  const float alpha = 2.0f, beta = 0.5f;
  ASSERT_EQ(api.cublasGemmStridedBatchedEx(
                handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, da.as<void>(), CUDA_R_32F, lda,
                stride_a, db.as<void>(), CUDA_R_32F, ldb, stride_b, &beta, dc.as<void>(),
                CUDA_R_32F, ldc, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  std::vector<float> got(c.size());
  api.cuMemcpyDtoH(got.data(), dc.address, got.size() * 4);
  for (int p = 0; p < batch; ++p)
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double acc = 0;  // op(A)(i, l) = A[l + i lda] (transposed); B(l, j) = B[l + j ldb]
        for (int l = 0; l < k; ++l)
          acc += a[p * stride_a + l + i * lda] * b[p * stride_b + l + j * ldb];
        EXPECT_FLOAT_EQ(got[p * stride_c + i + j * ldc], alpha * acc + beta * 1.0f);
      }
  // A leading dimension below op(A)'s rows, and an operand running past its memory.
  EXPECT_EQ(api.cublasGemmStridedBatchedEx(
                handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, da.as<void>(), CUDA_R_32F, k - 1,
                stride_a, db.as<void>(), CUDA_R_32F, ldb, stride_b, &beta, dc.as<void>(),
                CUDA_R_32F, ldc, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_NE(emu::last_problem().find("leading dimensions"), std::string::npos);
  EXPECT_EQ(api.cublasGemmStridedBatchedEx(
                handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, da.as<void>(), CUDA_R_32F, lda,
                stride_a, db.as<void>(), CUDA_R_32F, ldb, stride_b + 1, &beta, dc.as<void>(),
                CUDA_R_32F, ldc, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_EXECUTION_FAILED);
  EXPECT_NE(emu::last_problem().find("operand B"), std::string::npos);
  // With beta = 0, C is not read: NaN there does not reach the result.
  std::vector<float> nan(c.size(), std::numeric_limits<float>::quiet_NaN());
  api.cuMemcpyHtoD(dc.address, nan.data(), nan.size() * 4);
  const float zero = 0.0f;
  ASSERT_EQ(api.cublasGemmStridedBatchedEx(
                handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, da.as<void>(), CUDA_R_32F, lda,
                stride_a, db.as<void>(), CUDA_R_32F, ldb, stride_b, &zero, dc.as<void>(),
                CUDA_R_32F, ldc, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  api.cuMemcpyDtoH(got.data(), dc.address, got.size() * 4);
  for (int p = 0; p < batch; ++p)
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i)
        EXPECT_FALSE(std::isnan(got[p * stride_c + i + j * ldc]));
  api.cublasDestroy(handle);
}

// ---- the CUDA backend on the emulator ----------------------------------------------------

// Under bf16 products the backend keeps the bf16 copy of an f32 operand until the
// operand's bytes are written or freed. Every way of writing them must drop the copy,
// or a later product would read the old values.
TEST(CudaEmulatorBackend, Bf16OperandCopiesNeverOutliveTheirSource) {
  cuda::CudaBackend backend(emu::api(), 0);
  ASSERT_TRUE(backend.set_matmul_precision(DType::bf16));
  nn::Rng rng(11);
  Tensor a_host = random({24, 16}, rng), b_host = random({16, 8}, rng);
  Tensor a = a_host.to(backend), b = b_host.to(backend);
  auto product_with = [&](const Tensor& a_values) {
    cpu().set_matmul_precision(DType::bf16);
    std::vector<double> expected = values(dispatch::call(OpId::matmul, {a_values, b_host})[0]);
    cpu().set_matmul_precision(DType::f32);
    std::vector<double> actual = values(dispatch::call(OpId::matmul, {a, b})[0]);
    return worst_ratio(actual, expected, 1e-5, 1e-6);
  };
  EXPECT_LE(product_with(a_host), 1.0);
  EXPECT_LE(product_with(a_host), 1.0);  // the cached copy
  // Written by an upload.
  Tensor a2 = random({24, 16}, rng);
  std::vector<float> v2 = a2.to_floats();
  backend.upload(v2.data(), *a.storage(), static_cast<std::size_t>(a.offset()) * 4, v2.size() * 4);
  EXPECT_LE(product_with(a2), 1.0);
  // Written by a kernel (fill as an op's output).
  Attrs fill;
  fill.shape = {24, 16};
  fill.alpha = 0.75;
  Tensor target = a;
  dispatch::execute(backend, OpId::fill, {}, std::span<Tensor>(&target, 1), fill);
  EXPECT_LE(product_with(Tensor::from_floats({24, 16}, std::vector<float>(24 * 16, 0.75f), cpu())),
            1.0);
  // Written by a device-to-device copy.
  Tensor a3 = random({24, 16}, rng).to(backend);
  backend.default_stream().copy(*a3.storage(), static_cast<std::size_t>(a3.offset()) * 4,
                                *a.storage(), static_cast<std::size_t>(a.offset()) * 4,
                                static_cast<std::size_t>(a.numel()) * 4);
  EXPECT_LE(product_with(a3.to(cpu())), 1.0);
  backend.set_matmul_precision(DType::f32);
}

// A matmul_elementwise program of `inputs` inputs (the product is register 0) from steps
// (op, first argument, second argument), writing `outputs` (empty: the last step's value).
std::shared_ptr<ElementwiseProgram> program_of(int inputs, std::vector<std::array<int, 3>> steps,
                                               std::vector<int> outputs = {}) {
  auto p = std::make_shared<ElementwiseProgram>();
  p->num_inputs = inputs;
  for (const auto& [op, a, b] : steps)
    p->steps.push_back(ElementwiseStep{static_cast<OpId>(op), {a, b}});
  p->outputs = std::move(outputs);
  return p;
}
constexpr int kAdd = static_cast<int>(OpId::add), kMul = static_cast<int>(OpId::mul),
              kRelu = static_cast<int>(OpId::relu), kGelu = static_cast<int>(OpId::gelu),
              kGeluBackward = static_cast<int>(OpId::gelu_backward);

// Which chains are cuBLASLt epilogues, and where their bias, GELU input and result go.
TEST(CudaEpilogues, ChainsMapToCublasLtsEpiloguesOnlyWhenTheyAreOne) {
  auto of = [](const std::shared_ptr<ElementwiseProgram>& p) { return cuda::lt_epilogue_of(*p); };
  EXPECT_EQ(of(program_of(1, {{kRelu, 0, -1}}))->epilogue, CUBLASLT_EPILOGUE_RELU);
  EXPECT_EQ(of(program_of(1, {{kGelu, 0, -1}}))->epilogue, CUBLASLT_EPILOGUE_GELU);
  auto bias = of(program_of(2, {{kAdd, 1, 0}}));  // add(bias, product): the same sum
  ASSERT_TRUE(bias);
  EXPECT_EQ(bias->epilogue, CUBLASLT_EPILOGUE_BIAS);
  EXPECT_EQ(bias->bias_input, 2);  // the op's inputs: A, B, then the program's input 1
  EXPECT_EQ(of(program_of(2, {{kAdd, 0, 1}, {kRelu, 2, -1}}))->epilogue,
            CUBLASLT_EPILOGUE_RELU_BIAS);
  EXPECT_EQ(of(program_of(2, {{kAdd, 0, 1}, {kGelu, 2, -1}}))->epilogue,
            CUBLASLT_EPILOGUE_GELU_BIAS);
  auto keep = of(program_of(2, {{kAdd, 0, 1}, {kGelu, 2, -1}}, {2, 3}));  // the sum first
  ASSERT_TRUE(keep);
  EXPECT_EQ(keep->epilogue, CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
  EXPECT_EQ(keep->aux_output, 0);
  EXPECT_EQ(keep->result_output, 1);
  auto residual = of(program_of(3, {{kAdd, 0, 2}, {kAdd, 1, 3}}));  // bias, then a residual
  ASSERT_TRUE(residual);
  EXPECT_EQ(residual->epilogue, CUBLASLT_EPILOGUE_BIAS);
  EXPECT_EQ(residual->bias_input, 3);
  EXPECT_EQ(residual->residual_input, 2);
  auto grad = of(program_of(3, {{kGeluBackward, 0, 2}}));
  ASSERT_TRUE(grad);
  EXPECT_EQ(grad->epilogue, CUBLASLT_EPILOGUE_DGELU);
  EXPECT_EQ(grad->aux_input, 3);
  // Not epilogues: an op cuBLASLt has not, a step on another input than the product, the
  // product added to itself, GELU's gradient with the product as its input, a ReLU whose
  // input is kept (cuBLASLt keeps a bit mask, not the values), three steps.
  EXPECT_FALSE(of(program_of(2, {{kMul, 0, 1}})));
  EXPECT_FALSE(of(program_of(2, {{kRelu, 1, -1}})));
  EXPECT_FALSE(of(program_of(1, {{kAdd, 0, 0}})));
  EXPECT_FALSE(of(program_of(2, {{kGeluBackward, 1, 0}})));
  EXPECT_FALSE(of(program_of(2, {{kAdd, 0, 1}, {kRelu, 2, -1}}, {3, 2})));
  EXPECT_FALSE(of(program_of(2, {{kAdd, 0, 1}, {kGelu, 2, -1}, {kRelu, 3, -1}})));
  EXPECT_FALSE(of(program_of(2, {{kAdd, 0, 1}, {kGelu, 0, -1}})));  // GELU of the product alone
  EXPECT_FALSE(of(program_of(2, {{kAdd, 0, 1}, {kAdd, 2, 1}})));    // the bias twice
}

// Each epilogue on the emulated cuBLASLt, and the chains or operands it does not take on
// the fallback path (GEMM, then the chain kernel): every output within f32 rounding of the
// CPU's unfused matmul and chain, and cublasLtMatmul used exactly where it should be.
TEST(CudaEpilogues, MatmulElementwiseMatchesTheUnfusedProductAndChain) {
  cuda::CudaBackend backend(emu::api(), 0);
  nn::Rng rng(5);
  struct Case {
    const char* name;
    Shape a, b;
    bool ta, tb;
    std::shared_ptr<ElementwiseProgram> program;
    std::vector<Shape> rest;  // the program's inputs after the product
    bool through_lt;
  };
  // clang-format off
  const std::vector<Case> cases = {
      {"relu", {6, 5}, {5, 16}, false, false, program_of(1, {{kRelu, 0, -1}}), {}, true},
      {"gelu, A transposed", {5, 6}, {5, 16}, true, false, program_of(1, {{kGelu, 0, -1}}), {}, true},
      {"bias, B transposed", {6, 5}, {16, 5}, false, true, program_of(2, {{kAdd, 0, 1}}), {{16}}, true},
      {"bias then relu", {6, 5}, {5, 16}, false, false,
       program_of(2, {{kAdd, 0, 1}, {kRelu, 2, -1}}), {{16}}, true},
      {"bias then gelu, batch folded", {2, 3, 5}, {5, 16}, false, false,
       program_of(2, {{kAdd, 1, 0}, {kGelu, 2, -1}}), {{1, 16}}, true},
      {"bias then gelu, the sum kept", {6, 5}, {16, 5}, false, true,
       program_of(2, {{kAdd, 0, 1}, {kGelu, 2, -1}}, {3, 2}), {{16}}, true},
      {"gelu's gradient", {6, 5}, {16, 5}, false, true,
       program_of(2, {{kGeluBackward, 0, 1}}), {{6, 16}}, true},
      {"a tensor added whole", {6, 5}, {5, 16}, false, false,
       program_of(2, {{kAdd, 0, 1}}), {{6, 16}}, true},
      {"bias, then a residual", {2, 3, 5}, {5, 16}, false, false,
       program_of(3, {{kAdd, 0, 1}, {kAdd, 2, 3}}), {{16}, {2, 3, 16}}, true},
      // Fallbacks: GELU's input 12 values apart (cuBLASLt wants a multiple of 8), a
      // multiply, a bias per row rather than per column.
      {"the sum kept, rows 12 apart", {6, 5}, {5, 12}, false, false,
       program_of(2, {{kAdd, 0, 1}, {kGelu, 2, -1}}, {3, 2}), {{12}}, false},
      {"a multiply", {6, 5}, {5, 16}, false, false, program_of(2, {{kMul, 0, 1}}), {{6, 16}}, false},
      {"a bias per row", {6, 5}, {5, 16}, false, false, program_of(2, {{kAdd, 0, 1}}), {{6, 1}}, false},
  };
  // clang-format on
  // Under bf16 products too: cuBLASLt then multiplies the operands' bf16 copies, as the
  // CPU's products round their operands (the expected values).
  for (DType precision : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(precision == DType::bf16 ? "bf16 products" : "f32 products");
    ASSERT_TRUE(backend.set_matmul_precision(precision));
    cpu().set_matmul_precision(precision);
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name);
      std::vector<Tensor> host{random(c.a, rng), random(c.b, rng)};
      for (const Shape& s : c.rest)
        host.push_back(random(s, rng));
      Shape product_shape(c.a.begin(), c.a.end() - 1);
      if (c.ta)
        product_shape = {c.a.back()};
      product_shape.push_back(c.tb ? c.b[0] : c.b[1]);
      Attrs attrs;
      attrs.trans_a = c.ta;
      attrs.trans_b = c.tb;
      attrs.shape = product_shape;
      attrs.program = c.program;
      const std::vector<Tensor> expected = dispatch::call(OpId::matmul_elementwise, host, attrs);
      std::vector<Tensor> device_in;
      for (const Tensor& t : host)
        device_in.push_back(t.to(backend));
      std::vector<Tensor> device_out;
      for (const Tensor& t : expected)
        device_out.push_back(Tensor::empty(t.shape(), DType::f32, backend));
      const std::uint64_t before = backend.lt_epilogue_calls();
      dispatch::execute(backend, OpId::matmul_elementwise, device_in, device_out, attrs);
      EXPECT_EQ(backend.lt_epilogue_calls() - before, c.through_lt ? 1u : 0u);
      for (std::size_t k = 0; k < expected.size(); ++k)
        EXPECT_LE(worst_ratio(values(device_out[k].to(cpu())), values(expected[k]), 1e-5, 1e-6),
                  1.0)
            << "output " << k;
    }
  }
  cpu().set_matmul_precision(DType::f32);
  backend.set_matmul_precision(DType::f32);
}

// The device's name says which path graph mode's GEMM epilogues take.
TEST(CudaEpilogues, TheDeviceNameSaysWhetherCublasLtIsThere) {
  cuda::CudaBackend with(emu::api(), 0);
  EXPECT_NE(with.info().name.find(", cuBLASLt epilogues)"), std::string::npos) << with.info().name;
  cuda::Api without_lt = emu::api();
  without_lt.cublasLtMatmul = nullptr;  // as when libcublasLt lacks an entry point
  cuda::CudaBackend without(without_lt, 0);
  EXPECT_NE(without.info().name.find(", no cuBLASLt)"), std::string::npos) << without.info().name;
  // Without it a chain cuBLASLt would take runs as the GEMM and the chain kernel.
  nn::Rng rng(8);
  Tensor a = random({4, 3}, rng), b = random({3, 8}, rng);
  Attrs attrs;
  attrs.shape = {4, 8};
  attrs.program = program_of(1, {{kRelu, 0, -1}});
  const std::vector<Tensor> expected = dispatch::call(OpId::matmul_elementwise, {a, b}, attrs);
  const Tensor in[] = {a.to(without), b.to(without)};
  Tensor out[] = {Tensor::empty({4, 8}, DType::f32, without)};
  dispatch::execute(without, OpId::matmul_elementwise, in, out, attrs);
  EXPECT_EQ(without.lt_epilogue_calls(), 0u);
  EXPECT_LE(worst_ratio(values(out[0].to(cpu())), values(expected[0]), 1e-5, 1e-6), 1.0);
}

// The emulated cuBLASLt refuses what cuBLASLt refuses, with a reason: GELU's input with
// rows not a multiple of 8 values apart, a bias epilogue without a bias.
TEST(CudaEpilogues, TheEmulatedCublasLtRefusesMisstatedEpilogues) {
  const cuda::Api& api = emu::api();
  cublasLtHandle_t handle = nullptr;
  ASSERT_EQ(api.cublasLtCreate(&handle), CUBLAS_STATUS_SUCCESS);
  DeviceBuffer a(4 * 8 * 4), b(8 * 12 * 4), d(4 * 12 * 4), aux(4 * 16 * 4);  // bytes
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  ASSERT_EQ(api.cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 12, 8, 12), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(api.cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 8, 4, 8), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(api.cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 12, 4, 12), CUBLAS_STATUS_SUCCESS);
  auto run = [&](std::uint32_t epilogue, bool with_aux, std::int64_t aux_ld) {
    cublasLtMatmulDesc_t desc = nullptr;
    EXPECT_EQ(api.cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
              CUBLAS_STATUS_SUCCESS);
    api.cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                       sizeof epilogue);
    if (with_aux) {
      void* p = aux.as<void>();
      api.cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p,
                                         sizeof p);
      api.cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                         sizeof aux_ld);
    }
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t status =
        api.cublasLtMatmul(handle, desc, &one, b.as<void>(), la, a.as<void>(), lb, &zero,
                           d.as<void>(), ld, d.as<void>(), ld, nullptr, nullptr, 0, nullptr);
    const std::string why = emu::last_problem();
    api.cublasLtMatmulDescDestroy(desc);
    return std::make_pair(status, why);
  };
  EXPECT_EQ(run(CUBLASLT_EPILOGUE_GELU_AUX, true, 16).first, CUBLAS_STATUS_SUCCESS);
  auto [status, why] = run(CUBLASLT_EPILOGUE_GELU_AUX, true, 12);
  EXPECT_EQ(status, CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_NE(why.find("divisible by 8"), std::string::npos) << why;
  std::tie(status, why) = run(CUBLASLT_EPILOGUE_BIAS, false, 0);
  EXPECT_EQ(status, CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_NE(why.find("BIAS_POINTER"), std::string::npos) << why;
  std::tie(status, why) = run(CUBLASLT_EPILOGUE_RELU_AUX, true, 128);
  EXPECT_EQ(status, CUBLAS_STATUS_NOT_SUPPORTED);
  for (cublasLtMatrixLayout_t l : {la, lb, ld})
    api.cublasLtMatrixLayoutDestroy(l);
  api.cublasLtDestroy(handle);
}

}  // namespace
}  // namespace loom::testing
