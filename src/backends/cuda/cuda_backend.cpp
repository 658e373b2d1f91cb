#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "backends/cuda/kernel_args.h"
#include "backends/cuda/kernels_fatbin.h"  // generated: loom_cuda_fatbin[], from kernels.cu
#include "backends/device_ops.h"
#include "core/broadcast.h"
#include "core/error.h"

namespace loom::cuda {
namespace {

using i64 = long long;
constexpr unsigned kBlock = 256;  // threads per block of the 1-D and row kernels
constexpr unsigned kRowsPerBlock = kBlock / 32;

CUdeviceptr address(const Buffer& b, std::size_t offset) {
  return reinterpret_cast<CUdeviceptr>(b.data()) + offset;
}
template <class T = float>
T* ptr(const Tensor& t) {
  if (!t.defined())
    return nullptr;
  return reinterpret_cast<T*>(static_cast<std::byte*>(t.storage()->data()) +
                              static_cast<std::size_t>(t.offset()) * dtype_size(t.dtype()));
}
i64 numel(const Tensor& t) {
  return static_cast<i64>(t.numel());
}

class CudaStream final : public device_ops::DeviceStream {
 public:
  CudaStream(CudaBackend& backend, CUstream stream, bool owned)
      : DeviceStream(backend), backend_(backend), stream_(stream), owned_(owned) {}
  ~CudaStream() override {
    if (owned_)
      backend_.api().cuStreamDestroy(stream_);
  }
  void synchronize() override {
    check_cu(backend_.api().cuStreamSynchronize(stream_), "cuStreamSynchronize");
  }

 protected:
  void device_copy(const Buffer& src, std::size_t src_offset, Buffer& dst, std::size_t dst_offset,
                   std::size_t bytes) override {
    backend_.forget_copies_of(address(dst, dst_offset), address(dst, dst_offset) + bytes);
    check_cu(backend_.api().cuMemcpyDtoDAsync(address(dst, dst_offset), address(src, src_offset),
                                              bytes, stream_),
             "cuMemcpyDtoDAsync");
  }

 private:
  CudaBackend& backend_;
  CUstream stream_;
  bool owned_;
};

}  // namespace

std::unique_ptr<CudaBackend> CudaBackend::open(std::string* why) {
  const Api* a = cuda::api(why);
  if (a == nullptr)
    return nullptr;
  int ordinal = 0;
  if (const char* env = std::getenv("LOOM_CUDA_DEVICE"))
    ordinal = std::atoi(env);
  CUdevice device = 0;
  if (a->cuDeviceGet(&device, ordinal) != CUDA_SUCCESS) {
    if (why)
      *why = "no CUDA device " + std::to_string(ordinal) + " (LOOM_CUDA_DEVICE)";
    return nullptr;
  }
  int major = 0;
  a->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
  if (major < 8) {  // the fatbin holds sm_80 and sm_90 code and compute_90 PTX
    if (why)
      *why = "CUDA device " + std::to_string(ordinal) + " has compute capability " +
             std::to_string(major) + ".x; Loom's kernels need 8.0 or newer";
    return nullptr;
  }
  return std::make_unique<CudaBackend>(*a, device);
}

CudaBackend::CudaBackend(const Api& api, CUdevice device) : api_(api), device_(device) {
  check_cu(api_.cuDevicePrimaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain");
  check_cu(api_.cuCtxSetCurrent(context_), "cuCtxSetCurrent");
  // A blocking stream: the synchronous host copies (legacy stream) stay ordered with it.
  check_cu(api_.cuStreamCreate(&stream_, CU_STREAM_DEFAULT), "cuStreamCreate");
  // Keep freed memory in the pool instead of returning it to the driver at each sync.
  CUmemoryPool pool = nullptr;
  check_cu(api_.cuDeviceGetDefaultMemPool(&pool, device_), "cuDeviceGetDefaultMemPool");
  std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
  check_cu(api_.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep),
           "cuMemPoolSetAttribute");
  // The driver reads the fatbin's 8-byte header fields in place: hand it an aligned copy.
  std::vector<std::uint64_t> image((sizeof loom_cuda_fatbin + 7) / 8);
  std::memcpy(image.data(), loom_cuda_fatbin, sizeof loom_cuda_fatbin);
  check_cu(api_.cuModuleLoadData(&module_, image.data()), "cuModuleLoadData (Loom's kernels)");
  check_cublas(api_.cublasCreate(&cublas_), "cublasCreate");
  check_cublas(api_.cublasSetStream(cublas_, reinterpret_cast<cudaStream_t>(stream_)),
               "cublasSetStream");
  stream_wrapper_ = std::make_unique<CudaStream>(*this, stream_, false);
  std::size_t memory = 0;
  api_.cuDeviceTotalMem(&memory, device_);
  bf16_copy_budget_ = memory / 8;
}

CudaBackend::~CudaBackend() {
  std::vector<Bf16Copy> copies;  // freed while the stream still exists
  {
    std::lock_guard lock(bf16_copies_mutex_);
    copies.swap(bf16_copies_);
  }
  copies.clear();
  if (stream_ != nullptr)
    api_.cuStreamSynchronize(stream_);
  stream_wrapper_.reset();
  if (cublas_ != nullptr)
    api_.cublasDestroy(cublas_);
  if (module_ != nullptr)
    api_.cuModuleUnload(module_);
  if (stream_ != nullptr)
    api_.cuStreamDestroy(stream_);
  if (context_ != nullptr)
    api_.cuDevicePrimaryCtxRelease(device_);
}

DeviceInfo CudaBackend::info() const {
  DeviceInfo i;
  char name[256] = {};
  api_.cuDeviceGetName(name, sizeof name, device_);
  int driver = 0, sms = 0, major = 0, minor = 0;
  api_.cuDriverGetVersion(&driver);
  api_.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device_);
  api_.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device_);
  api_.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device_);
  i.name = "cuda (" + std::string(name) + ", sm_" + std::to_string(major) + std::to_string(minor) +
           ", " + std::to_string(sms) + " SMs, driver " + std::to_string(driver / 1000) + "." +
           std::to_string(driver % 1000 / 10) + ")";
  std::size_t bytes = 0;
  api_.cuDeviceTotalMem(&bytes, device_);
  i.memory_bytes = bytes;
  i.host_accessible = false;
  return i;
}

Buffer CudaBackend::allocate(std::size_t bytes, MemoryKind) {
  CUdeviceptr p = 0;
  check_cu(api_.cuMemAllocAsync(&p, std::max<std::size_t>(bytes, 4), stream_),
           ("cuMemAllocAsync of " + std::to_string(bytes) + " bytes").c_str());
  return Buffer(reinterpret_cast<void*>(p), bytes, this);
}

void CudaBackend::release(void* data, std::size_t bytes) noexcept {
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  forget_copies_of(begin, begin + bytes);
  api_.cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(data), stream_);
}

std::unique_ptr<Stream> CudaBackend::create_stream(StreamKind) {
  CUstream s = nullptr;
  check_cu(api_.cuStreamCreate(&s, CU_STREAM_DEFAULT), "cuStreamCreate");
  return std::make_unique<CudaStream>(*this, s, true);
}

void CudaBackend::upload(const void* host, Buffer& dst, std::size_t dst_offset, std::size_t bytes) {
  if (bytes == 0)
    return;
  forget_copies_of(address(dst, dst_offset), address(dst, dst_offset) + bytes);
  check_cu(api_.cuMemcpyHtoD(address(dst, dst_offset), host, bytes), "cuMemcpyHtoD");
}

void CudaBackend::download(const Buffer& src, std::size_t src_offset, void* host,
                           std::size_t bytes) {
  if (bytes == 0)
    return;
  check_cu(api_.cuMemcpyDtoH(host, address(src, src_offset), bytes), "cuMemcpyDtoH");
}

bool CudaBackend::set_matmul_precision(DType dtype) {
  if (dtype != DType::f32 && dtype != DType::bf16)
    return false;
  matmul_precision_ = dtype;
  return true;
}

CUfunction CudaBackend::function(const char* name) {
  std::lock_guard lock(mutex_);
  auto it = functions_.find(name);
  if (it != functions_.end())
    return it->second;
  CUfunction f = nullptr;
  check_cu(api_.cuModuleGetFunction(&f, module_, name),
           (std::string("cuModuleGetFunction ") + name).c_str());
  functions_.emplace(name, f);
  return f;
}

template <class... Args>
void CudaBackend::run(const char* name, unsigned grid_x, unsigned grid_y, unsigned block_x,
                      unsigned block_y, Args... args) {
  if (grid_x == 0 || grid_y == 0)
    return;
  // cuLaunchKernel copies the parameter values before it returns.
  void* params[] = {const_cast<void*>(static_cast<const void*>(&args))...};
  check_cu(api_.cuLaunchKernel(function(name), grid_x, grid_y, 1, block_x, block_y, 1, 0, stream_,
                               params, nullptr),
           name);
}

namespace {
// Column sums over many rows run in chunks of rows, so that enough blocks share the work
// (about 512 blocks in all, each over 256 rows or more); 1 when one block per 32 columns
// is enough.
i64 row_chunks(i64 rows, i64 cols) {
  const i64 col_blocks = std::max<i64>((cols + 31) / 32, 1);
  return std::clamp<i64>(rows / 256, 1, std::max<i64>(1, 512 / col_blocks));
}
}  // namespace

void CudaBackend::sum_columns(const float* x, float* y, i64 rows, i64 cols, float scale) {
  if (cols == 0)
    return;
  const unsigned col_blocks = static_cast<unsigned>((cols + 31) / 32);
  const i64 chunks = row_chunks(rows, cols);
  if (chunks == 1) {
    run("sum_cols", col_blocks, 1, 32, 32, x, y, rows, cols, scale, rows);
    return;
  }
  Tensor partial = Tensor::empty({chunks * cols}, DType::f32, *this);
  run("sum_cols", col_blocks, static_cast<unsigned>(chunks), 32, 32, x, ptr(partial), rows, cols,
      1.0f, (rows + chunks - 1) / chunks);
  run("sum_cols", col_blocks, 1, 32, 32, ptr<const float>(partial), y, chunks, cols, scale, chunks);
}

template <class... Args>
void CudaBackend::run_1d(const char* name, i64 n, Args... args) {
  // Grid-stride kernels: a bounded grid covers any n.
  i64 blocks = std::min<i64>((n + kBlock - 1) / kBlock, 65536);
  run(name, static_cast<unsigned>(blocks), 1, kBlock, 1, args...);
}

template <class... Args>
void CudaBackend::run_rows(const char* name, i64 rows, Args... args) {
  run(name, static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), 1, kBlock, 1,
      args...);
}

bool CudaBackend::supports(const OpCall& call) const {
  if (!device_ops::f32_except_ids(call))
    return false;
  switch (call.op) {
    case OpId::copy:
      return call.inputs[0].rank() <= kMaxCopyRank;
    case OpId::fill:
      return call.attrs.dtype == DType::f32;
    case OpId::add:
    case OpId::sub:
    case OpId::mul:
    case OpId::div:
      return device_ops::plan_binary(call.op, call.inputs[0].shape(), call.inputs[1].shape())
          .has_value();
    case OpId::sum:
      return classify_reduction(call.inputs[0], call.attrs.axes) != ReduceShape::unsupported;
    case OpId::max:
      return call.inputs[0].rank() >= 1 && normalize_axis(call.attrs.axis, call.inputs[0].rank(),
                                                          "max") == call.inputs[0].rank() - 1;
    case OpId::linear:
      return call.inputs[1].rank() == 2;
    case OpId::slice_backward:
    case OpId::sum_squares:
    case OpId::scale:
    case OpId::exp:
    case OpId::log:
    case OpId::tanh:
    case OpId::sqrt:
    case OpId::erf:
    case OpId::relu:
    case OpId::gelu:
    case OpId::relu_backward:
    case OpId::gelu_backward:
    case OpId::tanh_backward:
    case OpId::matmul:
    case OpId::layer_norm:
    case OpId::layer_norm_backward:
    case OpId::embedding:
    case OpId::embedding_backward:
    case OpId::cross_entropy:
    case OpId::cross_entropy_backward:
    case OpId::causal_attention:
    case OpId::causal_attention_backward:
    case OpId::adamw_step:
      return true;
    default:
      return false;
  }
}

Tensor CudaBackend::bf16_copy_of(const float* data, i64 count) {
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  const auto end = begin + static_cast<std::uintptr_t>(count) * sizeof(float);
  {
    std::lock_guard lock(bf16_copies_mutex_);
    for (const Bf16Copy& c : bf16_copies_)
      if (c.begin == begin && c.end == end)
        return c.copy;
  }
  Tensor copy = Tensor::empty({count}, DType::bf16, *this);
  run_1d("to_bf16", count, data, ptr<void>(copy), count);
  std::vector<Tensor> evicted;  // freed after the lock is released (release() locks it)
  {
    std::lock_guard lock(bf16_copies_mutex_);
    const std::size_t bytes = static_cast<std::size_t>(count) * 2;
    while (!bf16_copies_.empty() && bf16_copy_bytes_ + bytes > bf16_copy_budget_) {
      bf16_copy_bytes_ -= static_cast<std::size_t>(bf16_copies_.front().copy.numel()) * 2;
      evicted.push_back(std::move(bf16_copies_.front().copy));
      bf16_copies_.erase(bf16_copies_.begin());
    }
    if (bytes <= bf16_copy_budget_) {
      bf16_copies_.push_back({begin, end, copy});
      bf16_copy_bytes_ += bytes;
    }
  }
  return copy;
}

void CudaBackend::forget_copies_of(std::uintptr_t begin, std::uintptr_t end) noexcept {
  std::vector<Tensor> stale;  // freed after the lock is released (their release locks it)
  {
    std::lock_guard lock(bf16_copies_mutex_);
    for (std::size_t i = 0; i < bf16_copies_.size();) {
      Bf16Copy& c = bf16_copies_[i];
      if (c.begin < end && begin < c.end) {
        bf16_copy_bytes_ -= static_cast<std::size_t>(c.copy.numel()) * 2;
        stale.push_back(std::move(c.copy));
        bf16_copies_.erase(bf16_copies_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
}

void CudaBackend::gemm(bool ta, bool tb, i64 m, i64 n, i64 k, GemmOperand a, GemmOperand b, void* c,
                       i64 ldc, i64 c_stride, i64 batch, float beta, bool c_bf16) {
  if (m == 0 || n == 0 || batch == 0)
    return;
  const void* a_data = a.data;
  const void* b_data = b.data;
  cudaDataType operand_type = CUDA_R_32F;
  Tensor a16, b16;  // the operands' bf16 copies, alive until the GEMM is enqueued
  if (matmul_precision_ == DType::bf16) {
    operand_type = CUDA_R_16BF;
    if (a.bf16 == nullptr)
      a16 = bf16_copy_of(a.data, a.numel);
    if (b.bf16 == nullptr)
      b16 = bf16_copy_of(b.data, b.numel);
    a_data = a.bf16 != nullptr ? a.bf16 : ptr<void>(a16);
    b_data = b.bf16 != nullptr ? b.bf16 : ptr<void>(b16);
  } else {
    check(a.bf16 == nullptr && b.bf16 == nullptr && !c_bf16,
          "cuda: a bf16 GEMM operand or result under f32 products");
  }
  // cuBLAS is column-major: a row-major C = A B is the column-major C^T = B^T A^T.
  const float alpha = 1.0f;
  check_cublas(api_.cublasGemmStridedBatchedEx(
                   cublas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                   static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b_data,
                   operand_type, static_cast<int>(b.ld), b.batch_stride, a_data, operand_type,
                   static_cast<int>(a.ld), a.batch_stride, &beta, c,
                   c_bf16 ? CUDA_R_16BF : CUDA_R_32F, static_cast<int>(ldc), c_stride,
                   static_cast<int>(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx");
}

void CudaBackend::matmul(const OpCall& call) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  const Tensor& c = call.outputs[0];
  bool ta = call.attrs.trans_a, tb = call.attrs.trans_b;
  i64 m = c.dim(-2), n = c.dim(-1), k = ta ? a.dim(-2) : a.dim(-1);
  GemmOperand ga{ptr(a), numel(a), a.dim(-1), 0}, gb{ptr(b), numel(b), b.dim(-1), 0};
  if (k == 0) {  // an empty sum: C = 0
    run_1d("fill", numel(c), ptr(c), numel(c), 0.0f);
    return;
  }
  if (b.rank() == 2 && !ta) {  // fold the batch into M
    gemm(ta, tb, numel(c) / std::max<i64>(n, 1), n, k, ga, gb, ptr(c), n, 0, 1, 0.0f);
    return;
  }
  auto offsets = matmul_batch_offsets(a.shape(), b.shape(), c.shape());
  // One strided-batched call when each operand's matrices are evenly spaced (broadcast: 0).
  auto even = [&](auto member) {
    if (offsets.size() < 2)
      return true;
    i64 step = member(offsets[1]) - member(offsets[0]);
    for (std::size_t i = 1; i < offsets.size(); ++i)
      if (member(offsets[i]) - member(offsets[i - 1]) != step)
        return false;
    return true;
  };
  auto first = [](const auto& p) { return static_cast<i64>(p.first); };
  auto second = [](const auto& p) { return static_cast<i64>(p.second); };
  if (even(first) && even(second)) {
    ga.batch_stride = offsets.size() > 1 ? first(offsets[1]) - first(offsets[0]) : 0;
    gb.batch_stride = offsets.size() > 1 ? second(offsets[1]) - second(offsets[0]) : 0;
    gemm(ta, tb, m, n, k, ga, gb, ptr(c), n, m * n, static_cast<i64>(offsets.size()), 0.0f);
    return;
  }
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    GemmOperand ai{ga.data + first(offsets[i]), ga.numel - first(offsets[i]), ga.ld, 0};
    GemmOperand bi{gb.data + second(offsets[i]), gb.numel - second(offsets[i]), gb.ld, 0};
    gemm(ta, tb, m, n, k, ai, bi, ptr(c) + static_cast<i64>(i) * m * n, n, 0, 1, 0.0f);
  }
}

void CudaBackend::linear(const OpCall& call) {
  // y = x w (+ b): the bias is broadcast into y first and the GEMM accumulates onto it.
  const Tensor& x = call.inputs[0];
  const Tensor& w = call.inputs[1];
  const Tensor& bias = call.inputs[2];
  const Tensor& y = call.outputs[0];
  bool tb = call.attrs.trans_b;
  i64 n = y.dim(-1), k = x.dim(-1), rows = n == 0 ? 0 : numel(y) / n;
  if (bias.defined())
    run_1d("broadcast_rows", numel(y), ptr(bias), ptr(y), numel(y), n);
  if (k == 0) {
    if (!bias.defined())
      run_1d("fill", numel(y), ptr(y), numel(y), 0.0f);
    return;
  }
  gemm(false, tb, rows, n, k, {ptr(x), numel(x), k, 0}, {ptr(w), numel(w), w.dim(-1), 0}, ptr(y), n,
       0, 1, bias.defined() ? 1.0f : 0.0f);
}

namespace {
// Causal attention runs in chunks of query rows: chunk [q0, q1) needs keys [0, q1) only,
// so the score matrices hold about half of T x T (56% with 8 chunks) and so do the GEMMs.
i64 attention_chunk(i64 T) {
  const i64 chunk = std::max<i64>(64, (T + 7) / 8);
  return (chunk + 15) / 16 * 16;
}
}  // namespace

// A batched GEMM operand inside attention's buffers (f32, or bf16 under bf16 products),
// from element `offset` on: matrices of leading dimension ld, one every `stride` elements.
CudaBackend::GemmOperand CudaBackend::head_operand(const Tensor& t, i64 offset, i64 ld,
                                                   i64 stride) {
  const i64 count = numel(t) - offset;
  if (t.dtype() == DType::bf16)
    return {nullptr, count, ld, stride, ptr<std::uint16_t>(t) + offset};
  return {ptr(t) + offset, count, ld, stride};
}

// Per chunk and (batch, head): S = q k^T, then P = causal softmax(scale S) in place,
// out = P v (see kernels.cu). Scores and probabilities are f32 under f32 products and bf16
// under bf16 products (written by the GEMM, read as the next GEMM's operand, as
// PyTorch's eager attention does under autocast); the softmax itself computes in f32.
void CudaBackend::attention_forward(const OpCall& call) {
  const Tensor& qkv = call.inputs[0];
  i64 B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3, H = call.attrs.heads, D = C / H,
      BH = B * H;
  float scale = 1.0f / std::sqrt(static_cast<float>(D));
  i64 n = B * T * C;
  const bool bf16 = matmul_precision_ == DType::bf16;
  const DType operand_type = bf16 ? DType::bf16 : DType::f32;
  Tensor q = Tensor::empty({n}, operand_type, *this), k = Tensor::empty({n}, operand_type, *this),
         v = Tensor::empty({n}, operand_type, *this), o = Tensor::empty({n}, DType::f32, *this);
  for (auto [part, col] : {std::pair{&q, 0LL}, {&k, C}, {&v, 2 * C}})
    run_1d("heads_split", n, ptr(qkv), ptr<void>(*part), static_cast<int>(bf16), n, T, H, D, 3 * C,
           col);
  const i64 chunk = attention_chunk(T);
  for (i64 q0 = 0; q0 < T; q0 += chunk) {
    const i64 rows = std::min(chunk, T - q0), keys = q0 + rows, ns = BH * rows * keys;
    Tensor s = Tensor::empty({ns}, operand_type, *this);
    gemm(false, true, rows, keys, D, head_operand(q, q0 * D, D, T * D),
         head_operand(k, 0, D, T * D), ptr<void>(s), keys, rows * keys, BH, 0.0f, bf16);
    run_rows("causal_softmax", BH * rows, ptr<void>(s), static_cast<int>(bf16),
             ptr(call.outputs[1]), BH * rows, rows, keys, T, q0, scale);
    gemm(false, false, rows, D, keys, head_operand(s, 0, keys, rows * keys),
         head_operand(v, 0, D, T * D), ptr(o) + q0 * D, D, T * D, BH, 0.0f);
  }
  run_1d("heads_merge", n, ptr(o), ptr(call.outputs[0]), n, T, H, D, C, 0LL);
}

// Per chunk, with S recomputed and P from the saved lse: dP = dO v^T, then in place
// P and dS = scale P (dP - rowsum(dO * O)); dQ = dS k for the chunk's rows, and
// dV += P^T dO, dK += dS^T q over the keys it reaches.
void CudaBackend::attention_backward(const OpCall& call) {
  const Tensor& dout = call.inputs[0];
  const Tensor& qkv = call.inputs[1];
  const Tensor& out = call.inputs[2];
  const Tensor& lse = call.inputs[3];
  const Tensor& dqkv = call.outputs[0];
  i64 B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3, H = call.attrs.heads, D = C / H,
      BH = B * H;
  float scale = 1.0f / std::sqrt(static_cast<float>(D));
  i64 n = B * T * C;
  const bool bf16 = matmul_precision_ == DType::bf16;
  const DType operand_type = bf16 ? DType::bf16 : DType::f32;
  auto scratch = [&](i64 count) { return Tensor::empty({count}, DType::f32, *this); };
  auto operand_scratch = [&](i64 count) { return Tensor::empty({count}, operand_type, *this); };
  Tensor q = operand_scratch(n), k = operand_scratch(n), v = operand_scratch(n),
         d_o = operand_scratch(n);
  for (auto [part, col] : {std::pair{&q, 0LL}, {&k, C}, {&v, 2 * C}})
    run_1d("heads_split", n, ptr(qkv), ptr<void>(*part), static_cast<int>(bf16), n, T, H, D, 3 * C,
           col);
  run_1d("heads_split", n, ptr(dout), ptr<void>(d_o), static_cast<int>(bf16), n, T, H, D, C, 0LL);
  Tensor delta = scratch(BH * T), dq = scratch(n), dk = scratch(n), dv = scratch(n);
  run_1d("attention_delta", BH * T, ptr(dout), ptr(out), ptr(delta), BH * T, T, H, D);
  run_1d("fill", n, ptr(dk), n, 0.0f);  // dK and dV accumulate over the chunks
  run_1d("fill", n, ptr(dv), n, 0.0f);
  const i64 chunk = attention_chunk(T);
  for (i64 q0 = 0; q0 < T; q0 += chunk) {
    const i64 rows = std::min(chunk, T - q0), keys = q0 + rows, ns = BH * rows * keys;
    GemmOperand q_rows = head_operand(q, q0 * D, D, T * D);
    GemmOperand do_rows = head_operand(d_o, q0 * D, D, T * D);
    GemmOperand k_all = head_operand(k, 0, D, T * D), v_all = head_operand(v, 0, D, T * D);
    Tensor s = operand_scratch(ns), dp = operand_scratch(ns);
    gemm(false, true, rows, keys, D, q_rows, k_all, ptr<void>(s), keys, rows * keys, BH, 0.0f,
         bf16);
    gemm(false, true, rows, keys, D, do_rows, v_all, ptr<void>(dp), keys, rows * keys, BH, 0.0f,
         bf16);
    run_1d("attention_backward_scores", ns, ptr<void>(s), ptr<void>(dp), static_cast<int>(bf16),
           ptr(lse), ptr<const float>(delta), ns, rows, keys, T, q0, scale);
    GemmOperand p = head_operand(s, 0, keys, rows * keys);
    GemmOperand ds = head_operand(dp, 0, keys, rows * keys);
    gemm(true, false, keys, D, rows, p, do_rows, ptr(dv), D, T * D, BH, 1.0f);
    gemm(false, false, rows, D, keys, ds, k_all, ptr(dq) + q0 * D, D, T * D, BH, 0.0f);
    gemm(true, false, keys, D, rows, ds, q_rows, ptr(dk), D, T * D, BH, 1.0f);
  }
  for (auto [part, col] : {std::pair{&dq, 0LL}, {&dk, C}, {&dv, 2 * C}})
    run_1d("heads_merge", n, ptr(*part), ptr(dqkv), n, T, H, D, 3 * C, col);
}

void CudaBackend::embedding_backward(const OpCall& call) {
  const Tensor& dy = call.inputs[0];
  const Tensor& dw = call.outputs[0];
  i64 vocab = dw.dim(0), c = dw.dim(1);
  std::vector<std::int32_t> ids =
      device_ops::checked_ids(call.inputs[1], vocab, "embedding_backward");
  check_cu(api_.cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(ptr(dw)), 0,
                                 static_cast<std::size_t>(numel(dw)), stream_),
           "cuMemsetD32Async");
  if (ids.empty() || c == 0)
    return;
  // Counting sort of the token positions by id, keeping token order inside each id.
  std::vector<std::int32_t> count(static_cast<std::size_t>(vocab) + 1, 0);
  for (std::int32_t id : ids)
    ++count[static_cast<std::size_t>(id) + 1];
  for (std::size_t v = 1; v < count.size(); ++v)
    count[v] += count[v - 1];
  std::vector<std::int32_t> order(ids.size()), seg_start, seg_id;
  std::vector<std::int32_t> next(count.begin(), count.end() - 1);
  for (std::size_t t = 0; t < ids.size(); ++t)
    order[static_cast<std::size_t>(next[ids[t]]++)] = static_cast<std::int32_t>(t);
  for (i64 v = 0; v < vocab; ++v)
    if (count[v + 1] > count[v]) {
      seg_start.push_back(count[v]);
      seg_id.push_back(static_cast<std::int32_t>(v));
    }
  seg_start.push_back(static_cast<std::int32_t>(ids.size()));
  i64 segments = static_cast<i64>(seg_id.size());
  Tensor d_order = Tensor::from_ints({static_cast<std::int64_t>(order.size())}, order, *this);
  Tensor d_start =
      Tensor::from_ints({static_cast<std::int64_t>(seg_start.size())}, seg_start, *this);
  Tensor d_id = Tensor::from_ints({segments}, seg_id, *this);
  run("embedding_backward", static_cast<unsigned>(segments),
      static_cast<unsigned>((c + kBlock - 1) / kBlock), kBlock, 1, ptr(dy), ptr<const int>(d_order),
      ptr<const int>(d_start), ptr<const int>(d_id), ptr(dw), c);
}

void CudaBackend::launch(const OpCall& call, Stream&) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  for (const Tensor& t : out) {  // bf16 copies of the bytes this call writes go stale
    if (!t.defined())
      continue;
    const auto storage = reinterpret_cast<std::uintptr_t>(t.storage()->data());
    if (t.is_contiguous()) {
      const auto begin = reinterpret_cast<std::uintptr_t>(ptr<void>(t));
      forget_copies_of(begin, begin + t.numel() * dtype_size(t.dtype()));
    } else {
      forget_copies_of(storage, storage + t.storage()->bytes());
    }
  }
  switch (call.op) {
    case OpId::fill:
      run_1d("fill", numel(out[0]), ptr(out[0]), numel(out[0]),
             static_cast<float>(call.attrs.alpha));
      return;
    case OpId::add:
    case OpId::sub:
    case OpId::mul:
    case OpId::div: {
      device_ops::BinaryPlan plan = *device_ops::plan_binary(call.op, in[0].shape(), in[1].shape());
      const Tensor& full = plan.other_left ? in[1] : in[0];
      const Tensor& other = plan.other_left ? in[0] : in[1];
      run_1d("binary", numel(out[0]), plan.op, ptr(full), ptr(other), ptr(out[0]), numel(out[0]),
             plan.mode, static_cast<i64>(plan.period), static_cast<int>(plan.other_left));
      return;
    }
    case OpId::exp:
    case OpId::log:
    case OpId::tanh:
    case OpId::sqrt:
    case OpId::erf:
    case OpId::relu:
    case OpId::gelu:
    case OpId::scale: {
      int op = device_ops::unary_code(call.op);
      run_1d("unary", numel(out[0]), op, ptr(in[0]), ptr(out[0]), numel(out[0]),
             static_cast<float>(call.attrs.alpha));
      return;
    }
    case OpId::relu_backward:
    case OpId::gelu_backward:
    case OpId::tanh_backward: {
      int op = device_ops::unary_backward_code(call.op);
      run_1d("unary_backward", numel(out[0]), op, ptr(in[0]), ptr(in[1]), ptr(out[0]),
             numel(out[0]));
      return;
    }
    case OpId::sum:
    case OpId::max: {
      const Tensor& x = in[0];
      std::vector<std::int64_t> axes =
          call.op == OpId::max ? std::vector<std::int64_t>{call.attrs.axis} : call.attrs.axes;
      i64 cols = std::max<i64>(numel(out[0]), 1), rows = numel(x) / cols;  // the cols layout
      if (classify_reduction(x, axes) == ReduceShape::rows) {
        rows = numel(out[0]);
        cols = rows == 0 ? 0 : numel(x) / rows;
        run_rows("reduce_rows", rows, static_cast<int>(call.op == OpId::max), ptr(x), ptr(out[0]),
                 rows, cols, 1.0f);
      } else {
        sum_columns(ptr(x), ptr(out[0]), rows, cols, 1.0f);
      }
      return;
    }
    case OpId::matmul:
      matmul(call);
      return;
    case OpId::linear:
      linear(call);
      return;
    case OpId::copy: {
      const Tensor& x = in[0];
      StridedView view{x.rank(), {}, {}};
      for (int d = 0; d < x.rank(); ++d) {
        view.shape[d] = x.shape()[d];
        view.stride[d] = x.strides()[d];
      }
      run_1d("copy_strided", numel(out[0]), ptr(x), ptr(out[0]), numel(out[0]), view);
      return;
    }
    case OpId::slice_backward: {
      const Tensor& dx = out[0];
      int axis = normalize_axis(call.attrs.axis, dx.rank(), "slice_backward");
      i64 inner = 1;
      for (int d = axis + 1; d < dx.rank(); ++d)
        inner *= dx.shape()[d];
      run_1d("slice_backward", numel(dx), ptr(in[0]), ptr(dx), numel(dx),
             static_cast<i64>(dx.shape()[axis]), static_cast<i64>(in[0].shape()[axis]), inner,
             static_cast<i64>(call.attrs.start));
      return;
    }
    case OpId::sum_squares: {
      i64 total = numel(in[0]), blocks = std::clamp<i64>((total + kBlock - 1) / kBlock, 1, 1024);
      Tensor partial = Tensor::empty({blocks}, DType::f32, *this);
      run("sum_squares_partial", static_cast<unsigned>(blocks), 1, kBlock, 1, ptr(in[0]), total,
          ptr(partial));
      run_rows("reduce_rows", 1, 0, ptr(partial), ptr(out[0]), i64{1}, blocks, 1.0f);
      return;
    }
    case OpId::embedding: {
      device_ops::checked_ids(in[1], in[0].dim(0), "embedding");
      run_1d("embedding", numel(out[0]), ptr(in[0]), ptr<const int>(in[1]), ptr(out[0]),
             numel(out[0]), static_cast<i64>(in[0].dim(1)));
      return;
    }
    case OpId::embedding_backward:
      embedding_backward(call);
      return;
    case OpId::cross_entropy: {
      const Tensor& logits = in[0];
      i64 rows = logits.dim(0), v = logits.dim(1);
      device_ops::checked_ids(in[1], v, "cross_entropy");
      if (rows == 0) {
        run_1d("fill", 1, ptr(out[0]), i64{1}, 0.0f);
        return;
      }
      Tensor row_loss = Tensor::empty({rows}, DType::f32, *this);
      run("cross_entropy_rows", static_cast<unsigned>(rows), 1, kBlock, 1, ptr(logits),
          ptr<const int>(in[1]), ptr(out[1]), ptr(row_loss), v);
      run_rows("reduce_rows", 1, 0, ptr(row_loss), ptr(out[0]), i64{1}, rows,
               1.0f / static_cast<float>(rows));
      return;
    }
    case OpId::cross_entropy_backward: {
      const Tensor& logits = in[1];
      device_ops::checked_ids(in[2], logits.dim(1), "cross_entropy_backward");
      float inv = 1.0f / static_cast<float>(std::max<std::int64_t>(logits.dim(0), 1));
      run_1d("cross_entropy_backward", numel(out[0]), ptr(in[0]), ptr(logits),
             ptr<const int>(in[2]), ptr(in[3]), ptr(out[0]), numel(out[0]),
             static_cast<i64>(logits.dim(1)), inv);
      return;
    }
    case OpId::layer_norm: {
      const Tensor& x = in[0];
      i64 c = x.dim(-1), rows = c == 0 ? 0 : numel(x) / c;
      run_rows("layer_norm_forward", rows, ptr(x), ptr(in[1]), ptr(in[2]), ptr(out[0]), ptr(out[1]),
               ptr(out[2]), rows, c, static_cast<float>(call.attrs.eps));
      return;
    }
    case OpId::layer_norm_backward: {
      const Tensor& x = in[1];
      i64 c = x.dim(-1), rows = c == 0 ? 0 : numel(x) / c;
      run_rows("layer_norm_backward_rows", rows, ptr(in[0]), ptr(x), ptr(in[2]), ptr(in[3]),
               ptr(in[4]), ptr(out[0]), rows, c);
      const unsigned col_blocks = static_cast<unsigned>((c + 31) / 32);
      const i64 chunks = row_chunks(rows, c);
      if (chunks == 1) {
        run("layer_norm_backward_cols", col_blocks, 1, 32, 32, ptr(in[0]), ptr(x), ptr(in[3]),
            ptr(in[4]), ptr(out[1]), ptr(out[2]), rows, c, rows);
        return;
      }
      Tensor dw = Tensor::empty({chunks * c}, DType::f32, *this),
             db = Tensor::empty({chunks * c}, DType::f32, *this);
      run("layer_norm_backward_cols", col_blocks, static_cast<unsigned>(chunks), 32, 32, ptr(in[0]),
          ptr(x), ptr(in[3]), ptr(in[4]), ptr(dw), ptr(db), rows, c, (rows + chunks - 1) / chunks);
      sum_columns(ptr(dw), ptr(out[1]), chunks, c, 1.0f);
      sum_columns(ptr(db), ptr(out[2]), chunks, c, 1.0f);
      return;
    }
    case OpId::causal_attention:
      attention_forward(call);
      return;
    case OpId::causal_attention_backward:
      attention_backward(call);
      return;
    case OpId::adamw_step: {
      const Attrs& a = call.attrs;
      auto [step_size, inv_sqrt_bc2, decay] = device_ops::adamw_scalars(a);
      run_1d("adamw", numel(out[0]), ptr(in[0]), ptr(in[1]), ptr(in[2]), ptr(in[3]), ptr(out[0]),
             ptr(out[1]), ptr(out[2]), numel(out[0]), static_cast<float>(a.beta1),
             static_cast<float>(a.beta2), step_size, inv_sqrt_bc2, decay,
             static_cast<float>(a.eps));
      return;
    }
    default:
      throw Error("cuda: launch of unsupported op " + std::string(op_name(call.op)));
  }
}

namespace {
// Opened on first use; destroyed at exit after the stream drains.
struct Instance {
  std::string why;
  std::unique_ptr<CudaBackend> backend = CudaBackend::open(&why);
};
Instance& instance() {
  static Instance value;
  if (value.backend == nullptr && value.why.empty())
    value.why = "no usable CUDA device";
  return value;
}
}  // namespace

CudaBackend* backend() {
  return instance().backend.get();
}
std::string unavailable_reason() {
  return instance().backend ? std::string() : instance().why;
}

}  // namespace loom::cuda
