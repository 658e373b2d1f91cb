// backends/cuda/emulator/emulated_blas.cpp — cuBLAS's strided batched GEMM and cuBLASLt's
// matmul with its epilogues, emulated on the CPU in column-major order.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <dnnl.h>

#include "backends/cuda/emulator/emulated_device.h"
#include "core/error.h"

namespace loom::cuda::emulator::detail {
namespace {

// ---- cuBLAS: C = alpha op(A) op(B) + beta C, column-major, per batch --------------------

float load(const void* base, cudaDataType type, long long index) {
  if (type == CUDA_R_32F)
    return static_cast<const float*>(base)[index];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
}

std::size_t element_bytes(cudaDataType type) {
  return type == CUDA_R_32F ? 4 : 2;
}

// "" when every element a batched column-major operand of rows x cols touches lies inside
// one allocation.
std::string operand_outside(const char* which, const void* base, cudaDataType type, long long rows,
                            long long cols, long long ld, long long stride, int batch) {
  if (rows == 0 || cols == 0 || batch == 0)
    return "";
  const long long last = (batch - 1) * stride + (cols - 1) * ld + rows;  // elements spanned
  std::string why = outside_allocation(reinterpret_cast<std::uintptr_t>(base),
                                       static_cast<std::size_t>(last) * element_bytes(type));
  return why.empty() ? "" : std::string("operand ") + which + ": " + why;
}

bool gemm_product(bool ta, bool tb, int m, int n, int k, float alpha, const void* a,
                  cudaDataType a_type, int lda, long long stride_a, const void* b,
                  cudaDataType b_type, int ldb, long long stride_b, float beta, void* c,
                  cudaDataType c_type, int ldc, long long stride_c, int batch);

cublasStatus_t gemm_strided_batched(cublasHandle_t handle, cublasOperation_t transa,
                                    cublasOperation_t transb, int m, int n, int k,
                                    const void* alpha_ptr, const void* a, cudaDataType a_type,
                                    int lda, long long stride_a, const void* b, cudaDataType b_type,
                                    int ldb, long long stride_b, const void* beta_ptr, void* c,
                                    cudaDataType c_type, int ldc, long long stride_c, int batch,
                                    cublasComputeType_t compute, cublasGemmAlgo_t) {
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  const long long a_rows = ta ? k : m, a_cols = ta ? m : k;
  const long long b_rows = tb ? n : k, b_cols = tb ? k : n;
  if (m < 0 || n < 0 || k < 0 || batch < 0)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmStridedBatchedEx: a negative size");
  if (lda < std::max<long long>(1, a_rows) || ldb < std::max<long long>(1, b_rows) ||
      ldc < std::max(1, m))
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                "cublasGemmStridedBatchedEx: leading dimensions lda " + std::to_string(lda) +
                    ", ldb " + std::to_string(ldb) + ", ldc " + std::to_string(ldc) +
                    " below the rows of A (" + std::to_string(a_rows) + "), B (" +
                    std::to_string(b_rows) + ") or C (" + std::to_string(m) + ")");
  // cuBLAS's table of supported types, as far as Loom uses it: f32 x f32 -> f32, and
  // bf16 x bf16 -> f32 or bf16, accumulated in f32.
  if (a_type != b_type || (a_type != CUDA_R_32F && a_type != CUDA_R_16BF) ||
      (c_type != CUDA_R_32F && !(c_type == CUDA_R_16BF && a_type == CUDA_R_16BF)) ||
      compute != CUBLAS_COMPUTE_32F)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                "cublasGemmStridedBatchedEx: the emulator has f32 x f32 -> f32 and bf16 x bf16 "
                "-> f32 or bf16 with CUBLAS_COMPUTE_32F only");
  for (const std::string& why :
       {operand_outside("A", a, a_type, a_rows, a_cols, lda, stride_a, batch),
        operand_outside("B", b, b_type, b_rows, b_cols, ldb, stride_b, batch),
        operand_outside("C", c, c_type, m, n, ldc, stride_c, batch)})
    if (!why.empty())
      return fail(CUBLAS_STATUS_EXECUTION_FAILED, "cublasGemmStridedBatchedEx: " + why);
  // Host scalars are read when the call is made (CUBLAS_POINTER_MODE_HOST); the product
  // runs on the handle's stream.
  const float alpha = *static_cast<const float*>(alpha_ptr);
  const float beta = *static_cast<const float*>(beta_ptr);
  auto product = [=] {
    return gemm_product(ta, tb, m, n, k, alpha, a, a_type, lda, stride_a, b, b_type, ldb, stride_b,
                        beta, c, c_type, ldc, stride_c, batch)
               ? CUDA_SUCCESS
               : fail(CUDA_ERROR_LAUNCH_FAILED, "cublasGemmStridedBatchedEx: dnnl_sgemm failed");
  };
  CUstream stream = nullptr;
  {
    Device& d = device();
    std::lock_guard lock(d.queues);
    auto found = d.blas_streams.find(reinterpret_cast<std::uintptr_t>(handle));
    if (found != d.blas_streams.end())
      stream = reinterpret_cast<CUstream>(found->second);
  }
  return enqueue(stream, product) == CUDA_SUCCESS ? CUBLAS_STATUS_SUCCESS
                                                  : CUBLAS_STATUS_EXECUTION_FAILED;
}

// C = alpha op(A) op(B) + beta C, column-major, per batch; false when oneDNN fails.
bool gemm_product(bool ta, bool tb, int m, int n, int k, float alpha, const void* a,
                  cudaDataType a_type, int lda, long long stride_a, const void* b,
                  cudaDataType b_type, int ldb, long long stride_b, float beta, void* c,
                  cudaDataType c_type, int ldc, long long stride_c, int batch) {
  // op(A) packed row-major [m, k] and op(B) as rows of its columns [n, k], in f32; oneDNN
  // multiplies them (the emulator checks the indexing, not the arithmetic), and C is
  // written back column-major.
  std::vector<float> a_packed(static_cast<std::size_t>(m) * k);
  std::vector<float> b_packed(static_cast<std::size_t>(n) * k);
  std::vector<float> product(static_cast<std::size_t>(m) * n);
  for (int p = 0; p < batch; ++p) {
    const long long a0 = p * stride_a, b0 = p * stride_b;
    for (long long i = 0; i < m; ++i)
      for (long long l = 0; l < k; ++l)
        a_packed[i * k + l] = load(a, a_type, a0 + (ta ? l + i * lda : i + l * lda));
    for (long long j = 0; j < n; ++j)
      for (long long l = 0; l < k; ++l)
        b_packed[j * k + l] = load(b, b_type, b0 + (tb ? j + l * ldb : l + j * ldb));
    if (k > 0 && m > 0 && n > 0 &&
        dnnl_sgemm('N', 'T', m, n, k, 1.0f, a_packed.data(), k, b_packed.data(), k, 0.0f,
                   product.data(), n) != dnnl_success)
      return false;
    if (k == 0)
      std::fill(product.begin(), product.end(), 0.0f);
    for (long long j = 0; j < n; ++j)
      for (long long i = 0; i < m; ++i) {
        const long long index = p * stride_c + i + j * ldc;
        float result = alpha * product[i * n + j];
        // With beta == 0, C is written without being read (it may hold NaN), as in cuBLAS.
        if (beta != 0.0f)
          result += beta * load(c, c_type, index);
        if (c_type == CUDA_R_32F)
          static_cast<float*>(c)[index] = result;
        else
          static_cast<__nv_bfloat16*>(c)[index] = __float2bfloat16_rn(result);
      }
  }
  return true;
}

// ---- cuBLASLt: D = epilogue(alpha op(A) op(B) + beta C), column-major ---------------------

// The epilogues the emulator runs, as cuBLASLt documents them: on alpha A B + beta C, the
// bias (one value per row of D) is added first, then ReLU or GELU; GELU_AUX stores GELU's input in
// the aux matrix; DGELU multiplies the product by GELU's gradient at the aux matrix's value. GELU
// is the tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). A GPU's cuBLASLt rounds it its
// own way: callers compare within a tolerance, not bit for bit.
constexpr std::uint32_t kLtEpilogues[] = {
    CUBLASLT_EPILOGUE_DEFAULT,   CUBLASLT_EPILOGUE_BIAS,          CUBLASLT_EPILOGUE_RELU,
    CUBLASLT_EPILOGUE_RELU_BIAS, CUBLASLT_EPILOGUE_GELU,          CUBLASLT_EPILOGUE_GELU_BIAS,
    CUBLASLT_EPILOGUE_GELU_AUX,  CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU};

float lt_gelu(float x) {
  const float k = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}
float lt_gelu_grad(float x) {
  const float k = 0.7978845608028654f;
  float x2 = x * x, t = std::tanh(k * (x + 0.044715f * x2 * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * x2);
}

template <class T>
bool set_from(const void* buf, std::size_t bytes, T& field) {
  if (bytes != sizeof(T))
    return false;
  std::memcpy(&field, buf, sizeof(T));
  return true;
}

// cuBLASLt's descriptors are host objects in one of the device's tables, by handle.
template <class Handle, class Object>
cublasStatus_t lt_make(std::map<std::uintptr_t, Object> Device::*table, Handle* handle,
                       Object value) {
  *handle = new_handle<Handle>();
  Device& d = device();
  std::lock_guard lock(d.mutex);
  (d.*table)[reinterpret_cast<std::uintptr_t>(*handle)] = value;
  return CUBLAS_STATUS_SUCCESS;
}
template <class Handle, class Object>
cublasStatus_t lt_drop(std::map<std::uintptr_t, Object> Device::*table, Handle handle,
                       const char* call) {
  Device& d = device();
  std::lock_guard lock(d.mutex);
  return (d.*table).erase(reinterpret_cast<std::uintptr_t>(handle)) == 1
             ? CUBLAS_STATUS_SUCCESS
             : fail(CUBLAS_STATUS_INVALID_VALUE, std::string(call) + ": not a live handle");
}

cublasStatus_t lt_set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                const void* buf, std::size_t bytes) {
  Device& d = device();
  std::lock_guard lock(d.mutex);
  auto it = d.lt_descs.find(reinterpret_cast<std::uintptr_t>(desc));
  if (it == d.lt_descs.end())
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                "cublasLtMatmulDescSetAttribute: not a live descriptor");
  LtDesc& x = it->second;
  bool ok = false;
  switch (attr) {  // each attribute's value is its type's bytes
    // clang-format off
    case CUBLASLT_MATMUL_DESC_TRANSA: ok = set_from(buf, bytes, x.transa); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: ok = set_from(buf, bytes, x.transb); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ok = set_from(buf, bytes, x.epilogue); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ok = set_from(buf, bytes, x.bias); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: ok = set_from(buf, bytes, x.aux); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: ok = set_from(buf, bytes, x.aux_ld); break;
    // clang-format on
    default:
      return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "cublasLtMatmulDescSetAttribute: the emulator has "
                  "TRANSA, TRANSB, EPILOGUE, BIAS_POINTER, "
                  "EPILOGUE_AUX_POINTER and EPILOGUE_AUX_LD only; "
                  "asked for attribute " +
                      std::to_string(static_cast<int>(attr)));
  }
  return ok ? CUBLAS_STATUS_SUCCESS
            : fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescSetAttribute: attribute " +
                                                    std::to_string(static_cast<int>(attr)) +
                                                    " given " + std::to_string(bytes) +
                                                    " bytes, not its type's size");
}

cublasStatus_t lt_matmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc_handle, const void* alpha_ptr,
                         const void* a, cublasLtMatrixLayout_t a_layout, const void* b,
                         cublasLtMatrixLayout_t b_layout, const void* beta_ptr, const void* c,
                         cublasLtMatrixLayout_t c_layout, void* d_data,
                         cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t*, void*,
                         std::size_t, cudaStream_t stream) {
  LtDesc desc;
  LtLayout la, lb, lc, ld;
  {
    Device& d = device();
    std::lock_guard lock(d.mutex);
    auto found = d.lt_descs.find(reinterpret_cast<std::uintptr_t>(desc_handle));
    if (found == d.lt_descs.end())
      return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: not a live matmul descriptor");
    desc = found->second;
    LtLayout* out[] = {&la, &lb, &lc, &ld};
    cublasLtMatrixLayout_t in[] = {a_layout, b_layout, c_layout, d_layout};
    for (int i = 0; i < 4; ++i) {
      auto it = d.lt_layouts.find(reinterpret_cast<std::uintptr_t>(in[i]));
      if (it == d.lt_layouts.end())
        return fail(CUBLAS_STATUS_INVALID_VALUE,
                    std::string("cublasLtMatmul: layout of ") + "ABCD"[i] + " is not live");
      *out[i] = it->second;
    }
  }
  const bool ta = desc.transa != CUBLAS_OP_N, tb = desc.transb != CUBLAS_OP_N;
  const long long m = static_cast<long long>(ld.rows), n = static_cast<long long>(ld.cols);
  const long long k = static_cast<long long>(ta ? la.rows : la.cols);
  const long long a_rows = ta ? la.cols : la.rows, b_rows = tb ? lb.cols : lb.rows,
                  b_cols = tb ? lb.rows : lb.cols;
  if (a_rows != m || b_rows != k || b_cols != n || lc.rows != ld.rows || lc.cols != ld.cols)
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                "cublasLtMatmul: op(A) " + std::to_string(a_rows) + " x " + std::to_string(k) +
                    ", op(B) " + std::to_string(b_rows) + " x " + std::to_string(b_cols) +
                    " and D " + std::to_string(m) + " x " + std::to_string(n) + " do not chain");
  for (const LtLayout* l : {&la, &lb, &lc, &ld})
    if (l->ld < std::max<std::int64_t>(1, static_cast<std::int64_t>(l->rows)))
      return fail(CUBLAS_STATUS_INVALID_VALUE,
                  "cublasLtMatmul: a leading dimension " + std::to_string(l->ld) +
                      " below its layout's rows " + std::to_string(l->rows));
  if (la.type != lb.type || (la.type != CUDA_R_32F && la.type != CUDA_R_16BF) ||
      lc.type != CUDA_R_32F || ld.type != CUDA_R_32F || desc.compute != CUBLAS_COMPUTE_32F ||
      desc.scale != CUDA_R_32F)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                "cublasLtMatmul: the emulator has f32 or bf16 operands, f32 results and scale, "
                "and CUBLAS_COMPUTE_32F only");
  if (std::find(std::begin(kLtEpilogues), std::end(kLtEpilogues), desc.epilogue) ==
      std::end(kLtEpilogues))
    return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                "cublasLtMatmul: the emulator has no epilogue " + std::to_string(desc.epilogue));
  const bool bias =
      (desc.epilogue & CUBLASLT_EPILOGUE_BIAS) != 0 && desc.epilogue != CUBLASLT_EPILOGUE_DGELU;
  const bool relu = (desc.epilogue & CUBLASLT_EPILOGUE_RELU) != 0;
  const bool gelu = (desc.epilogue & CUBLASLT_EPILOGUE_GELU) != 0;
  const bool dgelu = desc.epilogue == CUBLASLT_EPILOGUE_DGELU;
  const bool aux = (desc.epilogue & 128) != 0;  // GELU_AUX stores it, DGELU reads it
  if (bias && desc.bias == nullptr)
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                "cublasLtMatmul: a bias epilogue without BIAS_POINTER");
  if (aux && (desc.aux == nullptr || desc.aux_ld < m || desc.aux_ld % 8 != 0))
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                "cublasLtMatmul: epilogue " + std::to_string(desc.epilogue) +
                    " needs EPILOGUE_AUX_POINTER and an EPILOGUE_AUX_LD divisible by 8 and at "
                    "least D's rows (" +
                    std::to_string(m) + "); given " + std::to_string(desc.aux_ld));
  const float alpha = *static_cast<const float*>(alpha_ptr);
  const float beta = *static_cast<const float*>(beta_ptr);
  for (const std::string& why :
       {operand_outside("A", a, la.type, static_cast<long long>(la.rows),
                        static_cast<long long>(la.cols), la.ld, 0, 1),
        operand_outside("B", b, lb.type, static_cast<long long>(lb.rows),
                        static_cast<long long>(lb.cols), lb.ld, 0, 1),
        operand_outside("D", d_data, ld.type, m, n, ld.ld, 0, 1),
        beta != 0.0f ? operand_outside("C", c, lc.type, m, n, lc.ld, 0, 1) : std::string(),
        bias ? operand_outside("bias", desc.bias, CUDA_R_32F, m, 1, m, 0, 1) : std::string(),
        aux ? operand_outside("aux", desc.aux, CUDA_R_32F, m, n, desc.aux_ld, 0, 1)
            : std::string()})
    if (!why.empty())
      return fail(CUBLAS_STATUS_EXECUTION_FAILED, "cublasLtMatmul: " + why);
  auto product = [=] {
    if (beta != 0.0f && c != d_data)  // C into D first; the product then adds beta D
      for (long long j = 0; j < n; ++j)
        for (long long i = 0; i < m; ++i)
          static_cast<float*>(d_data)[i + j * ld.ld] = static_cast<const float*>(c)[i + j * lc.ld];
    if (!gemm_product(ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha,
                      a, la.type, static_cast<int>(la.ld), 0, b, lb.type, static_cast<int>(lb.ld),
                      0, beta, d_data, ld.type, static_cast<int>(ld.ld), 0, 1))
      return fail(CUDA_ERROR_LAUNCH_FAILED, "cublasLtMatmul: dnnl_sgemm failed");
    auto* out = static_cast<float*>(d_data);
    const auto* bias_values = static_cast<const float*>(desc.bias);
    auto* aux_values = static_cast<float*>(desc.aux);
    for (long long j = 0; j < n; ++j)
      for (long long i = 0; i < m; ++i) {
        float& v = out[i + j * ld.ld];
        if (bias)
          v += bias_values[i];
        if (dgelu) {
          v *= lt_gelu_grad(aux_values[i + j * desc.aux_ld]);
          continue;
        }
        if (aux)
          aux_values[i + j * desc.aux_ld] = v;
        if (relu)
          v = v > 0.0f ? v : 0.0f;
        if (gelu)
          v = lt_gelu(v);
      }
    return CUDA_SUCCESS;
  };
  return enqueue(reinterpret_cast<CUstream>(stream), product) == CUDA_SUCCESS
             ? CUBLAS_STATUS_SUCCESS
             : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace

void add_blas(Api& a) {
  a.cublasCreate = [](cublasHandle_t* handle) {
    *handle = new_handle<cublasHandle_t>();
    return CUBLAS_STATUS_SUCCESS;
  };
  a.cublasDestroy = [](cublasHandle_t) { return CUBLAS_STATUS_SUCCESS; };
  a.cublasSetStream = [](cublasHandle_t handle, cudaStream_t stream) {
    Device& d = device();
    std::lock_guard lock(d.queues);
    d.blas_streams[reinterpret_cast<std::uintptr_t>(handle)] =
        reinterpret_cast<std::uintptr_t>(stream);
    return CUBLAS_STATUS_SUCCESS;
  };
  a.cublasSetMathMode = [](cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; };
  a.cublasGemmStridedBatchedEx = gemm_strided_batched;
  a.cublasLtCreate = [](cublasLtHandle_t* handle) {
    *handle = new_handle<cublasLtHandle_t>();
    return CUBLAS_STATUS_SUCCESS;
  };
  a.cublasLtDestroy = [](cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; };
  a.cublasLtMatmulDescCreate = [](cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                  cudaDataType_t scale) {
    return lt_make(&Device::lt_descs, desc, LtDesc{compute, scale});
  };
  a.cublasLtMatmulDescDestroy = [](cublasLtMatmulDesc_t desc) {
    return lt_drop(&Device::lt_descs, desc, "cublasLtMatmulDescDestroy");
  };
  a.cublasLtMatmulDescSetAttribute = lt_set_attribute;
  a.cublasLtMatrixLayoutCreate = [](cublasLtMatrixLayout_t* layout, cudaDataType type,
                                    std::uint64_t rows, std::uint64_t cols, std::int64_t ld) {
    return lt_make(&Device::lt_layouts, layout, LtLayout{type, rows, cols, ld});
  };
  a.cublasLtMatrixLayoutDestroy = [](cublasLtMatrixLayout_t layout) {
    return lt_drop(&Device::lt_layouts, layout, "cublasLtMatrixLayoutDestroy");
  };
  a.cublasLtMatmul = lt_matmul;
}

}  // namespace loom::cuda::emulator::detail
