#include "backends/opencl/opencl_backend.h"

#include <clblast.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "backends/device_ops.h"
#include "backends/kernel_table.h"
#include "backends/opencl/kernels.cl.h"
#include "core/broadcast.h"
#include "core/error.h"
#include "core/fused_elementwise.h"

namespace loom::opencl {
namespace {

// Every OpenCL call of a launch passes through here: the message is built only on failure
// (built eagerly, it was a heap string per kernel argument).
void ok(cl_int status, std::string_view what) {
  if (status != CL_SUCCESS)
    throw Error("opencl: " + std::string(what) + " failed with error " + std::to_string(status));
}

std::string device_string(cl_device_id d, cl_device_info what) {
  std::size_t size = 0;
  clGetDeviceInfo(d, what, 0, nullptr, &size);
  std::string s(size, '\0');
  clGetDeviceInfo(d, what, size, s.data(), nullptr);
  while (!s.empty() && s.back() == '\0')
    s.pop_back();
  return s;
}

cl_mem mem_of(const Tensor& t) {
  return static_cast<cl_mem>(t.storage()->data());
}
cl_ulong off_of(const Tensor& t) {
  return static_cast<cl_ulong>(t.offset());
}

using Event = Handle<cl_event, clReleaseEvent>;

// A marker enqueued on one queue of `context`: reached when the queue's earlier work is.
class ClMarker final : public TimelineMarker {
 public:
  ClMarker(cl_event event, cl_context context) : event_(event), context_(context) {}
  bool reached() override {
    cl_int status = CL_QUEUED;
    ok(clGetEventInfo(event_.get(), CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status,
                      nullptr),
       "clGetEventInfo");
    check(status >= 0, [&] {
      return "opencl: work before a timeline marker failed with error " + std::to_string(status);
    });
    return status == CL_COMPLETE;
  }
  void wait() override {
    cl_event e = event_.get();
    ok(clWaitForEvents(1, &e), "clWaitForEvents");
  }
  cl_event event() const { return event_.get(); }
  cl_context context() const { return context_; }

 private:
  Event event_;
  cl_context context_;
};

// One in-order command queue. signal() enqueues a marker event and wait() a barrier on
// the other queue's marker, so streams of this device order their work on the device;
// the host waits only when it waits on the timeline itself.
class OpenClStream final : public device_ops::DeviceStream {
 public:
  OpenClStream(OpenClBackend& backend, cl_context context, cl_device_id device)
      : DeviceStream(backend), backend_(backend), context_(context) {
    cl_int err = CL_SUCCESS;
    queue_ = Queue(clCreateCommandQueue(context, device, 0, &err));
    ok(err, "clCreateCommandQueue");
  }
  // Uses the backend's queue.
  OpenClStream(OpenClBackend& backend, cl_context context)
      : DeviceStream(backend), backend_(backend), context_(context) {}
  cl_command_queue queue() const { return queue_.get() ? queue_.get() : backend_.queue(); }
  void synchronize() override { ok(clFinish(queue()), "clFinish"); }
  void signal(Timeline& timeline, std::uint64_t value) override {
    cl_event event = nullptr;
    ok(clEnqueueMarkerWithWaitList(queue(), 0, nullptr, &event), "clEnqueueMarkerWithWaitList");
    auto marker = std::make_shared<ClMarker>(event, context_);
    // Submitted now, so a waiter on another queue (or the host) cannot wait on work that
    // no one has sent to the device.
    ok(clFlush(queue()), "clFlush");
    timeline.signal_at(value, std::move(marker));
  }
  void wait(Timeline& timeline, std::uint64_t value) override {
    std::shared_ptr<TimelineMarker> marker = timeline.marker_for(value);
    auto* ours = dynamic_cast<ClMarker*>(marker.get());
    if (ours != nullptr && ours->context() == context_) {
      cl_event event = ours->event();
      ok(clEnqueueBarrierWithWaitList(queue(), 1, &event, nullptr), "clEnqueueBarrierWithWaitList");
    } else {
      timeline.wait(value);  // reached, signalled from the host, or another device's marker
    }
  }

 protected:
  void device_copy(const Buffer& src, std::size_t src_offset, Buffer& dst, std::size_t dst_offset,
                   std::size_t bytes) override {
    ok(clEnqueueCopyBuffer(queue(), static_cast<cl_mem>(src.data()),
                           static_cast<cl_mem>(dst.data()), src_offset, dst_offset, bytes, 0,
                           nullptr, nullptr),
       "clEnqueueCopyBuffer");
  }
  // Non-blocking transfers in this queue's order: the host memory is the caller's to keep
  // until a value signalled after the copy is reached (Stream's contract).
  void host_to_device(const void* host, Buffer& dst, std::size_t dst_offset,
                      std::size_t bytes) override {
    if (bytes != 0)
      ok(clEnqueueWriteBuffer(queue(), static_cast<cl_mem>(dst.data()), CL_FALSE, dst_offset, bytes,
                              host, 0, nullptr, nullptr),
         "clEnqueueWriteBuffer");
  }
  void device_to_host(const Buffer& src, std::size_t src_offset, void* host,
                      std::size_t bytes) override {
    if (bytes != 0)
      ok(clEnqueueReadBuffer(queue(), static_cast<cl_mem>(src.data()), CL_FALSE, src_offset, bytes,
                             host, 0, nullptr, nullptr),
         "clEnqueueReadBuffer");
  }

 private:
  OpenClBackend& backend_;
  cl_context context_;
  Queue queue_;
};

}  // namespace

std::unique_ptr<OpenClBackend> OpenClBackend::open() {
  cl_uint platforms = 0;
  if (clGetPlatformIDs(0, nullptr, &platforms) != CL_SUCCESS || platforms == 0)
    return nullptr;
  std::vector<cl_platform_id> ids(platforms);
  clGetPlatformIDs(platforms, ids.data(), nullptr);
  for (cl_device_type type :
       {cl_device_type{CL_DEVICE_TYPE_GPU}, cl_device_type{CL_DEVICE_TYPE_ALL}}) {
    for (cl_platform_id p : ids) {
      cl_device_id device = nullptr;
      cl_uint count = 0;
      if (clGetDeviceIDs(p, type, 1, &device, &count) == CL_SUCCESS && count > 0)
        return std::make_unique<OpenClBackend>(p, device);
    }
  }
  return nullptr;
}

OpenClBackend::OpenClBackend(cl_platform_id platform, cl_device_id device) : device_(device) {
  device_name_ = device_string(device, CL_DEVICE_NAME);
  driver_version_ = device_string(device, CL_DRIVER_VERSION);
  cl_context_properties props[] = {CL_CONTEXT_PLATFORM,
                                   reinterpret_cast<cl_context_properties>(platform), 0};
  cl_int err = CL_SUCCESS;
  context_ = Context(clCreateContext(props, 1, &device, nullptr, nullptr, &err));
  ok(err, "clCreateContext");
  queue_ = Queue(clCreateCommandQueue(context_.get(), device, 0, &err));
  ok(err, "clCreateCommandQueue");
  stream_ = std::make_unique<OpenClStream>(*this, context_.get());
  build_program();
  const cl_int no_fault[4] = {0, 0, 0, 0};
  id_fault_ = Memory(clCreateBuffer(context_.get(), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                    sizeof no_fault, const_cast<cl_int*>(no_fault), &err));
  ok(err, "clCreateBuffer (id check)");
  cl_device_type type = 0;
  ok(clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof type, &type, nullptr),
     "clGetDeviceInfo CL_DEVICE_TYPE");
  // On a CPU device CLBlast's kernels (tiled for GPUs) ran small products at 4 to 15
  // GFLOP/s where gemm_nt ran 30 to 60 (bench/RESULTS.md, "OpenCL GEMM").
  gemm_ = (type & CL_DEVICE_TYPE_CPU) != 0 ? Gemm::gemm_nt : Gemm::clblast;
  if (const char* choice = std::getenv("LOOM_OPENCL_GEMM"); choice != nullptr && *choice) {
    const std::string v = choice;
    check(v == "clblast" || v == "gemm_nt",
          [&] { return "LOOM_OPENCL_GEMM='" + v + "': expected 'clblast' or 'gemm_nt'"; });
    gemm_ = v == "clblast" ? Gemm::clblast : Gemm::gemm_nt;
  }
}

Program OpenClBackend::compile(const std::string& source, const std::string& what) {
  // Binaries are cached on disk keyed by device, driver and source, so the JIT runs once;
  // under $XDG_CACHE_HOME (the XDG base directories' rule, as PoCL's kernel cache is), else
  // ~/.cache, so a test can give each process a cache of its own.
  std::size_t key = std::hash<std::string>{}(device_name_ + "|" + driver_version_ + "|" + source);
  const char* xdg_cache = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::filesystem::path dir =
      (xdg_cache != nullptr && *xdg_cache ? std::filesystem::path(xdg_cache)
       : home != nullptr && *home         ? std::filesystem::path(home) / ".cache"
                                          : std::filesystem::path("/tmp") / ".cache") /
      "loom" / "opencl";
  std::filesystem::path cached = dir / (std::to_string(key) + ".bin");
  cl_int err = CL_SUCCESS;
  if (std::ifstream in{cached, std::ios::binary}) {
    std::string binary((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto* data = reinterpret_cast<const unsigned char*>(binary.data());
    std::size_t size = binary.size();
    cl_int binary_status = CL_SUCCESS;
    cl_program p =
        clCreateProgramWithBinary(context_.get(), 1, &device_, &size, &data, &binary_status, &err);
    if (err == CL_SUCCESS && binary_status == CL_SUCCESS &&
        clBuildProgram(p, 1, &device_, "", nullptr, nullptr) == CL_SUCCESS)
      return Program(p);
    if (p != nullptr)
      clReleaseProgram(p);
  }
  const char* text = source.c_str();
  Program program(clCreateProgramWithSource(context_.get(), 1, &text, nullptr, &err));
  ok(err, "clCreateProgramWithSource");
  if (clBuildProgram(program.get(), 1, &device_, "-cl-std=CL1.2", nullptr, nullptr) != CL_SUCCESS) {
    std::size_t size = 0;
    clGetProgramBuildInfo(program.get(), device_, CL_PROGRAM_BUILD_LOG, 0, nullptr, &size);
    std::string log(size, '\0');
    clGetProgramBuildInfo(program.get(), device_, CL_PROGRAM_BUILD_LOG, size, log.data(), nullptr);
    throw Error("opencl: building " + what + " for " + device_name_ + " failed:\n" + log);
  }
  std::size_t size = 0;
  if (clGetProgramInfo(program.get(), CL_PROGRAM_BINARY_SIZES, sizeof size, &size, nullptr) ==
          CL_SUCCESS &&
      size > 0) {
    std::string binary(size, '\0');
    unsigned char* ptr = reinterpret_cast<unsigned char*>(binary.data());
    if (clGetProgramInfo(program.get(), CL_PROGRAM_BINARIES, sizeof ptr, &ptr, nullptr) ==
        CL_SUCCESS) {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      std::filesystem::path temp = cached;
      temp += ".tmp." + std::to_string(getpid());
      if (std::ofstream out{temp, std::ios::binary};
          out.write(binary.data(), static_cast<std::streamsize>(size)))
        std::filesystem::rename(temp, cached, ec);  // atomic: a reader sees all or nothing
    }
  }
  return program;
}

void OpenClBackend::build_program() {
  program_ = compile(std::string(kElementwiseSource) + kGemmSource + kKernelSource, "the kernels");
  cl_int err = CL_SUCCESS;
  for (const char* name : {"fill",
                           "binary",
                           "unary",
                           "unary_exp",
                           "unary_log",
                           "unary_tanh",
                           "unary_relu",
                           "unary_gelu",
                           "unary_scale",
                           "unary_sqrt",
                           "unary_erf",
                           "unary_backward",
                           "reduce_rows",
                           "sum_cols",
                           "adamw",
                           "copy_strided",
                           "slice_backward",
                           "sum_squares_partial",
                           "embedding",
                           "embedding_zero",
                           "embedding_scatter",
                           "embedding_add_base",
                           "cross_entropy_rows",
                           "cross_entropy_backward",
                           "layer_norm_backward_rows",
                           "layer_norm_backward_cols",
                           "attention_forward",
                           "attention_backward_dq",
                           "attention_backward_dkv",
                           "gemm_nt",
                           "gemm_nn",
                           "gemm_tn",
                           "copy_rows"}) {
    kernels_.emplace(name, Kernel(clCreateKernel(program_.get(), name, &err)));
    ok(err, std::string("clCreateKernel ") + name);
  }
}

cl_kernel OpenClBackend::kernel(const char* name) {
  return kernels_.at(name).get();
}

namespace {
void set_arg(cl_kernel k, cl_uint i, cl_mem v) {
  ok(clSetKernelArg(k, i, sizeof v, &v), "clSetKernelArg");
}
void set_arg(cl_kernel k, cl_uint i, cl_ulong v) {
  ok(clSetKernelArg(k, i, sizeof v, &v), "clSetKernelArg");
}
void set_arg(cl_kernel k, cl_uint i, cl_uint v) {
  ok(clSetKernelArg(k, i, sizeof v, &v), "clSetKernelArg");
}
void set_arg(cl_kernel k, cl_uint i, cl_int v) {
  ok(clSetKernelArg(k, i, sizeof v, &v), "clSetKernelArg");
}
void set_arg(cl_kernel k, cl_uint i, cl_float v) {
  ok(clSetKernelArg(k, i, sizeof v, &v), "clSetKernelArg");
}
}  // namespace

template <class... Args>
void OpenClBackend::run(const char* name, std::size_t global, Args... args) {
  if (global == 0)
    return;
  std::lock_guard lock(mutex_);
  cl_kernel k = kernel(name);
  cl_uint i = 0;
  (set_arg(k, i++, args), ...);
  const cl_int err =
      clEnqueueNDRangeKernel(current_queue(), k, 1, nullptr, &global, nullptr, 0, nullptr, nullptr);
  if (err != CL_SUCCESS)
    ok(err, std::string("clEnqueueNDRangeKernel ") + name);
}

template <class... Args>
void OpenClBackend::run_rows(const char* name, std::size_t columns, std::size_t rows,
                             Args... args) {
  if (columns == 0 || rows == 0)
    return;
  std::lock_guard lock(mutex_);
  cl_kernel k = kernel(name);
  cl_uint i = 0;
  (set_arg(k, i++, args), ...);
  const std::size_t global[2] = {columns, rows};
  const cl_int err =
      clEnqueueNDRangeKernel(current_queue(), k, 2, nullptr, global, nullptr, 0, nullptr, nullptr);
  if (err != CL_SUCCESS)
    ok(err, std::string("clEnqueueNDRangeKernel ") + name);
}

DeviceInfo OpenClBackend::info() const {
  DeviceInfo i;
  i.name = "opencl (" + device_name_ + ", driver " + driver_version_ + ")";
  cl_ulong mem = 0;
  clGetDeviceInfo(device_, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof mem, &mem, nullptr);
  i.memory_bytes = mem;
  i.host_accessible = false;
  return i;
}

Buffer OpenClBackend::allocate(std::size_t bytes) {
  cl_int err = CL_SUCCESS;
  cl_mem m =
      clCreateBuffer(context_.get(), CL_MEM_READ_WRITE, bytes == 0 ? 4 : bytes, nullptr, &err);
  ok(err, "clCreateBuffer of " + std::to_string(bytes) + " bytes");
  return Buffer(m, bytes, this);
}

void OpenClBackend::release(void* data, std::size_t) noexcept {
  clReleaseMemObject(static_cast<cl_mem>(data));
}

std::unique_ptr<Stream> OpenClBackend::create_stream(StreamKind) {
  return std::make_unique<OpenClStream>(*this, context_.get(), device_);
}

OpenClBackend::~OpenClBackend() {
  if (queue_.get() != nullptr)
    clFinish(queue_.get());
}

void OpenClBackend::upload(const void* host, Buffer& dst, std::size_t dst_offset,
                           std::size_t bytes) {
  if (bytes == 0)
    return;
  ok(clEnqueueWriteBuffer(current_queue(), static_cast<cl_mem>(dst.data()), CL_TRUE, dst_offset,
                          bytes, host, 0, nullptr, nullptr),
     "clEnqueueWriteBuffer");
}

void OpenClBackend::download(const Buffer& src, std::size_t src_offset, void* host,
                             std::size_t bytes) {
  if (bytes == 0)
    return;
  ok(clEnqueueReadBuffer(current_queue(), static_cast<cl_mem>(src.data()), CL_TRUE, src_offset,
                         bytes, host, 0, nullptr, nullptr),
     "clEnqueueReadBuffer");
  report_id_fault(current_queue());
}

Tensor OpenClBackend::transposed_copy(const Tensor& x) {
  const Tensor view = x.transpose(x.rank() - 2, x.rank() - 1);
  Tensor out = Tensor::empty(view.shape(), DType::f32, *this);
  StridedView strided;
  for (int d = 0; d < view.rank(); ++d) {
    strided.shape[d] = static_cast<cl_ulong>(view.shape()[d]);
    strided.stride[d] = static_cast<cl_ulong>(view.strides()[d]);
  }
  copy_strided(view, out, view.rank(), strided);
  return out;
}

void OpenClBackend::matmul_dot(const OpCall& call) {
  matmul_dot(call, GemmTail{});
}

void OpenClBackend::matmul_dot(const OpCall& call, const GemmTail& tail) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  Tensor& c = call.outputs[0];
  const bool ta = call.attrs.trans_a, tb = call.attrs.trans_b;
  const std::int64_t m = c.rank() >= 2 ? c.dim(-2) : 1, n = c.dim(-1),
                     k = ta ? a.dim(-2) : a.dim(-1);
  if (c.numel() == 0)
    return;
  // B as stored ([K, N], a forward product's weight): gemm_nn, or gemm_tn for a
  // transposed A, eight columns of B's row per load. B transposed ([N, K], the backward
  // products against a weight): gemm_nt, A and B both read along k, through a transposed
  // copy of A when A is transposed too (one pass over it against M*N*K multiply-adds).
  const char* name = !tb ? (ta ? "gemm_tn" : "gemm_nn") : "gemm_nt";
  const std::size_t which = !tb ? (ta ? 1 : 0) : 2;  // its place in GemmTail::kernels
  const Tensor rows_a = tb && ta ? transposed_copy(a) : a;
  const Tensor& rows_b = b;
  const std::size_t columns = static_cast<std::size_t>(tb ? n : (n + 7) / 8);
  auto launch = [&](std::int64_t rows, std::size_t batches, cl_ulong a_off, cl_ulong a_batch,
                    cl_ulong b_off, cl_ulong b_batch, cl_ulong c_off) {
    std::lock_guard lock(mutex_);
    cl_kernel kern = tail.kernels != nullptr ? (*tail.kernels)[which] : kernel(name);
    cl_uint arg = 0;
    set_arg(kern, arg++, static_cast<cl_int>(rows));
    set_arg(kern, arg++, static_cast<cl_int>(n));
    set_arg(kern, arg++, static_cast<cl_int>(k));
    set_arg(kern, arg++, mem_of(rows_a));
    set_arg(kern, arg++, off_of(rows_a) + a_off);
    set_arg(kern, arg++, a_batch);
    set_arg(kern, arg++, mem_of(rows_b));
    set_arg(kern, arg++, off_of(rows_b) + b_off);
    set_arg(kern, arg++, b_batch);
    set_arg(kern, arg++, mem_of(c));
    if (tail.kernels != nullptr) {  // c_off: where this launch's product starts in c
      set_arg(kern, arg++, c_off);
      tail.set_args(kern, arg);
    } else {
      set_arg(kern, arg++, off_of(c) + c_off);
      set_arg(kern, arg++, mem_of(tail.bias != nullptr ? *tail.bias : c));
      set_arg(kern, arg++, tail.bias != nullptr ? off_of(*tail.bias) : cl_ulong{0});
      set_arg(kern, arg++, cl_int{tail.bias != nullptr ? 1 : 0});
    }
    const std::size_t global[3] = {columns, static_cast<std::size_t>((rows + 3) / 4), batches};
    const cl_int err = clEnqueueNDRangeKernel(current_queue(), kern, 3, nullptr, global, nullptr, 0,
                                              nullptr, nullptr);
    if (err != CL_SUCCESS)
      ok(err, std::string("clEnqueueNDRangeKernel ") + name);
  };
  if (b.rank() == 2 && !ta) {  // one B for every row of A: the batch folds into M
    launch(c.numel() / n, 1, 0, 0, 0, 0, 0);
    return;
  }
  const std::vector<std::pair<std::int64_t, std::int64_t>> offsets =
      matmul_batch_offsets(a.shape(), b.shape(), c.shape());
  const std::size_t batch = offsets.size();
  const std::int64_t a_stride = batch > 1 ? offsets[1].first - offsets[0].first : 0;
  const std::int64_t b_stride = batch > 1 ? offsets[1].second - offsets[0].second : 0;
  bool even = a_stride >= 0 && b_stride >= 0;
  for (std::size_t i = 0; even && i < batch; ++i)
    even = offsets[i].first == offsets[0].first + static_cast<std::int64_t>(i) * a_stride &&
           offsets[i].second == offsets[0].second + static_cast<std::int64_t>(i) * b_stride;
  if (even) {
    launch(m, batch, static_cast<cl_ulong>(offsets[0].first), static_cast<cl_ulong>(a_stride),
           static_cast<cl_ulong>(offsets[0].second), static_cast<cl_ulong>(b_stride), 0);
    return;
  }
  for (std::size_t i = 0; i < batch; ++i)  // any other broadcast: one launch per matrix
    launch(m, 1, static_cast<cl_ulong>(offsets[i].first), 0,
           static_cast<cl_ulong>(offsets[i].second), 0, static_cast<cl_ulong>(i * m * n));
}

bool OpenClBackend::uses_gemm_nt(const Tensor& a, const Tensor& b, const Tensor& c) const {
  // Loom's kernels take int sizes and copy_strided's ranks; anything larger goes to CLBlast.
  constexpr std::int64_t kIntSizes = std::int64_t{1} << 31;
  return gemm_ == Gemm::gemm_nt && a.rank() <= kMaxCopyRank && b.rank() <= kMaxCopyRank &&
         c.numel() < kIntSizes && a.numel() < kIntSizes && b.numel() < kIntSizes;
}

void OpenClBackend::matmul(const OpCall& call) {
  if (uses_gemm_nt(call.inputs[0], call.inputs[1], call.outputs[0])) {
    gemm_calls_[static_cast<std::size_t>(Gemm::gemm_nt)].fetch_add(1, std::memory_order_relaxed);
    matmul_dot(call);
    return;
  }
  gemm_calls_[static_cast<std::size_t>(Gemm::clblast)].fetch_add(1, std::memory_order_relaxed);
  matmul_clblast(call);
}

void OpenClBackend::linear(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Tensor& w = call.inputs[1];
  const Tensor& bias = call.inputs[2];
  Tensor& y = call.outputs[0];
  if (y.numel() == 0)
    return;
  // x [..., K] as the matrix [rows, K], y as [rows, N]: one product.
  const std::int64_t k = x.dim(-1), n = y.dim(-1), rows = y.numel() / n;
  const Tensor x2 = x.reshape({rows, k});
  Tensor y2 = y.reshape({rows, n});
  Attrs attrs;
  attrs.trans_b = call.attrs.trans_b;
  const Tensor operands[] = {x2, w};
  Tensor products[] = {y2};
  const OpCall product{OpId::matmul, operands, products, attrs};
  if (uses_gemm_nt(x2, w, y2)) {
    gemm_calls_[static_cast<std::size_t>(Gemm::gemm_nt)].fetch_add(1, std::memory_order_relaxed);
    matmul_dot(product, GemmTail{&bias, nullptr, {}});
    return;
  }
  gemm_calls_[static_cast<std::size_t>(Gemm::clblast)].fetch_add(1, std::memory_order_relaxed);
  matmul_clblast(product);
  launch_binary(*device_ops::plan_binary(OpId::add, y2.shape(), bias.shape()), y2, bias, y2);
}

void OpenClBackend::matmul_clblast(const OpCall& call) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  Tensor& c = call.outputs[0];
  bool ta = call.attrs.trans_a, tb = call.attrs.trans_b;
  std::size_t m = c.dim(-2), n = c.dim(-1), k = ta ? a.dim(-2) : a.dim(-1);
  std::size_t lda = a.dim(-1), ldb = b.dim(-1);
  auto gemm = [&](std::size_t rows, std::size_t a_off, std::size_t b_off, std::size_t c_off) {
    cl_command_queue q = current_queue();
    auto status = clblast::Gemm<float>(
        clblast::Layout::kRowMajor, ta ? clblast::Transpose::kYes : clblast::Transpose::kNo,
        tb ? clblast::Transpose::kYes : clblast::Transpose::kNo, rows, n, k, 1.0f, mem_of(a),
        off_of(a) + a_off, lda, mem_of(b), off_of(b) + b_off, ldb, 0.0f, mem_of(c),
        off_of(c) + c_off, n, &q, nullptr);
    check(status == clblast::StatusCode::kSuccess, [&] {
      return "opencl: CLBlast Gemm failed with status " + std::to_string(static_cast<int>(status));
    });
  };
  if (b.rank() == 2 && !ta) {  // fold the batch into M
    gemm(c.numel() / std::max<std::size_t>(n, 1), 0, 0, 0);
    return;
  }
  // A batch of products is one CLBlast call, not one per matrix: a loop of small GEMMs
  // (attention's per-head products) costs a kernel launch or more each. Evenly spaced
  // operands (a stride per batch, 0 where one broadcasts) go to GemmStridedBatched,
  // any other broadcast to GemmBatched with each matrix's offset.
  std::vector<std::pair<std::int64_t, std::int64_t>> offsets =
      matmul_batch_offsets(a.shape(), b.shape(), c.shape());
  const std::size_t batch = offsets.size();
  if (batch == 0 || m == 0 || n == 0)
    return;
  if (batch == 1) {
    gemm(m, static_cast<std::size_t>(offsets[0].first), static_cast<std::size_t>(offsets[0].second),
         0);
    return;
  }
  const auto a_transpose = ta ? clblast::Transpose::kYes : clblast::Transpose::kNo;
  const auto b_transpose = tb ? clblast::Transpose::kYes : clblast::Transpose::kNo;
  const std::int64_t a_stride = offsets[1].first - offsets[0].first;
  const std::int64_t b_stride = offsets[1].second - offsets[0].second;
  bool even = offsets[0].first == 0 && offsets[0].second == 0 && a_stride >= 0 && b_stride >= 0;
  for (std::size_t i = 0; even && i < batch; ++i)
    even = offsets[i].first == static_cast<std::int64_t>(i) * a_stride &&
           offsets[i].second == static_cast<std::int64_t>(i) * b_stride;
  cl_command_queue q = current_queue();
  clblast::StatusCode status;
  if (even) {
    status = clblast::GemmStridedBatched<float>(
        clblast::Layout::kRowMajor, a_transpose, b_transpose, m, n, k, 1.0f, mem_of(a), off_of(a),
        lda, static_cast<std::size_t>(a_stride), mem_of(b), off_of(b), ldb,
        static_cast<std::size_t>(b_stride), 0.0f, mem_of(c), off_of(c), n, m * n, batch, &q,
        nullptr);
  } else {
    std::vector<std::size_t> a_offsets(batch), b_offsets(batch), c_offsets(batch);
    for (std::size_t i = 0; i < batch; ++i) {
      a_offsets[i] = off_of(a) + static_cast<std::size_t>(offsets[i].first);
      b_offsets[i] = off_of(b) + static_cast<std::size_t>(offsets[i].second);
      c_offsets[i] = off_of(c) + i * m * n;
    }
    const std::vector<float> alphas(batch, 1.0f), betas(batch, 0.0f);
    status = clblast::GemmBatched<float>(clblast::Layout::kRowMajor, a_transpose, b_transpose, m, n,
                                         k, alphas.data(), mem_of(a), a_offsets.data(), lda,
                                         mem_of(b), b_offsets.data(), ldb, betas.data(), mem_of(c),
                                         c_offsets.data(), n, batch, &q, nullptr);
  }
  check(status == clblast::StatusCode::kSuccess, [&] {
    return "opencl: CLBlast batched Gemm failed with status " +
           std::to_string(static_cast<int>(status));
  });
}

namespace {
constexpr int kMaxCopyRank = OpenClBackend::kMaxCopyRank;
constexpr std::int64_t kMaxHead = 256;  // LOOM_MAX_HEAD in kernels.cl

bool f32_copy(const OpCall& call) {
  return device_ops::f32_except_ids(call) && call.inputs[0].rank() <= kMaxCopyRank;
}
// The GEMM kernels call the epilogue once per element, in scalar code (their vector
// width is the eight columns a work-item computes), where a chain kernel of its own is
// vectorized across work-items by a CPU device's compiler: a chain of adds, multiplies and
// selections costs less in the GEMM than a pass of its own, one with exp, erf, tanh or a
// square root more (the GPT block's GELU: 3-6% slower a step on PoCL). So only the former.
bool f32_cheap_epilogue(const OpCall& call) {
  if (!device_ops::f32_except_ids(call) || call.attrs.program == nullptr)
    return false;
  for (const ElementwiseStep& s : call.attrs.program->steps)
    if (s.op != OpId::add && s.op != OpId::sub && s.op != OpId::mul && s.op != OpId::div &&
        s.op != OpId::scale && s.op != OpId::relu && s.op != OpId::relu_backward &&
        s.op != OpId::expand)
      return false;
  return true;
}
bool f32_linear(const OpCall& call) {
  return device_ops::f32_except_ids(call) && call.inputs[1].rank() == 2;
}
bool f32_expand(const OpCall& call) {
  return device_ops::f32_except_ids(call) &&
         call.attrs.shape.size() <= static_cast<std::size_t>(kMaxCopyRank);
}
bool f32_attention(const OpCall& call) {
  const Tensor& qkv = call.inputs[call.op == OpId::causal_attention ? 0 : 1];
  return device_ops::f32_except_ids(call) &&
         qkv.dim(2) / 3 / std::max<std::int64_t>(call.attrs.heads, 1) <= kMaxHead;
}
}  // namespace

namespace {
std::size_t count(const Tensor& t) {
  return static_cast<std::size_t>(t.numel());
}
}  // namespace

void OpenClBackend::fill(const OpCall& call) {
  Tensor& y = call.outputs[0];
  run("fill", count(y), mem_of(y), off_of(y), static_cast<cl_float>(call.attrs.alpha));
}

void OpenClBackend::binary(const OpCall& call) {
  const auto& in = call.inputs;
  Tensor& y = call.outputs[0];
  device_ops::BinaryPlan plan = *device_ops::plan_binary(call.op, in[0].shape(), in[1].shape());
  const Tensor& full = plan.other_left ? in[1] : in[0];
  const Tensor& other = plan.other_left ? in[0] : in[1];
  launch_binary(plan, full, other, y);
}

void OpenClBackend::launch_binary(const device_ops::BinaryPlan& plan, const Tensor& full,
                                  const Tensor& other, const Tensor& y) {
  const bool by_rows = plan.mode == 2 || plan.mode == 3;  // binary in kernels.cl
  const std::size_t columns = by_rows ? static_cast<std::size_t>(plan.period) : count(y);
  run_rows("binary", columns, columns == 0 ? 0 : count(y) / columns, static_cast<cl_int>(plan.op),
           mem_of(full), off_of(full), mem_of(other), off_of(other), mem_of(y), off_of(y),
           static_cast<cl_int>(plan.mode), static_cast<cl_ulong>(columns),
           static_cast<cl_int>(plan.other_left));
}

template <device_ops::UnaryKernel Code>
void OpenClBackend::unary(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  // One kernel per op (kernels.cl, LOOM_UNARY), in UnaryKernel's order.
  static constexpr const char* kNames[] = {"unary_exp",  "unary_log",   "unary_tanh", "unary_relu",
                                           "unary_gelu", "unary_scale", "unary_sqrt", "unary_erf"};
  static_assert(std::size(kNames) == static_cast<std::size_t>(device_ops::UnaryKernel::erf) + 1);
  run(kNames[static_cast<std::size_t>(Code)], count(y), mem_of(x), off_of(x), mem_of(y), off_of(y),
      static_cast<cl_float>(call.attrs.alpha));
}

void OpenClBackend::math(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  run("unary", count(y), static_cast<cl_int>(device_ops::math_unary_code(call.attrs.function)),
      mem_of(x), off_of(x), mem_of(y), off_of(y), static_cast<cl_float>(call.attrs.alpha));
}

template <device_ops::UnaryBackwardKernel Code>
void OpenClBackend::unary_backward(const OpCall& call) {
  const auto& in = call.inputs;
  Tensor& dx = call.outputs[0];
  run("unary_backward", count(dx), static_cast<cl_int>(Code), mem_of(in[0]), off_of(in[0]),
      mem_of(in[1]), off_of(in[1]), mem_of(dx), off_of(dx));
}

// sum over the axes of a row or column layout; max over the last axis (a row layout).
void OpenClBackend::reduce(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  std::vector<std::int64_t> axes =
      call.op == OpId::max ? std::vector<std::int64_t>{call.attrs.axis} : call.attrs.axes;
  if (classify_reduction(x, axes) == ReduceShape::rows) {
    std::size_t rows = 1, cols = 1;
    std::vector<bool> reduced(x.rank(), axes.empty());
    for (auto a : axes)
      reduced[normalize_axis(a, x.rank(), "sum")] = true;
    for (int d = 0; d < x.rank(); ++d)
      (reduced[d] ? cols : rows) *= x.shape()[d];
    run("reduce_rows", rows, static_cast<cl_int>(call.op == OpId::max), mem_of(x), off_of(x),
        mem_of(y), off_of(y), static_cast<cl_ulong>(cols), 1.0f);
    return;
  }
  std::size_t cols = count(y), rows = count(x) / std::max<std::size_t>(cols, 1);
  run("sum_cols", cols, mem_of(x), off_of(x), mem_of(y), off_of(y), static_cast<cl_ulong>(rows),
      static_cast<cl_ulong>(cols), 1.0f);
}

void OpenClBackend::copy_strided(const Tensor& x, Tensor& y, int rank, const StridedView& v) {
  // Dimensions the index arithmetic need not tell apart are merged: a size-1 one goes,
  // and one whose stride is the next one's extent times that one's stride joins it (two
  // repeated dimensions, stride 0, join too).
  std::vector<cl_ulong> shape, stride;
  for (int d = 0; d < rank; ++d) {
    if (v.shape[d] == 1)
      continue;
    if (!shape.empty() && stride.back() == v.stride[d] * v.shape[d]) {
      shape.back() *= v.shape[d];
      stride.back() = v.stride[d];
    } else {
      shape.push_back(v.shape[d]);
      stride.push_back(v.stride[d]);
    }
  }
  if (shape.empty()) {
    shape.push_back(1);
    stride.push_back(0);
  }
  constexpr cl_ulong kUint = cl_ulong{1} << 32;
  cl_ulong reach = 0;  // the largest element index read, from x's offset
  for (std::size_t d = 0; d < shape.size(); ++d)
    reach += (shape[d] - 1) * stride[d];
  const std::size_t total = count(y);
  if (total > 0 && total < kUint && reach < kUint && shape.size() <= 6) {
    const std::size_t outer_rank = shape.size() - 1;
    cl_uint n[5] = {1, 1, 1, 1, 1}, t[5] = {0, 0, 0, 0, 0};
    for (std::size_t d = 0; d < outer_rank; ++d) {
      n[d] = static_cast<cl_uint>(shape[d]);
      t[d] = static_cast<cl_uint>(stride[d]);
    }
    std::lock_guard lock(mutex_);
    cl_kernel k = kernel("copy_rows");
    cl_uint arg = 0;
    set_arg(k, arg++, mem_of(x));
    set_arg(k, arg++, off_of(x));
    set_arg(k, arg++, mem_of(y));
    set_arg(k, arg++, off_of(y));
    set_arg(k, arg++, static_cast<cl_uint>(shape.back()));
    set_arg(k, arg++, static_cast<cl_uint>(stride.back()));
    set_arg(k, arg++, static_cast<cl_int>(outer_rank));
    for (cl_uint e : n)
      set_arg(k, arg++, e);
    for (cl_uint e : t)
      set_arg(k, arg++, e);
    constexpr std::size_t kPiece = 64;  // LOOM_COPY_PIECE in kernels.cl
    const auto inner = static_cast<std::size_t>(shape.back());
    const std::size_t global[2] = {(inner + kPiece - 1) / kPiece, total / inner};
    ok(clEnqueueNDRangeKernel(current_queue(), k, 2, nullptr, global, nullptr, 0, nullptr, nullptr),
       "clEnqueueNDRangeKernel copy_rows");
    return;
  }
  run("copy_strided", count(y), mem_of(x), off_of(x), mem_of(y), off_of(y),
      static_cast<cl_int>(rank), v.shape[0], v.shape[1], v.shape[2], v.shape[3], v.shape[4],
      v.shape[5], v.stride[0], v.stride[1], v.stride[2], v.stride[3], v.stride[4], v.stride[5]);
}

void OpenClBackend::copy(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  StridedView view;
  for (int d = 0; d < x.rank(); ++d) {
    view.shape[d] = static_cast<cl_ulong>(x.shape()[d]);
    view.stride[d] = static_cast<cl_ulong>(x.strides()[d]);
  }
  copy_strided(x, call.outputs[0], x.rank(), view);
}

// Right-aligned broadcasting: a size-1 or missing dimension of x repeats (stride 0).
void OpenClBackend::expand(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Shape& target = call.outputs[0].shape();
  const int rank = static_cast<int>(target.size()), lead = rank - x.rank();
  StridedView view;
  for (int d = 0; d < rank; ++d) {
    view.shape[d] = static_cast<cl_ulong>(target[static_cast<std::size_t>(d)]);
    const int xd = d - lead;
    view.stride[d] = xd < 0 || x.shape()[static_cast<std::size_t>(xd)] == 1
                         ? 0
                         : static_cast<cl_ulong>(x.strides()[static_cast<std::size_t>(xd)]);
  }
  copy_strided(x, call.outputs[0], rank, view);
}

void OpenClBackend::slice_backward(const OpCall& call) {
  const Tensor& dy = call.inputs[0];
  Tensor& dx = call.outputs[0];
  int axis = normalize_axis(call.attrs.axis, dx.rank(), "slice_backward");
  cl_ulong inner = 1;
  for (int d = axis + 1; d < dx.rank(); ++d)
    inner *= static_cast<cl_ulong>(dx.shape()[d]);
  run_rows("slice_backward", static_cast<std::size_t>(inner),
           inner == 0 ? 0 : count(dx) / static_cast<std::size_t>(inner), mem_of(dy), off_of(dy),
           mem_of(dx), off_of(dx), static_cast<cl_ulong>(dx.shape()[axis]),
           static_cast<cl_ulong>(dy.shape()[axis]), inner, static_cast<cl_ulong>(call.attrs.start));
}

void OpenClBackend::sum_squares(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  std::size_t total = count(x),
              chunks = std::max<std::size_t>(1, std::min<std::size_t>(1024, total));
  std::size_t chunk = (total + chunks - 1) / chunks;
  Tensor partial = Tensor::empty({static_cast<std::int64_t>(chunks)}, DType::f32, *this);
  run("sum_squares_partial", chunks, mem_of(x), off_of(x), static_cast<cl_ulong>(total),
      static_cast<cl_ulong>(chunk), mem_of(partial));
  run("reduce_rows", 1, cl_int{0}, mem_of(partial), cl_ulong{0}, mem_of(y), off_of(y),
      static_cast<cl_ulong>(chunks), 1.0f);
}

void OpenClBackend::embedding(const OpCall& call) {
  const Tensor &table = call.inputs[0], &ids = call.inputs[1];
  Tensor& y = call.outputs[0];
  id_fault_possible_.store(true, std::memory_order_relaxed);
  run("embedding", count(y), mem_of(table), off_of(table), mem_of(ids), off_of(ids), mem_of(y),
      off_of(y), static_cast<cl_ulong>(table.dim(1)), static_cast<cl_ulong>(table.dim(0)),
      id_fault_.get());
}

// embedding_backward, and embedding_backward_add (base, dy, ids), which then adds base to
// each sum: the two ops' bits, without a temporary table (kernels.cl, embedding_*).
void OpenClBackend::embedding_backward(const OpCall& call) {
  const bool onto_base = call.op == OpId::embedding_backward_add;
  const Tensor &dy = call.inputs[onto_base ? 1 : 0], &ids = call.inputs[onto_base ? 2 : 1];
  Tensor& dw = call.outputs[0];
  const auto c = static_cast<std::size_t>(dw.dim(1)), vocab = static_cast<std::size_t>(dw.dim(0));
  run_rows("embedding_zero", c, vocab, mem_of(dw), off_of(dw), cl_ulong{c});
  id_fault_possible_.store(true, std::memory_order_relaxed);
  run("embedding_scatter", c, mem_of(dy), off_of(dy), mem_of(ids), off_of(ids), mem_of(dw),
      off_of(dw), static_cast<cl_ulong>(ids.numel()), cl_ulong{c}, cl_ulong{vocab}, id_fault_.get(),
      cl_int{onto_base ? device_ops::kIdEmbeddingBackwardAdd : device_ops::kIdEmbeddingBackward});
  if (onto_base)
    run_rows("embedding_add_base", c, vocab, mem_of(call.inputs[0]), off_of(call.inputs[0]),
             mem_of(dw), off_of(dw), cl_ulong{c});
}

void OpenClBackend::report_id_fault(cl_command_queue queue) {
  if (!id_fault_possible_.exchange(false, std::memory_order_relaxed))
    return;
  std::int32_t fault[4] = {0, 0, 0, 0};
  static_assert(sizeof(cl_int) == sizeof(std::int32_t));
  ok(clEnqueueReadBuffer(queue, id_fault_.get(), CL_TRUE, 0, sizeof fault, fault, 0, nullptr,
                         nullptr),
     "clEnqueueReadBuffer (id check)");
  if (fault[0] == 0)
    return;
  const cl_int clear[4] = {0, 0, 0, 0};
  ok(clEnqueueWriteBuffer(queue, id_fault_.get(), CL_TRUE, 0, sizeof clear, clear, 0, nullptr,
                          nullptr),
     "clEnqueueWriteBuffer (id check)");
  throw device_ops::id_fault_error(fault);
}

void OpenClBackend::cross_entropy(const OpCall& call) {
  const Tensor &logits = call.inputs[0], &targets = call.inputs[1];
  auto& out = call.outputs;
  std::size_t rows = static_cast<std::size_t>(logits.dim(0));
  if (rows == 0) {
    run("fill", 1, mem_of(out[0]), off_of(out[0]), 0.0f);
    return;
  }
  Tensor row_loss = Tensor::empty({logits.dim(0)}, DType::f32, *this);
  id_fault_possible_.store(true, std::memory_order_relaxed);
  run("cross_entropy_rows", rows, mem_of(logits), off_of(logits), mem_of(targets), off_of(targets),
      mem_of(out[1]), off_of(out[1]), mem_of(row_loss), static_cast<cl_ulong>(logits.dim(1)),
      id_fault_.get());
  run("reduce_rows", 1, cl_int{0}, mem_of(row_loss), cl_ulong{0}, mem_of(out[0]), off_of(out[0]),
      static_cast<cl_ulong>(rows), 1.0f / static_cast<float>(rows));
}

void OpenClBackend::cross_entropy_backward(const OpCall& call) {
  const auto& in = call.inputs;
  Tensor& dx = call.outputs[0];
  const Tensor& logits = in[1];
  float inv = 1.0f / static_cast<float>(std::max<std::int64_t>(logits.dim(0), 1));
  id_fault_possible_.store(true, std::memory_order_relaxed);
  run("cross_entropy_backward", count(dx), mem_of(in[0]), off_of(in[0]), mem_of(logits),
      off_of(logits), mem_of(in[2]), off_of(in[2]), mem_of(in[3]), off_of(in[3]), mem_of(dx),
      off_of(dx), static_cast<cl_ulong>(logits.dim(1)), inv, id_fault_.get());
}

void OpenClBackend::layer_norm_backward(const OpCall& call) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  const Tensor& x = in[1];
  std::size_t c = static_cast<std::size_t>(x.dim(-1)), rows = c == 0 ? 0 : count(x) / c;
  run("layer_norm_backward_rows", rows, mem_of(in[0]), off_of(in[0]), mem_of(x), off_of(x),
      mem_of(in[2]), off_of(in[2]), mem_of(in[3]), off_of(in[3]), mem_of(in[4]), off_of(in[4]),
      mem_of(out[0]), off_of(out[0]), static_cast<cl_ulong>(c));
  run("layer_norm_backward_cols", c, mem_of(in[0]), off_of(in[0]), mem_of(x), off_of(x),
      mem_of(in[3]), off_of(in[3]), mem_of(in[4]), off_of(in[4]), mem_of(out[1]), off_of(out[1]),
      mem_of(out[2]), off_of(out[2]), static_cast<cl_ulong>(rows), static_cast<cl_ulong>(c));
}

// causal_attention and its backward: one work item per (batch, head, query row).
void OpenClBackend::attention(const OpCall& call) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  const bool forward = call.op == OpId::causal_attention;
  const Tensor& qkv = in[forward ? 0 : 1];
  cl_ulong b = static_cast<cl_ulong>(qkv.dim(0)), t = static_cast<cl_ulong>(qkv.dim(1));
  cl_ulong c = static_cast<cl_ulong>(qkv.dim(2) / 3), h = static_cast<cl_ulong>(call.attrs.heads);
  float scale = 1.0f / std::sqrt(static_cast<float>(c / h));
  std::size_t items = static_cast<std::size_t>(b * h * t);
  if (forward) {
    run("attention_forward", items, mem_of(qkv), off_of(qkv), mem_of(out[0]), off_of(out[0]),
        mem_of(out[1]), off_of(out[1]), t, c, h, scale);
    return;
  }
  for (const char* k : {"attention_backward_dq", "attention_backward_dkv"})
    run(k, items, mem_of(in[0]), off_of(in[0]), mem_of(qkv), off_of(qkv), mem_of(in[2]),
        off_of(in[2]), mem_of(in[3]), off_of(in[3]), mem_of(out[0]), off_of(out[0]), t, c, h,
        scale);
}

void OpenClBackend::adamw(const OpCall& call) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  const Attrs& a = call.attrs;
  auto [step_size, inv_sqrt_bc2, decay] = device_ops::adamw_scalars(a);
  run("adamw", count(out[0]), mem_of(in[0]), off_of(in[0]), mem_of(in[1]), off_of(in[1]),
      mem_of(in[2]), off_of(in[2]), mem_of(in[3]), off_of(in[3]), mem_of(out[0]), off_of(out[0]),
      mem_of(out[1]), off_of(out[1]), mem_of(out[2]), off_of(out[2]),
      static_cast<cl_float>(a.beta1), static_cast<cl_float>(a.beta2), step_size, inv_sqrt_bc2,
      decay, static_cast<cl_float>(a.eps));
}

// The native kernels, once: supports() and launch() both read this table.
// ---- fused elementwise chains ---------------------------------------------------------
namespace {

constexpr int kFusedRank = 4;  // collapsed dimensions a generated kernel walks

std::string float_literal(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%af", static_cast<double>(static_cast<float>(value)));
  return text;
}

// Each step as the unfused kernel's expression (kernels.cl; binary, unary, unary_backward).
std::string step_expression(const ElementwiseStep& s, const std::string& a, const std::string& b) {
  switch (s.op) {
    case OpId::add:
      return a + " + " + b;
    case OpId::sub:
      return a + " - " + b;
    case OpId::mul:
      return a + " * " + b;
    case OpId::div:
      return a + " / " + b;
    case OpId::scale:
      return float_literal(s.alpha) + " * " + a;
    case OpId::exp:
      return "exp(" + a + ")";
    case OpId::log:
      return "log(" + a + ")";
    case OpId::tanh:
      return "tanh(" + a + ")";
    case OpId::sqrt:
      return "sqrt(" + a + ")";
    case OpId::erf:
      return "loom_erf(" + a + ")";
    case OpId::relu:
      return a + " > 0.0f ? " + a + " : 0.0f";
    case OpId::gelu:
      return "gelu_tanh(" + a + ")";
    case OpId::relu_backward:
      return b + " > 0.0f ? " + a + " : 0.0f";
    case OpId::gelu_backward:
      return a + " * gelu_tanh_grad(" + b + ")";
    case OpId::tanh_backward:
      return a + " * (1.0f - " + b + " * " + b + ")";
    case OpId::expand:
      return a;
    default:
      break;
  }
  throw Error("opencl fused_elementwise: no expression for " + std::string(op_name(s.op)));
}

// How the chain kernel without reductions reads an input of the collapsed space, finer
// than InputAccess: a strided input that walks only the inner dimension, at unit stride (a
// bias row broadcast over the rows), reads at the column; one that does not move along the
// inner dimension reads one value per row.
enum class ChainRead : char { same = 's', scalar = 'c', inner = 'i', outer = 'o', strided = 'g' };

ChainRead chain_read(const BroadcastSpace& space, std::size_t k) {
  switch (input_access(space, k)) {
    case InputAccess::same:
      return ChainRead::same;
    case InputAccess::scalar:
      return ChainRead::scalar;
    case InputAccess::strided:
      break;
  }
  const std::vector<std::int64_t>& strides = space.strides[k];
  if (strides.back() == 0)
    return ChainRead::outer;
  for (std::size_t d = 0; d + 1 < strides.size(); ++d)
    if (strides[d] != 0)
      return ChainRead::strided;
  return strides.back() == 1 ? ChainRead::inner : ChainRead::strided;
}

// The kernel for one chain and one way of reading its inputs: a two-dimensional range,
// the collapsed space's inner dimension by its other dimensions together (rows), one
// work-item per output element. An index that depends on the row alone is the same for
// every work-item of a row, so a CPU device's compiler hoists it out of the loop over the
// columns and vectorizes that loop; a 64-bit division per element kept it scalar (3x
// slower on PoCL). `index_type` is uint where every index fits in 31 bits, else ulong.
// Each step a statement of its own, with contraction off, so no multiply and add of two
// steps become one fma that the unfused kernels would not compute.
// A chain kernel's parameters after its own: the outputs, the collapsed space's
// dimensions, then inputs `first`.. (a strided one with its four strides); and the same
// as the names a call passes on.
struct ChainParameters {
  std::string declared, passed;
};
ChainParameters chain_parameters(const ElementwiseProgram& program,
                                 const std::vector<ChainRead>& reads, std::size_t first) {
  ChainParameters p;
  auto add = [&](const std::string& type, const std::string& name) {
    p.declared += (p.declared.empty() ? "" : ", ") + type + " " + name;
    p.passed += (p.passed.empty() ? "" : ", ") + name;
  };
  for (std::size_t k = 0; k < program.output_registers().size(); ++k) {
    add("__global float*", "y" + std::to_string(k));
    add("const ulong", "y" + std::to_string(k) + "_off");
  }
  for (const char* d : {"d1", "d2", "d3"})
    add("const ulong", d);
  for (std::size_t k = first; k < reads.size(); ++k) {
    const std::string n = std::to_string(k);
    add("__global const float*", "x" + n);
    add("const ulong", "o" + n);
    if (reads[k] == ChainRead::outer || reads[k] == ChainRead::strided)
      for (int d = 0; d < 4; ++d)
        add("const ulong", "s" + n + "_" + std::to_string(d));
  }
  return p;
}

// A chain's statements at element i (its column col and row in the collapsed space):
// the row coordinates where an input needs them, inputs `first`.. read, each step, each
// output written.
std::string chain_statements(const ElementwiseProgram& program, const std::vector<ChainRead>& reads,
                             const std::string& t, std::size_t first) {
  std::string body;
  bool by_row = false;
  for (std::size_t k = first; k < reads.size(); ++k)
    by_row = by_row || reads[k] == ChainRead::outer || reads[k] == ChainRead::strided;
  if (by_row)
    body += "  const " + t + " c2 = row % (" + t + ")d2, c1 = row / (" + t + ")d2 % (" + t +
            ")d1, c0 = row / ((" + t + ")d2 * (" + t + ")d1);\n";
  for (std::size_t k = first; k < reads.size(); ++k) {
    const std::string n = std::to_string(k);
    std::string index = "i";
    const std::string s = "(" + t + ")s" + n + "_";
    if (reads[k] == ChainRead::scalar) {
      index = "0";
    } else if (reads[k] == ChainRead::inner) {
      index = "col";
    } else if (reads[k] == ChainRead::outer || reads[k] == ChainRead::strided) {
      index = "c0 * " + s + "0 + c1 * " + s + "1 + c2 * " + s + "2";
      if (reads[k] == ChainRead::strided)
        index += " + col * " + s + "3";
    }
    body += "  const float r" + n + " = x" + n + "[o" + n + " + " + index + "];\n";
  }
  const int inputs = program.num_inputs;
  for (std::size_t k = 0; k < program.steps.size(); ++k) {
    const ElementwiseStep& s = program.steps[k];
    const std::string a = "r" + std::to_string(s.args[0]);
    const std::string b = s.args[1] >= 0 ? "r" + std::to_string(s.args[1]) : "";
    body += "  const float r" + std::to_string(inputs + static_cast<int>(k)) + " = " +
            step_expression(s, a, b) + ";\n";
  }
  const std::vector<int> written = program.output_registers();
  for (std::size_t k = 0; k < written.size(); ++k)
    body += "  y" + std::to_string(k) + "[y" + std::to_string(k) + "_off + i] = r" +
            std::to_string(written[k]) + ";\n";
  return body;
}

std::string fused_source(const ElementwiseProgram& program, const std::vector<ChainRead>& reads,
                         const std::string& index_type) {
  const std::string& t = index_type;
  const std::string body =
      "  const " + t + " col = get_global_id(0), row = get_global_id(1);\n  const " + t +
      " i = row * (" + t + ")d3 + col;\n" + chain_statements(program, reads, t, 0);
  return std::string(kElementwiseSource) + "\n__kernel void fused(" +
         chain_parameters(program, reads, 0).declared + ") {\n#pragma OPENCL FP_CONTRACT OFF\n" +
         body + "}\n";
}

// The GEMM kernels (gemm.cl) with a chain on each value of the product (matmul_elementwise):
// loom_epilogue computes the chain at the product's element i, its input 0 the value
// (register r0, never stored), and the kernels' store hooks call it instead of writing C.
std::string gemm_epilogue_source(const ElementwiseProgram& program,
                                 const std::vector<ChainRead>& reads,
                                 const std::string& index_type) {
  const std::string& t = index_type;
  const ChainParameters p = chain_parameters(program, reads, 1);
  std::string source =
      std::string(kElementwiseSource) + "\nvoid loom_epilogue(const " + t + " i, const float r0, " +
      p.declared + ") {\n#pragma OPENCL FP_CONTRACT OFF\n  const " + t + " col = i % (" + t +
      ")d3, row = i / (" + t + ")d3;\n" + chain_statements(program, reads, t, 1) + "}\n";
  source += "#define LOOM_GEMM_EXTRA_ARGS , " + p.declared + "\n";
  source += "#define LOOM_GEMM_STORE(index, col, value) loom_epilogue((" + t +
            ")(c_off + (index)), (value), " + p.passed + ")\n";
  source += "#define LOOM_GEMM_STORE8(index, col, value) do { const float8 v_ = (value); const " +
            t + " e_ = (" + t + ")(c_off + (index));";
  for (int lane = 0; lane < 8; ++lane)
    source += " loom_epilogue(e_ + " + std::to_string(lane) + ", v_.s" + std::to_string(lane) +
              ", " + p.passed + ");";
  source += " } while (0)\n";
  return source + kGemmSource;
}

// A program with row reductions: one work-item per row. Row values are computed once;
// each reduction is a loop over the row that computes the full steps before it and adds
// its operand in index order in a float, as reduce_rows adds a row; a last loop computes
// every full step and writes the full outputs.
//
// `aligned`: the collapsed space's inner dimension is the row (its length is cols), so an
// element's outer coordinates are the row's, computed once per work-item, and its inner
// one is the column: no division per element. Else each element's coordinates are
// computed from its index, in `index_type` (uint where every index fits in 31 bits).
std::string fused_rows_source(const ElementwiseProgram& program,
                              const std::vector<InputAccess>& access, const std::vector<bool>& row,
                              bool aligned, const std::string& index_type) {
  const std::string& t = index_type;
  const std::vector<int> written = program.output_registers();
  const int inputs = program.num_inputs;
  const int steps = static_cast<int>(program.steps.size());
  std::string args;
  for (std::size_t k = 0; k < written.size(); ++k)
    args +=
        "__global float* y" + std::to_string(k) + ", const ulong y" + std::to_string(k) + "_off, ";
  args += "const ulong d1, const ulong d2, const ulong d3, const ulong cols, const float inv_cols";
  bool strided = false;
  for (std::size_t k = 0; k < access.size(); ++k) {
    const std::string n = std::to_string(k);
    args += ", __global const float* x" + n + ", const ulong o" + n;
    if (access[k] == InputAccess::strided) {
      args += ", const ulong s" + n + "_0, const ulong s" + n + "_1, const ulong s" + n +
              "_2, const ulong s" + n + "_3";
      strided = true;
    }
  }
  auto read_input = [&](std::size_t k, const std::string& indent) {
    const std::string n = std::to_string(k);
    std::string index = "i";
    if (access[k] == InputAccess::scalar)
      index = "0";
    else if (access[k] == InputAccess::strided)
      index = "c0 * (" + t + ")s" + n + "_0 + c1 * (" + t + ")s" + n + "_1 + c2 * (" + t + ")s" +
              n + "_2 + c3 * (" + t + ")s" + n + "_3";
    return indent + "const float r" + n + " = x" + n + "[o" + n + " + " + index + "];\n";
  };
  auto coords = [&](const std::string& indent, const std::string& column) {
    if (!strided)
      return std::string();
    if (aligned)
      return indent + "const " + t + " c3 = " + column + ";\n";
    return indent + "const " + t + " c3 = i % (" + t + ")d3, c2 = i / (" + t + ")d3 % (" + t +
           ")d2, c1 = i / ((" + t + ")d3 * (" + t + ")d2) % (" + t + ")d1, c0 = i / ((" + t +
           ")d3 * (" + t + ")d2 * (" + t + ")d1);\n";
  };
  auto step_line = [&](int k, const std::string& indent) {
    const ElementwiseStep& s = program.steps[k];
    const std::string a = "r" + std::to_string(s.args[0]);
    const std::string b = s.args[1] >= 0 ? "r" + std::to_string(s.args[1]) : "";
    return indent + "const float r" + std::to_string(inputs + k) + " = " +
           step_expression(s, a, b) + ";\n";
  };
  // Row inputs: read once, at the row's first element.
  std::string body = "  const " + t + " r_row = get_global_id(0);\n";
  if (strided && aligned)
    body += "  const " + t + " c2 = r_row % (" + t + ")d2, c1 = r_row / (" + t + ")d2 % (" + t +
            ")d1, c0 = r_row / ((" + t + ")d2 * (" + t + ")d1);\n";
  for (std::size_t k = 0; k < access.size(); ++k)
    if (row[k])
      body += "  float r" + std::to_string(k) + ";\n";
  body += "  {\n    const " + t + " i = r_row * (" + t + ")cols;\n" + coords("    ", "0");
  for (std::size_t k = 0; k < access.size(); ++k)
    if (row[k]) {
      std::string line = read_input(k, "    ");
      body += line.replace(line.find("const float "), 12, "");
    }
  body += "  }\n";
  int next_row_step = 0;
  for (int phase = 0; phase <= steps; ++phase) {
    const bool last = phase == steps;
    if (!last && !row_reduction(program.steps[phase].op))
      continue;
    for (; next_row_step < phase; ++next_row_step)
      if (row[inputs + next_row_step] && !row_reduction(program.steps[next_row_step].op))
        body += step_line(next_row_step, "  ");
    const std::string acc = "acc" + std::to_string(phase);
    if (!last)
      body += "  float " + acc + " = 0.0f;\n";
    body += "  for (" + t + " j = 0; j < (" + t + ")cols; ++j) {\n    const " + t +
            " i = r_row * (" + t + ")cols + j;\n" + coords("    ", "j");
    for (std::size_t k = 0; k < access.size(); ++k)
      if (!row[k])
        body += read_input(k, "    ");
    for (int k = 0; k < phase; ++k)
      if (!row[inputs + k])
        body += step_line(k, "    ");
    if (!last) {
      body += "    " + acc + " = " + acc + " + r" + std::to_string(program.steps[phase].args[0]) +
              ";\n";
    } else {
      for (std::size_t k = 0; k < written.size(); ++k)
        if (!row[written[k]])
          body += "    y" + std::to_string(k) + "[y" + std::to_string(k) + "_off + i] = r" +
                  std::to_string(written[k]) + ";\n";
    }
    body += "  }\n";
    if (!last)  // reduce_rows scales by 1; a mean's 1/cols as the scale kernel multiplies
      body += "  const float r" + std::to_string(inputs + phase) + " = " +
              (program.steps[phase].op == OpId::mean ? "inv_cols * " + acc : acc + " * 1.0f") +
              ";\n";
  }
  for (std::size_t k = 0; k < written.size(); ++k)
    if (row[written[k]])
      body += "  y" + std::to_string(k) + "[y" + std::to_string(k) + "_off + r_row] = r" +
              std::to_string(written[k]) + ";\n";
  return std::string(kElementwiseSource) + "\n__kernel void fused(" + args +
         ") {\n#pragma OPENCL FP_CONTRACT OFF\n" + body + "}\n";
}

// A chain whose collapsed index space has at most kFusedRank dimensions (asked without
// tensors, as the graph's fusion pass does, it accepts: any f32 chain may be fused).
bool fused_rank_fits(const OpCall& call) {
  return call.inputs.empty() || collapse_broadcast(call.attrs.shape, call.inputs).dims.size() <=
                                    static_cast<std::size_t>(kFusedRank);
}

}  // namespace

bool OpenClBackend::narrow_index(const BroadcastSpace& space, std::size_t elements) const {
  constexpr auto kLimit = static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max());
  bool narrow = fused_index_ == FusedIndex::narrowest && elements <= kLimit;
  for (const std::vector<std::int64_t>& strides : space.strides) {
    std::uint64_t last = 0;  // the largest index the input is read at
    for (std::size_t d = 0; d < space.dims.size(); ++d)
      last +=
          static_cast<std::uint64_t>(space.dims[d] - 1) * static_cast<std::uint64_t>(strides[d]);
    narrow = narrow && last <= kLimit;
  }
  return narrow;
}

namespace {
// The collapsed space's dimensions padded at the front to the kFusedRank a chain kernel
// walks; more is an error naming `op`.
std::vector<cl_ulong> padded_dims(const BroadcastSpace& space, const char* op) {
  check(space.dims.size() <= static_cast<std::size_t>(kFusedRank), [&] {
    return "opencl " + std::string(op) + ": " + std::to_string(space.dims.size()) +
           " dimensions after merging, the kernel walks " + std::to_string(kFusedRank);
  });
  const std::size_t pad = kFusedRank - space.dims.size();
  std::vector<cl_ulong> dims(kFusedRank, 1);
  for (std::size_t d = 0; d < space.dims.size(); ++d)
    dims[pad + d] = static_cast<cl_ulong>(space.dims[d]);
  return dims;
}

// A chain kernel's arguments for input k of `space`: its buffer and offset, then its four
// strides (padded at the front) when the kernel reads it through them.
void set_chain_input(cl_kernel kernel, cl_uint& arg, const Tensor& input,
                     const BroadcastSpace& space, std::size_t k, bool takes_strides) {
  set_arg(kernel, arg++, mem_of(input));
  set_arg(kernel, arg++, off_of(input));
  if (!takes_strides)
    return;
  const std::size_t pad = kFusedRank - space.dims.size();
  std::vector<cl_ulong> strides(kFusedRank, 0);
  for (std::size_t d = 0; d < space.dims.size(); ++d)
    strides[pad + d] = static_cast<cl_ulong>(space.strides[k][d]);
  for (cl_ulong stride : strides)
    set_arg(kernel, arg++, stride);
}
}  // namespace

void OpenClBackend::matmul_elementwise(const OpCall& call) {
  const ElementwiseProgram& program = *call.attrs.program;
  Tensor& y = call.outputs[0];
  if (y.numel() == 0)
    return;
  // The chain's input 0 is the product, laid out as the outputs are: the first output
  // stands in for it where the chain's space is worked out.
  std::vector<Tensor> chain_inputs{y};
  chain_inputs.insert(chain_inputs.end(), call.inputs.begin() + 2, call.inputs.end());
  if (!uses_gemm_nt(call.inputs[0], call.inputs[1], y)) {
    // CLBlast's product, then the chain: the bits of matmul then fused_elementwise.
    gemm_calls_[static_cast<std::size_t>(Gemm::clblast)].fetch_add(1, std::memory_order_relaxed);
    Tensor products[] = {Tensor::empty(call.attrs.shape, DType::f32, *this)};
    matmul_clblast(OpCall{OpId::matmul, call.inputs.first(2), products, call.attrs});
    chain_inputs[0] = products[0];
    fused(OpCall{OpId::fused_elementwise, chain_inputs, call.outputs, call.attrs});
    return;
  }
  const BroadcastSpace space = collapse_broadcast(call.attrs.shape, chain_inputs);
  const std::vector<cl_ulong> dims = padded_dims(space, "matmul_elementwise");
  std::vector<ChainRead> reads;
  std::string key;
  for (std::size_t k = 0; k < chain_inputs.size(); ++k) {
    reads.push_back(chain_read(space, k));
    key += static_cast<char>(reads.back());
  }
  const bool narrow = narrow_index(space, count(y));
  const std::string index_type = narrow ? "uint" : "ulong";
  key += index_type;
  const std::array<cl_kernel, 3>* kernels = nullptr;
  {
    std::lock_guard lock(mutex_);
    auto known = epilogue_by_program_.find({&program, key});
    if (known == epilogue_by_program_.end()) {
      const std::string source = gemm_epilogue_source(program, reads, index_type);
      auto found = epilogue_kernels_.find(source);
      if (found == epilogue_kernels_.end()) {
        EpilogueKernels made{compile(source, "a GEMM with a chain (" + program.describe() + ")"),
                             Kernel(), Kernel(), Kernel()};
        Kernel* slots[] = {&made.nn, &made.tn, &made.nt};
        const char* names[] = {"gemm_nn", "gemm_tn", "gemm_nt"};
        for (int i = 0; i < 3; ++i) {
          cl_int err = CL_SUCCESS;
          *slots[i] = Kernel(clCreateKernel(made.program.get(), names[i], &err));
          ok(err, std::string("clCreateKernel ") + names[i]);
        }
        found = epilogue_kernels_.emplace(source, std::move(made)).first;
      }
      const EpilogueKernels& made = found->second;
      const std::array<cl_kernel, 3> three{made.nn.get(), made.tn.get(), made.nt.get()};
      known = epilogue_by_program_
                  .emplace(std::make_pair(&program, key), std::make_pair(call.attrs.program, three))
                  .first;
    }
    kernels = &known->second.second;
  }
  auto set_args = [&](cl_kernel k, cl_uint arg) {
    for (const Tensor& out : call.outputs) {
      set_arg(k, arg++, mem_of(out));
      set_arg(k, arg++, off_of(out));
    }
    for (int d = 1; d < kFusedRank; ++d)
      set_arg(k, arg++, dims[d]);
    for (std::size_t i = 1; i < chain_inputs.size(); ++i)
      set_chain_input(k, arg, chain_inputs[i], space, i,
                      reads[i] == ChainRead::outer || reads[i] == ChainRead::strided);
  };
  gemm_calls_[static_cast<std::size_t>(Gemm::gemm_nt)].fetch_add(1, std::memory_order_relaxed);
  fused_calls_[narrow ? 0 : 1].fetch_add(1, std::memory_order_relaxed);
  matmul_dot(OpCall{OpId::matmul, call.inputs.first(2), call.outputs.first(1), call.attrs},
             GemmTail{nullptr, kernels, set_args});
}

void OpenClBackend::fused(const OpCall& call) {
  const ElementwiseProgram& program = *call.attrs.program;
  Tensor& y = call.outputs[0];
  const BroadcastSpace space = collapse_broadcast(call.attrs.shape, call.inputs);
  const std::vector<cl_ulong> dims = padded_dims(space, "fused_elementwise");
  // With row reductions: one work-item per row of the program's shape. Without: the
  // collapsed space's inner dimension by its rows (fused_source).
  const bool rows = program.reduces();
  std::vector<InputAccess> access;  // the kernel with row reductions
  std::vector<ChainRead> reads;     // the kernel without
  std::string access_key;
  for (std::size_t k = 0; k < call.inputs.size(); ++k) {
    access.push_back(input_access(space, k));
    reads.push_back(chain_read(space, k));
    access_key += rows ? static_cast<char>('0' + static_cast<int>(access.back()))
                       : static_cast<char>(reads.back());
  }
  const bool narrow = narrow_index(space, count(y));
  const std::string index_type = narrow ? "uint" : "ulong";
  const std::int64_t cols = call.attrs.shape.empty() ? 1 : call.attrs.shape.back();
  const bool aligned = rows && static_cast<std::int64_t>(dims[kFusedRank - 1]) == cols;
  access_key += index_type + (aligned ? "a" : "");
  std::vector<bool> row;
  if (rows) {
    std::vector<Shape> shapes;
    for (const Tensor& x : call.inputs)
      shapes.push_back(x.shape());
    row = row_registers(program, shapes, call.attrs.shape);
  }
  const std::size_t row_count =
      cols == 0 ? 0 : static_cast<std::size_t>(shape_numel(call.attrs.shape) / cols);
  const std::size_t global[2] = {rows ? row_count : static_cast<std::size_t>(dims[kFusedRank - 1]),
                                 rows ? 1 : static_cast<std::size_t>(dims[0] * dims[1] * dims[2])};
  if (count(y) == 0 || global[0] == 0)
    return;
  std::lock_guard lock(mutex_);
  // A replayed node passes the same program each step: find its kernel by the program's
  // address (the entry keeps the program alive, so the address is never reused) before
  // generating any source; the source keys the built kernels, shared by equal chains.
  auto known = fused_by_program_.find({&program, access_key});
  if (known == fused_by_program_.end()) {
    const std::string source = rows ? fused_rows_source(program, access, row, aligned, index_type)
                                    : fused_source(program, reads, index_type);
    auto found = fused_kernels_.find(source);
    if (found == fused_kernels_.end()) {
      Program built = compile(source, "a fused kernel (" + program.describe() + ")");
      cl_int err = CL_SUCCESS;
      Kernel kernel(clCreateKernel(built.get(), "fused", &err));
      ok(err, "clCreateKernel fused");
      found =
          fused_kernels_.emplace(source, FusedKernel{std::move(built), std::move(kernel)}).first;
    }
    known = fused_by_program_
                .emplace(std::make_pair(&program, access_key),
                         std::make_pair(call.attrs.program, found->second.kernel.get()))
                .first;
  }
  cl_kernel k = known->second.second;
  cl_uint arg = 0;
  for (const Tensor& out : call.outputs) {
    set_arg(k, arg++, mem_of(out));
    set_arg(k, arg++, off_of(out));
  }
  for (int d = 1; d < kFusedRank; ++d)
    set_arg(k, arg++, dims[d]);
  if (rows) {
    set_arg(k, arg++, static_cast<cl_ulong>(cols));
    set_arg(k, arg++, static_cast<cl_float>(1.0 / static_cast<double>(cols)));
  }
  for (std::size_t i = 0; i < call.inputs.size(); ++i)
    set_chain_input(k, arg, call.inputs[i], space, i,
                    rows ? access[i] == InputAccess::strided
                         : reads[i] == ChainRead::outer || reads[i] == ChainRead::strided);
  ok(clEnqueueNDRangeKernel(current_queue(), k, rows ? 1 : 2, nullptr, global, nullptr, 0, nullptr,
                            nullptr),
     "clEnqueueNDRangeKernel fused");
  fused_calls_[narrow ? 0 : 1].fetch_add(1, std::memory_order_relaxed);
}

const KernelTable<OpenClBackend>& OpenClBackend::kernels() {
  using B = OpenClBackend;
  using device_ops::UnaryBackwardKernel;
  using device_ops::UnaryKernel;
  constexpr auto f32 = device_ops::f32_except_ids;
  static const KernelTable<B> table(
      "opencl", {
                    {OpId::fill, device_ops::f32_fill, &B::fill},
                    {OpId::copy, f32_copy, &B::copy},
                    {OpId::expand, f32_expand, &B::expand},
                    {OpId::add, device_ops::f32_binary_one_kernel, &B::binary},
                    {OpId::sub, device_ops::f32_binary_one_kernel, &B::binary},
                    {OpId::mul, device_ops::f32_binary_one_kernel, &B::binary},
                    {OpId::div, device_ops::f32_binary_one_kernel, &B::binary},
                    {OpId::exp, f32, &B::unary<UnaryKernel::exp>},
                    {OpId::log, f32, &B::unary<UnaryKernel::log>},
                    {OpId::tanh, f32, &B::unary<UnaryKernel::tanh>},
                    {OpId::relu, f32, &B::unary<UnaryKernel::relu>},
                    {OpId::gelu, f32, &B::unary<UnaryKernel::gelu>},
                    {OpId::scale, f32, &B::unary<UnaryKernel::scale>},
                    {OpId::sqrt, f32, &B::unary<UnaryKernel::sqrt>},
                    {OpId::erf, f32, &B::unary<UnaryKernel::erf>},
                    {OpId::math, f32, &B::math},
                    {OpId::relu_backward, f32, &B::unary_backward<UnaryBackwardKernel::relu>},
                    {OpId::gelu_backward, f32, &B::unary_backward<UnaryBackwardKernel::gelu>},
                    {OpId::tanh_backward, f32, &B::unary_backward<UnaryBackwardKernel::tanh>},
                    {OpId::sum, device_ops::f32_sum_rows_or_cols, &B::reduce},
                    {OpId::max, device_ops::f32_max_last_axis, &B::reduce},
                    {OpId::matmul, f32, &B::matmul},
                    {OpId::linear, f32_linear, &B::linear},
                    {OpId::matmul_elementwise, f32_cheap_epilogue, &B::matmul_elementwise},
                    {OpId::slice_backward, f32, &B::slice_backward},
                    {OpId::sum_squares, f32, &B::sum_squares},
                    {OpId::embedding, f32, &B::embedding},
                    {OpId::embedding_backward, f32, &B::embedding_backward},
                    {OpId::embedding_backward_add, f32, &B::embedding_backward},
                    {OpId::cross_entropy, f32, &B::cross_entropy},
                    {OpId::cross_entropy_backward, f32, &B::cross_entropy_backward},
                    {OpId::layer_norm_backward, f32, &B::layer_norm_backward},
                    {OpId::causal_attention, f32_attention, &B::attention},
                    {OpId::causal_attention_backward, f32_attention, &B::attention},
                    {OpId::adamw_step, f32, &B::adamw},
                    {OpId::fused_elementwise, fused_rank_fits, &B::fused},
                });
  return table;
}

bool OpenClBackend::supports(const OpCall& call) const {
  return kernels().supports(call);
}

void OpenClBackend::launch(const OpCall& call, Stream& stream) {
  auto* target = dynamic_cast<OpenClStream*>(&stream);
  check(target != nullptr, "opencl: launch on a stream another backend made");
  // Its kernels, GEMMs and the reads a launcher makes (checked ids) go to the stream's queue.
  device_ops::LaunchTarget<cl_command_queue>::Scope scope(launch_target_, target->queue());
  kernels().launch(*this, call);
}

cl_command_queue OpenClBackend::queue_of(Stream& stream) {
  auto* ours = dynamic_cast<OpenClStream*>(&stream);
  check(ours != nullptr, "opencl: a stream another backend made has no command queue here");
  return ours->queue();
}

cl_command_queue OpenClBackend::current_queue() const {
  return launch_target_.current(queue_.get());
}

OpenClBackend* backend() {
  static std::unique_ptr<OpenClBackend> instance = OpenClBackend::open();
  return instance.get();
}

}  // namespace loom::opencl
