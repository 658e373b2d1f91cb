// backends/opencl/opencl_runtime.cpp — the OpenCL runtime: the platform and device, the
// context and its queues (streams and timeline markers), memory, compiling the kernels,
// and launching an op on a stream.
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
#include "backends/opencl/opencl_backend_internal.h"
#include "core/broadcast.h"
#include "core/error.h"
#include "core/fused_elementwise.h"

namespace loom::opencl {

using namespace detail;
namespace {

std::string device_string(cl_device_id d, cl_device_info what) {
  std::size_t size = 0;
  clGetDeviceInfo(d, what, 0, nullptr, &size);
  std::string s(size, '\0');
  clGetDeviceInfo(d, what, size, s.data(), nullptr);
  while (!s.empty() && s.back() == '\0')
    s.pop_back();
  return s;
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
                           "place_columns",
                           "top_k_rows",
                           "top_k_scatter",
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
                           "rms_norm_rows",
                           "rms_norm_backward_rows",
                           "rms_norm_backward_cols",
                           "rope",
                           "silu",
                           "silu_backward",
                           "swiglu",
                           "swiglu_backward",
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
