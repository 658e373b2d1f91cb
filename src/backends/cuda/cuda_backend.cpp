#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>

#include "backends/cuda/cuda_backend_internal.h"
#include "backends/cuda/kernel_args.h"
#include "backends/cuda/kernels_fatbin.h"  // generated: loom_cuda_fatbin[], from kernels.cu
#include "backends/device_kernel_rows.h"
#include "backends/device_ops.h"
#include "backends/kernel_table.h"
#include "core/broadcast.h"
#include "core/error.h"
#include "core/fused_elementwise.h"

namespace loom::cuda {

using namespace detail;

namespace {

// A CUDA event recorded on one stream: a Timeline marker, and what another stream of the
// device waits on (cuStreamWaitEvent) without the host.
class CudaMarker final : public TimelineMarker {
 public:
  CudaMarker(const Api& api, CUstream stream, const CudaBackend* owner) : api_(api), owner_(owner) {
    check_cu(api_.cuEventCreate(&event_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    check_cu(api_.cuEventRecord(event_, stream), "cuEventRecord");
  }
  ~CudaMarker() override { api_.cuEventDestroy(event_); }
  CudaMarker(const CudaMarker&) = delete;
  CudaMarker& operator=(const CudaMarker&) = delete;
  bool reached() override {
    CUresult status = api_.cuEventQuery(event_);
    if (status == CUDA_ERROR_NOT_READY)
      return false;
    check_cu(status, "cuEventQuery");
    return true;
  }
  void wait() override { check_cu(api_.cuEventSynchronize(event_), "cuEventSynchronize"); }
  CUevent event() const { return event_; }
  const CudaBackend* owner() const { return owner_; }

 private:
  const Api& api_;
  const CudaBackend* owner_;
  CUevent event_ = nullptr;
};

// One CUDA stream. The backend's own (not owned) is the default stream; a created one is
// a stream of its own whose work starts after the default stream's work submitted before
// it: memory comes from the stream-ordered pool on the default stream, and another stream
// may touch an allocation only once it is ordered after it. A call launched on a created
// stream keeps its tensors until the stream has run it, because their memory returns to
// the pool in the default stream's order.
class CudaStream final : public device_ops::DeviceStream {
 public:
  CudaStream(CudaBackend& backend, CUstream stream, bool owned)
      : DeviceStream(backend), backend_(backend), stream_(stream), owned_(owned) {
    if (owned_)
      check_cu(api().cuEventCreate(&after_default_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  }
  ~CudaStream() override {
    if (!owned_)
      return;
    api().cuStreamSynchronize(stream_);
    in_flight_.clear();
    api().cuEventDestroy(after_default_);
    api().cuStreamDestroy(stream_);
  }
  CUstream handle() const { return stream_; }
  bool is_default() const { return !owned_; }
  void synchronize() override {
    check_cu(api().cuStreamSynchronize(stream_), "cuStreamSynchronize");
    in_flight_.clear();
  }
  void signal(Timeline& timeline, std::uint64_t value) override {
    timeline.signal_at(value, std::make_shared<CudaMarker>(api(), stream_, &backend_));
  }
  void wait(Timeline& timeline, std::uint64_t value) override {
    std::shared_ptr<TimelineMarker> marker = timeline.marker_for(value);
    auto* ours = dynamic_cast<CudaMarker*>(marker.get());
    if (ours != nullptr && ours->owner() == &backend_)
      check_cu(api().cuStreamWaitEvent(stream_, ours->event(), 0), "cuStreamWaitEvent");
    else
      timeline.wait(value);  // reached, signalled from the host, or another device's marker
  }
  // Before work on a created stream: it starts after the default stream's work so far.
  void order_after_default() {
    if (!owned_)
      return;
    check_cu(api().cuEventRecord(after_default_, backend_.stream()), "cuEventRecord");
    check_cu(api().cuStreamWaitEvent(stream_, after_default_, 0), "cuStreamWaitEvent");
  }
  // After a launch on a created stream: its tensors stay alive until the stream has run it.
  void keep_until_run(const OpCall& call) {
    if (!owned_)
      return;
    while (!in_flight_.empty() && in_flight_.front().marker->reached())
      in_flight_.pop_front();
    InFlight entry{std::make_unique<CudaMarker>(api(), stream_, &backend_), {}};
    entry.tensors.insert(entry.tensors.end(), call.inputs.begin(), call.inputs.end());
    entry.tensors.insert(entry.tensors.end(), call.outputs.begin(), call.outputs.end());
    in_flight_.push_back(std::move(entry));
  }

 protected:
  void device_copy(const Buffer& src, std::size_t src_offset, Buffer& dst, std::size_t dst_offset,
                   std::size_t bytes) override {
    backend_.forget_copies_of(address(dst, dst_offset), address(dst, dst_offset) + bytes);
    order_after_default();
    check_cu(
        api().cuMemcpyDtoDAsync(address(dst, dst_offset), address(src, src_offset), bytes, stream_),
        "cuMemcpyDtoDAsync");
  }
  // From pageable memory: staged before the call returns, so the host memory is free at
  // once, while the transfer runs in this stream's order.
  void host_to_device(const void* host, Buffer& dst, std::size_t dst_offset,
                      std::size_t bytes) override {
    if (bytes == 0)
      return;
    backend_.forget_copies_of(address(dst, dst_offset), address(dst, dst_offset) + bytes);
    order_after_default();
    check_cu(api().cuMemcpyHtoDAsync(address(dst, dst_offset), host, bytes, stream_),
             "cuMemcpyHtoDAsync");
  }
  // To pageable memory: returns once the copy is done, after this stream's earlier work.
  void device_to_host(const Buffer& src, std::size_t src_offset, void* host,
                      std::size_t bytes) override {
    if (bytes == 0)
      return;
    order_after_default();
    check_cu(api().cuMemcpyDtoHAsync(host, address(src, src_offset), bytes, stream_),
             "cuMemcpyDtoHAsync");
  }

 private:
  const Api& api() const { return backend_.api(); }
  struct InFlight {
    std::unique_ptr<CudaMarker> marker;
    std::vector<Tensor> tensors;
  };
  CudaBackend& backend_;
  CUstream stream_;
  bool owned_;
  CUevent after_default_ = nullptr;
  std::deque<InFlight> in_flight_;
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
  if (api_.has_cublaslt())
    check_cublas(api_.cublasLtCreate(&cublas_lt_), "cublasLtCreate");
  stream_wrapper_ = std::make_unique<CudaStream>(*this, stream_, false);
  id_fault_ = Tensor::empty({4}, DType::i32, *this);
  check_cu(api_.cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(ptr<int>(id_fault_)), 0, 4, stream_),
           "cuMemsetD32Async (id check)");
  std::size_t memory = 0;
  api_.cuDeviceTotalMem(&memory, device_);
  bf16_copy_budget_ = memory / 8;
}

CudaBackend::~CudaBackend() {
  std::vector<Bf16Copy> copies;  // freed while the stream still exists
  {
    std::lock_guard lock(bf16_copies_mutex_);
    copies.swap(bf16_copies_);
    bf16_copy_count_.store(0);
  }
  copies.clear();
  id_fault_ = Tensor();
  if (stream_ != nullptr)
    api_.cuStreamSynchronize(stream_);
  stream_wrapper_.reset();
  if (cublas_lt_ != nullptr)
    api_.cublasLtDestroy(cublas_lt_);
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
           std::to_string(driver % 1000 / 10) +
           (cublas_lt_ != nullptr ? ", cuBLASLt epilogues" : ", no cuBLASLt") + ")";
  std::size_t bytes = 0;
  api_.cuDeviceTotalMem(&bytes, device_);
  i.memory_bytes = bytes;
  i.host_accessible = false;
  return i;
}

Buffer CudaBackend::allocate(std::size_t bytes) {
  CUdeviceptr p = 0;
  // On the stream of the launch in progress (a launcher's temporaries), else the default.
  check_cu(api_.cuMemAllocAsync(&p, std::max<std::size_t>(bytes, 4), current_stream()),
           ("cuMemAllocAsync of " + std::to_string(bytes) + " bytes").c_str());
  return Buffer(reinterpret_cast<void*>(p), bytes, this);
}

void CudaBackend::release(void* data, std::size_t bytes) noexcept {
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  forget_copies_of(begin, begin + bytes);
  api_.cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(data), current_stream());
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
  report_id_fault();
}

int* CudaBackend::id_fault() {
  id_fault_possible_.store(true, std::memory_order_relaxed);
  return ptr<int>(id_fault_);
}

void CudaBackend::report_id_fault() {
  if (!id_fault_possible_.exchange(false, std::memory_order_relaxed))
    return;
  std::int32_t fault[4] = {0, 0, 0, 0};
  const CUdeviceptr record = reinterpret_cast<CUdeviceptr>(ptr<int>(id_fault_));
  check_cu(api_.cuMemcpyDtoH(fault, record, sizeof fault), "cuMemcpyDtoH (id check)");
  if (fault[0] == 0)
    return;
  check_cu(api_.cuMemsetD32Async(record, 0, 4, stream_), "cuMemsetD32Async (id check)");
  throw device_ops::id_fault_error(fault);
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

// Ids checked and grouped on the device (kernels.cu: count, scan, place, sum), so the
// host never waits for the stream here. embedding_backward_add (base, dy, ids) adds base
// to each sum as it writes it: the two ops' bits, without the zeroed table and the add.
void CudaBackend::embedding_backward(const OpCall& call) {
  const bool onto_base = call.op == OpId::embedding_backward_add;
  const Tensor &dy = call.inputs[onto_base ? 1 : 0], &ids = call.inputs[onto_base ? 2 : 1];
  const float* base = onto_base ? ptr<const float>(call.inputs[0]) : nullptr;
  const char* op = onto_base ? "embedding_backward_add" : "embedding_backward";
  const Tensor& dw = call.outputs[0];
  const i64 vocab = dw.dim(0), c = dw.dim(1), n = numel(ids);
  if (vocab == 0 || c == 0)
    return;
  check(n < std::numeric_limits<std::int32_t>::max() &&
            vocab < std::numeric_limits<std::int32_t>::max(),
        [&] {
          return std::string(op) + ": " + std::to_string(n) + " tokens over a vocabulary of " +
                 std::to_string(vocab) + ": the CUDA kernel counts in 32 bits";
        });
  Tensor start = Tensor::empty({vocab + 1}, DType::i32, *this);
  Tensor order = Tensor::empty({std::max<i64>(n, 1)}, DType::i32, *this);
  check_cu(api_.cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(ptr<int>(start)), 0,
                                 static_cast<std::size_t>(vocab + 1), current_stream()),
           "cuMemsetD32Async");
  if (n > 0) {
    const int code =
        onto_base ? device_ops::kIdEmbeddingBackwardAdd : device_ops::kIdEmbeddingBackward;
    run_1d("embedding_count", n, ptr<const int>(ids), ptr<int>(start), n, vocab, id_fault(), code);
    run("scan_counts", 1, 1, kBlock, 1, ptr<int>(start), vocab + 1);
    run_1d("embedding_place", n, ptr<const int>(ids), ptr<const int>(start), ptr<int>(order), n,
           vocab);
  }
  run("embedding_backward", static_cast<unsigned>(vocab),
      static_cast<unsigned>((c + kBlock - 1) / kBlock), kBlock, 1, ptr(dy), ptr<const int>(order),
      ptr<const int>(start), base, ptr(dw), c);
}

void CudaBackend::fill(const OpCall& call) {
  Tensor& y = call.outputs[0];
  run_1d("fill", numel(y), ptr(y), numel(y), static_cast<float>(call.attrs.alpha));
}

void CudaBackend::binary(const OpCall& call) {
  const auto& in = call.inputs;
  Tensor& y = call.outputs[0];
  device_ops::BinaryPlan plan = *device_ops::plan_binary(call.op, in[0].shape(), in[1].shape());
  const Tensor& full = plan.other_left ? in[1] : in[0];
  const Tensor& other = plan.other_left ? in[0] : in[1];
  run_1d("binary", numel(y), plan.op, ptr(full), ptr(other), ptr(y), numel(y), plan.mode,
         static_cast<i64>(plan.period), static_cast<int>(plan.other_left));
}

template <device_ops::UnaryKernel Code>
void CudaBackend::unary(const OpCall& call) {
  Tensor& y = call.outputs[0];
  run_1d("unary", numel(y), static_cast<int>(Code), ptr(call.inputs[0]), ptr(y), numel(y),
         static_cast<float>(call.attrs.alpha));
}

void CudaBackend::math(const OpCall& call) {
  Tensor& y = call.outputs[0];
  run_1d("unary", numel(y), device_ops::math_unary_code(call.attrs.function), ptr(call.inputs[0]),
         ptr(y), numel(y), static_cast<float>(call.attrs.alpha));
}

template <device_ops::UnaryBackwardKernel Code>
void CudaBackend::unary_backward(const OpCall& call) {
  Tensor& dx = call.outputs[0];
  run_1d("unary_backward", numel(dx), static_cast<int>(Code), ptr(call.inputs[0]),
         ptr(call.inputs[1]), ptr(dx), numel(dx));
}

// sum over the axes of a row or column layout; max over the last axis (a row layout).
void CudaBackend::reduce(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  std::vector<std::int64_t> axes =
      call.op == OpId::max ? std::vector<std::int64_t>{call.attrs.axis} : call.attrs.axes;
  i64 cols = std::max<i64>(numel(y), 1), rows = numel(x) / cols;  // the cols layout
  if (classify_reduction(x, axes) == ReduceShape::rows) {
    rows = numel(y);
    cols = rows == 0 ? 0 : numel(x) / rows;
    run_rows("reduce_rows", rows, static_cast<int>(call.op == OpId::max), ptr(x), ptr(y), rows,
             cols, 1.0f);
    return;
  }
  sum_columns(ptr(x), ptr(y), rows, cols, 1.0f);
}

void CudaBackend::copy(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  StridedView view{x.rank(), {}, {}};
  for (int d = 0; d < x.rank(); ++d) {
    view.shape[d] = x.shape()[d];
    view.stride[d] = x.strides()[d];
  }
  run_1d("copy_strided", numel(y), ptr(x), ptr(y), numel(y), view);
}

namespace {

FusedOp fused_op(OpId op) {
  switch (op) {
    case OpId::add:
      return fused_add;
    case OpId::sub:
      return fused_sub;
    case OpId::mul:
      return fused_mul;
    case OpId::div:
      return fused_div;
    case OpId::scale:
      return fused_scale;
    case OpId::exp:
      return fused_exp;
    case OpId::log:
      return fused_log;
    case OpId::tanh:
      return fused_tanh;
    case OpId::sqrt:
      return fused_sqrt;
    case OpId::erf:
      return fused_erf;
    case OpId::relu:
      return fused_relu;
    case OpId::gelu:
      return fused_gelu;
    case OpId::relu_backward:
      return fused_relu_backward;
    case OpId::gelu_backward:
      return fused_gelu_backward;
    case OpId::tanh_backward:
      return fused_tanh_backward;
    case OpId::sum:
      return fused_sum;
    case OpId::mean:
      return fused_mean;
    default:
      return fused_identity;  // expand: the input, already broadcast
  }
}

// A chain the interpreter kernel holds: at most kFusedMaxInputs inputs, kFusedMaxSteps
// steps and kFusedRank dimensions once merged (asked without tensors, as the graph's
// fusion pass does, it accepts; a larger chain then runs decomposed).
bool fused_fits(const OpCall& call) {
  if (call.inputs.empty())
    return true;
  static_assert(kFusedMaxOutputs == kMaxFusedOutputs);
  return call.attrs.program != nullptr && call.inputs.size() <= kFusedMaxInputs &&
         call.attrs.program->steps.size() <= static_cast<std::size_t>(kFusedMaxSteps) &&
         collapse_broadcast(call.attrs.shape, call.inputs).dims.size() <=
             static_cast<std::size_t>(kFusedRank);
}

}  // namespace

void CudaBackend::fused(const OpCall& call) {
  const ElementwiseProgram& program = *call.attrs.program;
  const BroadcastSpace space = collapse_broadcast(call.attrs.shape, call.inputs);
  FusedProgram p{};
  p.inputs = program.num_inputs;
  p.steps = static_cast<int>(program.steps.size());
  const std::size_t pad = kFusedRank - space.dims.size();
  for (int d = 0; d < kFusedRank; ++d)
    p.dims[d] = 1;
  for (std::size_t d = 0; d < space.dims.size(); ++d)
    p.dims[pad + d] = space.dims[d];
  for (std::size_t k = 0; k < call.inputs.size(); ++k) {
    p.x[k] = ptr<const float>(call.inputs[k]);
    for (std::size_t d = 0; d < space.dims.size(); ++d)
      p.strides[k][pad + d] = space.strides[k][d];
    const InputAccess access = input_access(space, k);
    p.access[k] = access == InputAccess::same ? 0 : access == InputAccess::scalar ? 1 : 2;
  }
  for (std::size_t s = 0; s < program.steps.size(); ++s) {
    const ElementwiseStep& step = program.steps[s];
    p.step[s] = {fused_op(step.op), step.args[0], step.args[1], static_cast<float>(step.alpha)};
  }
  const std::vector<int> written = program.output_registers();
  p.outputs = static_cast<int>(written.size());
  for (std::size_t k = 0; k < written.size(); ++k) {
    p.y[k] = ptr(call.outputs[k]);
    p.y_reg[k] = written[k];
  }
  const i64 n = shape_numel(call.attrs.shape);
  if (!program.reduces()) {
    run_1d("fused_elementwise", n, n, p);
    return;
  }
  std::vector<Shape> shapes;
  for (const Tensor& x : call.inputs)
    shapes.push_back(x.shape());
  const std::vector<bool> row = row_registers(program, shapes, call.attrs.shape);
  for (std::size_t k = 0; k < row.size(); ++k)
    p.row[k] = row[k] ? 1 : 0;
  const i64 cols = call.attrs.shape.back(), rows = cols == 0 ? 0 : n / cols;
  run_rows("fused_rows", rows, rows, cols, static_cast<float>(1.0 / static_cast<double>(cols)), p);
}

void CudaBackend::slice_backward(const OpCall& call) {
  const Tensor& dy = call.inputs[0];
  Tensor& dx = call.outputs[0];
  int axis = normalize_axis(call.attrs.axis, dx.rank(), "slice_backward");
  i64 inner = 1;
  for (int d = axis + 1; d < dx.rank(); ++d)
    inner *= dx.shape()[d];
  run_1d("slice_backward", numel(dx), ptr(dy), ptr(dx), numel(dx),
         static_cast<i64>(dx.shape()[axis]), static_cast<i64>(dy.shape()[axis]), inner,
         static_cast<i64>(call.attrs.start));
}

void CudaBackend::sum_squares(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  i64 total = numel(x), blocks = std::clamp<i64>((total + kBlock - 1) / kBlock, 1, 1024);
  Tensor partial = Tensor::empty({blocks}, DType::f32, *this);
  run("sum_squares_partial", static_cast<unsigned>(blocks), 1, kBlock, 1, ptr(x), total,
      ptr(partial));
  run_rows("reduce_rows", 1, 0, ptr(partial), ptr(call.outputs[0]), i64{1}, blocks, 1.0f);
}

void CudaBackend::embedding(const OpCall& call) {
  const Tensor &table = call.inputs[0], &ids = call.inputs[1];
  Tensor& y = call.outputs[0];
  run_1d("embedding", numel(y), ptr(table), ptr<const int>(ids), ptr(y), numel(y),
         static_cast<i64>(table.dim(1)), static_cast<i64>(table.dim(0)), id_fault());
}

void CudaBackend::cross_entropy(const OpCall& call) {
  const Tensor &logits = call.inputs[0], &targets = call.inputs[1];
  auto& out = call.outputs;
  i64 rows = logits.dim(0), v = logits.dim(1);
  if (rows == 0) {
    run_1d("fill", 1, ptr(out[0]), i64{1}, 0.0f);
    return;
  }
  Tensor row_loss = Tensor::empty({rows}, DType::f32, *this);
  run("cross_entropy_rows", static_cast<unsigned>(rows), 1, kBlock, 1, ptr(logits),
      ptr<const int>(targets), ptr(out[1]), ptr(row_loss), v, id_fault());
  run_rows("reduce_rows", 1, 0, ptr(row_loss), ptr(out[0]), i64{1}, rows,
           1.0f / static_cast<float>(rows));
}

void CudaBackend::cross_entropy_backward(const OpCall& call) {
  const auto& in = call.inputs;
  Tensor& dx = call.outputs[0];
  const Tensor& logits = in[1];
  float inv = 1.0f / static_cast<float>(std::max<std::int64_t>(logits.dim(0), 1));
  run_1d("cross_entropy_backward", numel(dx), ptr(in[0]), ptr(logits), ptr<const int>(in[2]),
         ptr(in[3]), ptr(dx), numel(dx), static_cast<i64>(logits.dim(1)), inv, id_fault());
}

void CudaBackend::layer_norm(const OpCall& call) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  const Tensor& x = in[0];
  i64 c = x.dim(-1), rows = c == 0 ? 0 : numel(x) / c;
  run_rows("layer_norm_forward", rows, ptr(x), ptr(in[1]), ptr(in[2]), ptr(out[0]), ptr(out[1]),
           ptr(out[2]), rows, c, static_cast<float>(call.attrs.eps));
}

void CudaBackend::layer_norm_backward(const OpCall& call) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  const Tensor& x = in[1];
  i64 c = x.dim(-1), rows = c == 0 ? 0 : numel(x) / c;
  run_rows("layer_norm_backward_rows", rows, ptr(in[0]), ptr(x), ptr(in[2]), ptr(in[3]), ptr(in[4]),
           ptr(out[0]), rows, c);
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
}

void CudaBackend::rms_norm(const OpCall& call) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  i64 c = in[0].dim(-1), rows = c == 0 ? 0 : numel(in[0]) / c;
  run_rows("rms_norm_forward", rows, ptr(in[0]), ptr(in[1]), ptr(out[0]), ptr(out[1]), rows, c,
           static_cast<float>(call.attrs.eps));
}

void CudaBackend::rms_norm_backward(const OpCall& call) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  const Tensor& x = in[1];
  i64 c = x.dim(-1), rows = c == 0 ? 0 : numel(x) / c;
  run_rows("rms_norm_backward_rows", rows, ptr(in[0]), ptr(x), ptr(in[2]), ptr(in[3]), ptr(out[0]),
           rows, c);
  const unsigned col_blocks = static_cast<unsigned>((c + 31) / 32);
  const i64 chunks = row_chunks(rows, c);
  if (chunks == 1) {
    run("rms_norm_backward_cols", col_blocks, 1, 32, 32, ptr(in[0]), ptr(x), ptr(in[3]),
        ptr(out[1]), rows, c, rows);
    return;
  }
  Tensor dw = Tensor::empty({chunks * c}, DType::f32, *this);
  run("rms_norm_backward_cols", col_blocks, static_cast<unsigned>(chunks), 32, 32, ptr(in[0]),
      ptr(x), ptr(in[3]), ptr(dw), rows, c, (rows + chunks - 1) / chunks);
  sum_columns(ptr(dw), ptr(out[1]), chunks, c, 1.0f);
}

void CudaBackend::rope(const OpCall& call) {
  const auto& in = call.inputs;
  const Tensor& x = in[0];
  const i64 pairs = numel(x) / 2;
  run_1d("rope", pairs, ptr(x), ptr(in[1]), ptr(in[2]), ptr(call.outputs[0]), pairs,
         static_cast<i64>(x.dim(-3)), static_cast<i64>(x.dim(-2)), static_cast<i64>(x.dim(-1) / 2));
}

// silu, silu_backward, swiglu, swiglu_backward: one thread per element.
void CudaBackend::gated(const OpCall& call) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  const i64 n = numel(in[0]);
  switch (call.op) {
    case OpId::silu:
      run_1d("silu", n, ptr(in[0]), ptr(out[0]), n);
      break;
    case OpId::silu_backward:
      run_1d("silu_backward", n, ptr(in[0]), ptr(in[1]), ptr(out[0]), n);
      break;
    case OpId::swiglu:
      run_1d("swiglu", n, ptr(in[0]), ptr(in[1]), ptr(out[0]), n);
      break;
    default:  // swiglu_backward
      run_1d("swiglu_backward", n, ptr(in[0]), ptr(in[1]), ptr(in[2]), ptr(out[0]), ptr(out[1]), n);
  }
}

void CudaBackend::adamw(const OpCall& call) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  const Attrs& a = call.attrs;
  auto [step_size, inv_sqrt_bc2, decay] = device_ops::adamw_scalars(a);
  run_1d("adamw", numel(out[0]), ptr(in[0]), ptr(in[1]), ptr(in[2]), ptr(in[3]), ptr(out[0]),
         ptr(out[1]), ptr(out[2]), numel(out[0]), static_cast<float>(a.beta1),
         static_cast<float>(a.beta2), step_size, inv_sqrt_bc2, decay, static_cast<float>(a.eps));
}

namespace {
// matmul_elementwise: f32, and a chain the interpreter kernel holds (its fallback path;
// asked without tensors, as the graph's fusion pass does, it accepts).
bool f32_matmul_elementwise(const OpCall& call) {
  if (!device_ops::f32_except_ids(call))
    return false;
  if (call.inputs.size() < 2 || call.outputs.empty())
    return true;
  std::vector<Tensor> chain{call.outputs[0]};  // stands in for the product, of its shape
  chain.insert(chain.end(), call.inputs.begin() + 2, call.inputs.end());
  for (const Tensor& x : chain)  // a probe without the chain's shape: accepted, as above
    if (x.rank() > static_cast<int>(call.attrs.shape.size()))
      return true;
  return fused_fits(OpCall{OpId::fused_elementwise, chain, call.outputs, call.attrs});
}
}  // namespace

// The native kernels, once: supports() and launch() both read this table.
const KernelTable<CudaBackend>& CudaBackend::kernels() {
  using B = CudaBackend;
  constexpr auto f32 = device_ops::f32_except_ids;
  static const KernelTable<B> table(
      "cuda", device_ops::SharedKernelRows<B, kMaxCopyRank>::with({
                  {OpId::layer_norm, f32, &B::layer_norm},
                  {OpId::causal_attention, f32, &B::attention_forward},
                  {OpId::causal_attention_backward, f32, &B::attention_backward},
                  {OpId::attention, f32, &B::attention_forward},
                  {OpId::attention_backward, f32, &B::attention_backward},
                  {OpId::fused_elementwise, fused_fits, &B::fused},
                  {OpId::matmul_elementwise, f32_matmul_elementwise, &B::matmul_elementwise},
              }));
  return table;
}

bool CudaBackend::supports(const OpCall& call) const {
  return kernels().supports(call);
}

void CudaBackend::launch(const OpCall& call, Stream& stream) {
  for (const Tensor& t : call.outputs) {  // bf16 copies of the bytes this call writes go stale
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
  auto* target = dynamic_cast<CudaStream*>(&stream);
  check(target != nullptr, "cuda: launch on a stream another backend made");
  if (target->is_default()) {
    device_ops::LaunchTarget<CUstream>::Scope scope(launch_target_, stream_);
    kernels().launch(*this, call);
    return;
  }
  // On the created stream: kernels, cuBLAS and the launchers' temporaries, after the
  // default stream's work so far.
  target->order_after_default();
  {
    device_ops::LaunchTarget<CUstream>::Scope scope(launch_target_, target->handle());
    check_cublas(api_.cublasSetStream(cublas_, reinterpret_cast<cudaStream_t>(target->handle())),
                 "cublasSetStream");
    struct BackToDefault {
      CudaBackend& backend;
      ~BackToDefault() {
        backend.api_.cublasSetStream(backend.cublas_,
                                     reinterpret_cast<cudaStream_t>(backend.stream_));
      }
    } back{*this};
    kernels().launch(*this, call);
  }
  target->keep_until_run(call);
}

CUstream CudaBackend::current_stream() const {
  return launch_target_.current(stream_);
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
