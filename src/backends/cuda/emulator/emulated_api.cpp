#include "backends/cuda/emulator/emulated_api.h"

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

#include "backends/cuda/emulator/emulated_kernels.h"
#include "core/error.h"

namespace loom::cuda::emulator {
namespace {

using Clock = std::chrono::steady_clock;

thread_local std::string problem;

CUresult fail(CUresult status, std::string why) {
  problem = std::move(why);
  return status;
}
cublasStatus_t fail(cublasStatus_t status, std::string why) {
  problem = std::move(why);
  return status;
}

// A cuBLASLt matmul descriptor: the attributes Loom sets (cublasLtMatmulDescSetAttribute).
struct LtDesc {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType scale = CUDA_R_32F;
  std::int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  std::uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  std::int64_t aux_ld = 0;
};
// A cuBLASLt matrix layout: a column-major rows x cols matrix, ld apart.
struct LtLayout {
  cudaDataType type = CUDA_R_32F;
  std::uint64_t rows = 0, cols = 0;
  std::int64_t ld = 0;
};

// Device memory is host memory, aligned as cuMemAlloc aligns it (256 bytes) and filled
// with 0xff bytes (NaN as f32) so that a kernel reading memory nobody wrote shows it.
struct Allocation {
  std::unique_ptr<std::byte[]> owner;
  std::size_t bytes = 0;
};

// Streams run late. Work enqueued on a stream is queued, not run; it runs when the host
// must see it (the stream or an event on it synchronized, a synchronous copy) or when a
// stream being run waits for it (cuStreamWaitEvent). So a stream that reads what another
// stream writes without waiting for it reads memory not yet written, every time, instead
// of only when a GPU's timing happens to expose the race. An event query reports only
// what has run: polling alone never runs work (a host that needs it waits on it). The
// legacy stream (0) is synchronous with every stream, as CUDA's legacy default stream is
// with blocking streams: before its work runs, every queue runs to its end.
struct QueuedWork {
  std::function<CUresult()> run;  // null for a wait
  // A cuStreamWaitEvent: stream `wait_stream` must first have run `wait_until` entries.
  std::uintptr_t wait_stream = 0;
  std::uint64_t wait_until = 0;
};
struct EmulatedStream {
  std::deque<QueuedWork> queue;
  std::uint64_t enqueued = 0, completed = 0;  // entries ever queued, and run
  bool running = false;
};
struct EmulatedEvent {
  std::uintptr_t stream = 0;   // 0: never recorded, or recorded on the legacy stream
  std::uint64_t position = 0;  // complete once the stream has run this many entries
  Clock::time_point when = Clock::now();
};

struct Device {
  std::mutex mutex;
  std::map<std::uintptr_t, Allocation> allocations;  // by the address handed out
  std::map<std::uintptr_t, bool> freeing;            // frees queued on a stream, not yet run
  std::uintptr_t next_handle = 0x1000;
  // Streams, events, the stream each cuBLAS handle enqueues on; work runs under it, one
  // entry at a time (one device).
  std::mutex queues;
  std::map<std::uintptr_t, EmulatedStream> streams;
  std::map<std::uintptr_t, EmulatedEvent> events;
  std::map<std::uintptr_t, std::uintptr_t> blas_streams;
  // cuBLASLt's descriptors: host objects, by handle (under `mutex`).
  std::map<std::uintptr_t, struct LtDesc> lt_descs;
  std::map<std::uintptr_t, struct LtLayout> lt_layouts;
};
Device& device() {
  static Device d;
  return d;
}

template <class Handle>
Handle new_handle() {
  Device& d = device();
  std::lock_guard lock(d.mutex);
  d.next_handle += 64;
  return reinterpret_cast<Handle>(d.next_handle);
}

std::string hex(std::uintptr_t address) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(address));
  return text;
}

// "" when [address, address + bytes) lies inside one live allocation, else why not.
std::string outside_allocation(std::uintptr_t address, std::size_t bytes) {
  Device& d = device();
  std::lock_guard lock(d.mutex);
  auto it = d.allocations.upper_bound(address);
  if (it == d.allocations.begin())
    return hex(address) + " is below every allocation";
  --it;
  const std::uintptr_t start = it->first, end = start + it->second.bytes;
  if (address >= end)
    return hex(address) + " is past the end of the allocation at " + hex(start) + " (" +
           std::to_string(it->second.bytes) + " bytes; freed memory, or never allocated)";
  if (bytes > end - address)
    return std::to_string(bytes) + " bytes from " + hex(address) + " run " +
           std::to_string(bytes - (end - address)) + " bytes past the allocation at " + hex(start) +
           " (" + std::to_string(it->second.bytes) + " bytes)";
  return "";
}

CUresult check_range(std::uintptr_t address, std::size_t bytes, const char* call) {
  if (bytes == 0)
    return CUDA_SUCCESS;
  std::string why = outside_allocation(address, bytes);
  return why.empty() ? CUDA_SUCCESS
                     : fail(CUDA_ERROR_INVALID_VALUE, std::string(call) + ": " + why);
}

// ---- stream queues (with device().queues held) -------------------------------------------

std::uintptr_t key(CUstream stream) {
  return reinterpret_cast<std::uintptr_t>(stream);
}

// Runs `stream`'s entries until it has run `until` of them; a wait first runs the stream
// it waits on. Returns the first failure, with its text in `problem` (later entries still
// run: a failure is reported by the call that made the work run).
CUresult run_until(std::uintptr_t id, std::uint64_t until) {
  Device& d = device();
  auto found = d.streams.find(id);
  if (found == d.streams.end())
    return CUDA_SUCCESS;  // destroyed: its work ran before it went
  EmulatedStream& stream = found->second;
  if (stream.completed >= until)
    return CUDA_SUCCESS;
  if (stream.running)
    return fail(CUDA_ERROR_INVALID_VALUE,
                "streams wait on each other in a cycle (a wait for work queued after it)");
  CUresult first = CUDA_SUCCESS;
  std::string first_problem;
  stream.running = true;
  while (stream.completed < until && !stream.queue.empty()) {
    QueuedWork work = std::move(stream.queue.front());
    stream.queue.pop_front();
    CUresult status = work.run ? work.run() : run_until(work.wait_stream, work.wait_until);
    ++stream.completed;
    if (status != CUDA_SUCCESS && first == CUDA_SUCCESS) {
      first = status;
      first_problem = problem;
    }
  }
  stream.running = false;
  if (first != CUDA_SUCCESS)
    problem = first_problem;
  return first;
}

CUresult run_all() {
  Device& d = device();
  std::vector<std::pair<std::uintptr_t, std::uint64_t>> ends;
  for (auto& [id, stream] : d.streams)
    ends.emplace_back(id, stream.enqueued);
  CUresult first = CUDA_SUCCESS;
  for (auto [id, end] : ends)
    if (CUresult status = run_until(id, end); status != CUDA_SUCCESS && first == CUDA_SUCCESS)
      first = status;
  return first;
}

// Queues `work` on `stream`; on the legacy stream it runs now, after every queue.
CUresult enqueue(CUstream stream, std::function<CUresult()> work) {
  Device& d = device();
  std::lock_guard lock(d.queues);
  if (stream == nullptr) {
    if (CUresult status = run_all(); status != CUDA_SUCCESS)
      return status;
    return work();
  }
  auto found = d.streams.find(key(stream));
  if (found == d.streams.end())
    return fail(CUDA_ERROR_INVALID_HANDLE,
                "a stream that cuStreamCreate did not make, or destroyed");
  found->second.queue.push_back({std::move(work), 0, 0});
  ++found->second.enqueued;
  return CUDA_SUCCESS;
}

const char* error_name(CUresult status) {
  switch (status) {
    case CUDA_SUCCESS:
      return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE:
      return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY:
      return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_INVALID_DEVICE:
      return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_HANDLE:
      return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_FOUND:
      return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_LAUNCH_FAILED:
      return "CUDA_ERROR_LAUNCH_FAILED";
    case CUDA_ERROR_NOT_READY:
      return "CUDA_ERROR_NOT_READY";
    default:
      return nullptr;
  }
}

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

// ---- kernels -------------------------------------------------------------------------------

CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                unsigned bz, unsigned shared_bytes, CUstream stream, void** params, void** extra) {
  auto* kernel = reinterpret_cast<EmulatedKernel*>(f);
  if (kernel == nullptr)
    return fail(CUDA_ERROR_INVALID_HANDLE, "cuLaunchKernel: a null function");
  const std::string shape = "grid (" + std::to_string(gx) + "," + std::to_string(gy) + "," +
                            std::to_string(gz) + "), block (" + std::to_string(bx) + "," +
                            std::to_string(by) + "," + std::to_string(bz) + ")";
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 || gx > 0x7fffffffu ||
      gy > 65535 || gz > 65535 || bx > 1024 || by > 1024 || bz > 64 ||
      static_cast<unsigned long long>(bx) * by * bz > 1024)
    return fail(CUDA_ERROR_INVALID_VALUE,
                "cuLaunchKernel '" + kernel->name + "': " + shape + " is outside CUDA's limits");
  if (shared_bytes != 0 || extra != nullptr || params == nullptr)
    return fail(CUDA_ERROR_INVALID_VALUE,
                "cuLaunchKernel '" + kernel->name +
                    "': the emulator takes parameters as kernelParams only, with no dynamic "
                    "shared memory");
  std::function<void()> call = kernel->bind(params);
  return enqueue(stream, [kernel, call, shape, grid = Dim3{gx, gy, gz}, block = Dim3{bx, by, bz}] {
    try {
      run_grid(kernel->name, grid, block, call, kernel->profile);
    } catch (const Error& e) {
      return fail(CUDA_ERROR_LAUNCH_FAILED, std::string(e.what()) + " (" + shape + ")");
    }
    return CUDA_SUCCESS;
  });
}

Api make_api() {
  Api a;
  a.cuInit = [](unsigned) { return CUDA_SUCCESS; };
  a.cuDriverGetVersion = [](int* version) {
    *version = CUDA_VERSION;
    return CUDA_SUCCESS;
  };
  a.cuDeviceGetCount = [](int* count) {
    *count = 1;
    return CUDA_SUCCESS;
  };
  a.cuDeviceGet = [](CUdevice* dev, int ordinal) {
    if (ordinal != 0)
      return fail(CUDA_ERROR_INVALID_DEVICE, "the emulator has one device, 0");
    *dev = 0;
    return CUDA_SUCCESS;
  };
  a.cuDeviceGetName = [](char* name, int length, CUdevice) {
    std::snprintf(name, static_cast<std::size_t>(length), "%s", "Loom CUDA emulator on the CPU");
    return CUDA_SUCCESS;
  };
  a.cuDeviceTotalMem = [](std::size_t* bytes, CUdevice) {
    *bytes = std::size_t{16} << 30;
    return CUDA_SUCCESS;
  };
  a.cuDeviceGetAttribute = [](int* value, CUdevice_attribute attribute, CUdevice) {
    switch (attribute) {
      case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        *value = 9;
        break;
      case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        *value = 0;
        break;
      case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *value = 1;
        break;
      case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
        *value = 1024;
        break;
      case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
        *value = 32;
        break;
      default:
        *value = 0;
        break;
    }
    return CUDA_SUCCESS;
  };
  a.cuDevicePrimaryCtxRetain = [](CUcontext* context, CUdevice) {
    *context = new_handle<CUcontext>();
    return CUDA_SUCCESS;
  };
  a.cuDevicePrimaryCtxRelease = [](CUdevice) { return CUDA_SUCCESS; };
  a.cuCtxSetCurrent = [](CUcontext) { return CUDA_SUCCESS; };
  a.cuGetErrorName = [](CUresult status, const char** name) {
    *name = error_name(status);
    return *name ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  };
  a.cuGetErrorString = [](CUresult status, const char** text) {
    *text = error_name(status);
    return *text ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  };
  a.cuMemAllocAsync = [](CUdeviceptr* address, std::size_t bytes, CUstream) {
    Allocation allocation{std::make_unique_for_overwrite<std::byte[]>(bytes + 255), bytes};
    std::memset(allocation.owner.get(), 0xff, bytes + 255);
    auto start =
        (reinterpret_cast<std::uintptr_t>(allocation.owner.get()) + 255) & ~std::uintptr_t{255};
    Device& d = device();
    std::lock_guard lock(d.mutex);
    d.allocations.emplace(start, std::move(allocation));
    *address = static_cast<CUdeviceptr>(start);
    return CUDA_SUCCESS;
  };
  a.cuMemFreeAsync = [](CUdeviceptr address, CUstream stream) {
    Device& d = device();
    const auto where = static_cast<std::uintptr_t>(address);
    {
      std::lock_guard lock(d.mutex);
      if (d.allocations.count(where) == 0 || d.freeing.count(where) != 0)
        return fail(CUDA_ERROR_INVALID_VALUE,
                    "cuMemFreeAsync: " + hex(address) + " is not the start of a live allocation");
      d.freeing[where] = true;
    }
    return enqueue(stream, [where] {  // the memory stays until the stream reaches the free
      Device& dev = device();
      std::lock_guard lock(dev.mutex);
      dev.freeing.erase(where);
      dev.allocations.erase(where);
      return CUDA_SUCCESS;
    });
  };
  a.cuDeviceGetDefaultMemPool = [](CUmemoryPool* pool, CUdevice) {
    *pool = new_handle<CUmemoryPool>();
    return CUDA_SUCCESS;
  };
  a.cuMemPoolSetAttribute = [](CUmemoryPool, CUmemPool_attribute, void*) { return CUDA_SUCCESS; };
  // Synchronous copies run on the legacy stream: after every stream's queued work.
  a.cuMemcpyHtoD = [](CUdeviceptr dst, const void* src, std::size_t bytes) {
    if (CUresult r = check_range(dst, bytes, "cuMemcpyHtoD"); r != CUDA_SUCCESS)
      return r;
    return enqueue(nullptr, [=] {
      std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
      return CUDA_SUCCESS;
    });
  };
  a.cuMemcpyDtoH = [](void* dst, CUdeviceptr src, std::size_t bytes) {
    if (CUresult r = check_range(src, bytes, "cuMemcpyDtoH"); r != CUDA_SUCCESS)
      return r;
    return enqueue(nullptr, [=] {
      std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
      return CUDA_SUCCESS;
    });
  };
  // From pageable host memory, as CUDA does: the bytes are staged before the call returns,
  // so the host memory may be reused at once.
  a.cuMemcpyHtoDAsync = [](CUdeviceptr dst, const void* src, std::size_t bytes, CUstream stream) {
    if (CUresult r = check_range(dst, bytes, "cuMemcpyHtoDAsync"); r != CUDA_SUCCESS)
      return r;
    auto staged = std::make_shared<std::vector<std::byte>>(
        static_cast<const std::byte*>(src), static_cast<const std::byte*>(src) + bytes);
    return enqueue(stream, [=] {
      if (CUresult r = check_range(dst, bytes, "cuMemcpyHtoDAsync (when it ran)");
          r != CUDA_SUCCESS)
        return r;
      std::memcpy(reinterpret_cast<void*>(dst), staged->data(), bytes);
      return CUDA_SUCCESS;
    });
  };
  // To pageable host memory, as CUDA does: returns once the copy is done.
  a.cuMemcpyDtoHAsync = [](void* dst, CUdeviceptr src, std::size_t bytes, CUstream stream) {
    if (CUresult r = check_range(src, bytes, "cuMemcpyDtoHAsync"); r != CUDA_SUCCESS)
      return r;
    CUresult queued = enqueue(stream, [=] {
      if (CUresult r = check_range(src, bytes, "cuMemcpyDtoHAsync (when it ran)");
          r != CUDA_SUCCESS)
        return r;
      std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
      return CUDA_SUCCESS;
    });
    if (queued != CUDA_SUCCESS || stream == nullptr)
      return queued;
    Device& d = device();
    std::lock_guard lock(d.queues);
    return run_until(key(stream), d.streams[key(stream)].enqueued);
  };
  a.cuMemcpyDtoDAsync = [](CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream) {
    for (auto [address, what] : {std::pair{dst, "cuMemcpyDtoDAsync (destination)"},
                                 std::pair{src, "cuMemcpyDtoDAsync (source)"}})
      if (CUresult r = check_range(address, bytes, what); r != CUDA_SUCCESS)
        return r;
    if (bytes != 0 && dst < src + bytes && src < dst + bytes)
      return fail(CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoDAsync: source and destination overlap");
    return enqueue(stream, [=] {
      for (auto [address, what] : {std::pair{dst, "cuMemcpyDtoDAsync (destination, when it ran)"},
                                   std::pair{src, "cuMemcpyDtoDAsync (source, when it ran)"}})
        if (CUresult r = check_range(address, bytes, what); r != CUDA_SUCCESS)
          return r;
      std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
      return CUDA_SUCCESS;
    });
  };
  a.cuMemsetD32Async = [](CUdeviceptr dst, unsigned value, std::size_t count, CUstream stream) {
    if (CUresult r = check_range(dst, count * 4, "cuMemsetD32Async"); r != CUDA_SUCCESS)
      return r;
    return enqueue(stream, [=] {
      if (CUresult r = check_range(dst, count * 4, "cuMemsetD32Async (when it ran)");
          r != CUDA_SUCCESS)
        return r;
      auto* words = reinterpret_cast<unsigned*>(dst);
      std::fill(words, words + count, value);
      return CUDA_SUCCESS;
    });
  };
  a.cuStreamCreate = [](CUstream* stream, unsigned) {
    *stream = new_handle<CUstream>();
    Device& d = device();
    std::lock_guard lock(d.queues);
    d.streams[key(*stream)];
    return CUDA_SUCCESS;
  };
  // The stream's queued work still runs (as CUDA finishes it after the call returns).
  a.cuStreamDestroy = [](CUstream stream) {
    Device& d = device();
    std::lock_guard lock(d.queues);
    auto found = d.streams.find(key(stream));
    if (found == d.streams.end())
      return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy: not a live stream");
    CUresult status = run_until(found->first, found->second.enqueued);
    d.streams.erase(key(stream));
    return status;
  };
  a.cuStreamSynchronize = [](CUstream stream) {
    Device& d = device();
    std::lock_guard lock(d.queues);
    if (stream == nullptr)
      return run_all();
    auto found = d.streams.find(key(stream));
    if (found == d.streams.end())
      return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamSynchronize: not a live stream");
    return run_until(found->first, found->second.enqueued);
  };
  // Waits for the event's latest record as it stands now; an event never recorded is
  // complete.
  a.cuStreamWaitEvent = [](CUstream stream, CUevent event, unsigned) {
    Device& d = device();
    std::lock_guard lock(d.queues);
    auto e = d.events.find(reinterpret_cast<std::uintptr_t>(event));
    if (e == d.events.end())
      return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamWaitEvent: not a live event");
    if (e->second.stream == 0)
      return CUDA_SUCCESS;
    if (stream == nullptr)
      return run_until(e->second.stream, e->second.position);
    auto found = d.streams.find(key(stream));
    if (found == d.streams.end())
      return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamWaitEvent: not a live stream");
    found->second.queue.push_back({nullptr, e->second.stream, e->second.position});
    ++found->second.enqueued;
    return CUDA_SUCCESS;
  };
  a.cuEventCreate = [](CUevent* event, unsigned) {
    *event = new_handle<CUevent>();
    Device& d = device();
    std::lock_guard lock(d.queues);
    d.events[reinterpret_cast<std::uintptr_t>(*event)] = EmulatedEvent{};
    return CUDA_SUCCESS;
  };
  a.cuEventDestroy = [](CUevent event) {
    Device& d = device();
    std::lock_guard lock(d.queues);
    return d.events.erase(reinterpret_cast<std::uintptr_t>(event)) ? CUDA_SUCCESS
                                                                   : CUDA_ERROR_INVALID_HANDLE;
  };
  a.cuEventRecord = [](CUevent event, CUstream stream) {
    const auto id = reinterpret_cast<std::uintptr_t>(event);
    {
      Device& d = device();
      std::lock_guard lock(d.queues);
      if (d.events.count(id) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventRecord: not a live event");
    }
    CUresult status = enqueue(stream, [id] {  // the time when the stream reaches it
      auto found = device().events.find(id);
      if (found != device().events.end())
        found->second.when = Clock::now();
      return CUDA_SUCCESS;
    });
    if (status != CUDA_SUCCESS)
      return status;
    Device& d = device();
    std::lock_guard lock(d.queues);
    EmulatedEvent& e = d.events[id];
    e.stream = stream == nullptr ? 0 : key(stream);
    e.position = stream == nullptr ? 0 : d.streams[key(stream)].enqueued;
    return CUDA_SUCCESS;
  };
  a.cuEventQuery = [](CUevent event) {
    Device& d = device();
    std::lock_guard lock(d.queues);
    auto e = d.events.find(reinterpret_cast<std::uintptr_t>(event));
    if (e == d.events.end())
      return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventQuery: not a live event");
    auto stream = d.streams.find(e->second.stream);
    const bool done = e->second.stream == 0 || stream == d.streams.end() ||
                      stream->second.completed >= e->second.position;
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  };
  a.cuEventSynchronize = [](CUevent event) {
    Device& d = device();
    std::lock_guard lock(d.queues);
    auto e = d.events.find(reinterpret_cast<std::uintptr_t>(event));
    if (e == d.events.end())
      return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventSynchronize: not a live event");
    return run_until(e->second.stream, e->second.position);
  };
  a.cuEventElapsedTime = [](float* ms, CUevent start, CUevent end) {
    Device& d = device();
    std::lock_guard lock(d.queues);
    auto s = d.events.find(reinterpret_cast<std::uintptr_t>(start));
    auto e = d.events.find(reinterpret_cast<std::uintptr_t>(end));
    if (s == d.events.end() || e == d.events.end())
      return CUDA_ERROR_INVALID_HANDLE;
    *ms = std::chrono::duration<float, std::milli>(e->second.when - s->second.when).count();
    return CUDA_SUCCESS;
  };
  a.cuModuleLoadData = [](CUmodule* module, const void* image) {
    if (image == nullptr)
      return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleLoadData: no image");
    *module = new_handle<CUmodule>();  // the kernels are compiled in (emulated_kernels.cpp)
    return CUDA_SUCCESS;
  };
  a.cuModuleUnload = [](CUmodule) { return CUDA_SUCCESS; };
  a.cuModuleGetFunction = [](CUfunction* function, CUmodule, const char* name) {
    EmulatedKernel* kernel = find_kernel(name);
    if (kernel == nullptr)
      return fail(CUDA_ERROR_NOT_FOUND,
                  std::string("cuModuleGetFunction: kernels.cu has no kernel '") + name + "'");
    *function = reinterpret_cast<CUfunction>(kernel);
    return CUDA_SUCCESS;
  };
  a.cuLaunchKernel = launch;
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
  return a;
}

}  // namespace

const Api& api() {
  static const Api table = [] {
    // The kernel registry is a function-local static too: built here, before the backend
    // that launches from it (which opens this table), it is destroyed after that backend,
    // whose destructor may still run a stream's deferred launches at exit (statics end in
    // the reverse order of their construction).
    find_kernel("");
    return make_api();
  }();
  return table;
}

std::string last_problem() {
  std::string why = std::move(problem);
  problem.clear();
  return why;
}

}  // namespace loom::cuda::emulator
