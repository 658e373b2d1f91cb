#include "backends/opencl/opencl_backend.h"

#include <clblast.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "backends/device_ops.h"
#include "backends/opencl/kernels.cl.h"
#include "core/broadcast.h"
#include "core/error.h"

namespace loom::opencl {
namespace {

void ok(cl_int status, const std::string& what) {
  check(status == CL_SUCCESS, "opencl: " + what + " failed with error " + std::to_string(status));
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

class OpenClStream final : public device_ops::DeviceStream {
 public:
  OpenClStream(OpenClBackend& backend, cl_context context, cl_device_id device)
      : DeviceStream(backend), backend_(backend) {
    cl_int err = CL_SUCCESS;
    queue_ = Queue(clCreateCommandQueue(context, device, 0, &err));
    ok(err, "clCreateCommandQueue");
  }
  // Uses the backend's queue.
  explicit OpenClStream(OpenClBackend& backend) : DeviceStream(backend), backend_(backend) {}
  cl_command_queue queue() const { return queue_.get() ? queue_.get() : backend_.queue(); }
  void synchronize() override { ok(clFinish(queue()), "clFinish"); }

 protected:
  void device_copy(const Buffer& src, std::size_t src_offset, Buffer& dst, std::size_t dst_offset,
                   std::size_t bytes) override {
    ok(clEnqueueCopyBuffer(queue(), static_cast<cl_mem>(src.data()),
                           static_cast<cl_mem>(dst.data()), src_offset, dst_offset, bytes, 0,
                           nullptr, nullptr),
       "clEnqueueCopyBuffer");
  }

 private:
  OpenClBackend& backend_;
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
  stream_ = std::make_unique<OpenClStream>(*this);
  build_program();
}

void OpenClBackend::build_program() {
  // Binaries are cached on disk keyed by device, driver and source, so the JIT runs once.
  std::size_t key =
      std::hash<std::string>{}(device_name_ + "|" + driver_version_ + "|" + kKernelSource);
  const char* home = std::getenv("HOME");
  std::filesystem::path dir =
      std::filesystem::path(home ? home : "/tmp") / ".cache" / "loom" / "opencl";
  std::filesystem::path cached = dir / (std::to_string(key) + ".bin");
  cl_int err = CL_SUCCESS;
  bool from_binary = false;
  if (std::ifstream in{cached, std::ios::binary}) {
    std::string binary((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto* data = reinterpret_cast<const unsigned char*>(binary.data());
    std::size_t size = binary.size();
    cl_int binary_status = CL_SUCCESS;
    cl_program p =
        clCreateProgramWithBinary(context_.get(), 1, &device_, &size, &data, &binary_status, &err);
    if (err == CL_SUCCESS && binary_status == CL_SUCCESS &&
        clBuildProgram(p, 1, &device_, "", nullptr, nullptr) == CL_SUCCESS) {
      program_ = Program(p);
      from_binary = true;
    } else if (p != nullptr) {
      clReleaseProgram(p);
    }
  }
  if (!from_binary) {
    const char* source = kKernelSource;
    program_ = Program(clCreateProgramWithSource(context_.get(), 1, &source, nullptr, &err));
    ok(err, "clCreateProgramWithSource");
    if (clBuildProgram(program_.get(), 1, &device_, "-cl-std=CL1.2", nullptr, nullptr) !=
        CL_SUCCESS) {
      std::size_t size = 0;
      clGetProgramBuildInfo(program_.get(), device_, CL_PROGRAM_BUILD_LOG, 0, nullptr, &size);
      std::string log(size, '\0');
      clGetProgramBuildInfo(program_.get(), device_, CL_PROGRAM_BUILD_LOG, size, log.data(),
                            nullptr);
      throw Error("opencl: building the kernels for " + device_name_ + " failed:\n" + log);
    }
    std::size_t size = 0;
    if (clGetProgramInfo(program_.get(), CL_PROGRAM_BINARY_SIZES, sizeof size, &size, nullptr) ==
            CL_SUCCESS &&
        size > 0) {
      std::string binary(size, '\0');
      unsigned char* ptr = reinterpret_cast<unsigned char*>(binary.data());
      if (clGetProgramInfo(program_.get(), CL_PROGRAM_BINARIES, sizeof ptr, &ptr, nullptr) ==
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
  }
  for (const char* name :
       {"fill", "binary", "unary", "unary_backward", "reduce_rows", "sum_cols", "adamw",
        "copy_strided", "slice_backward", "sum_squares_partial", "embedding", "embedding_backward",
        "cross_entropy_rows", "cross_entropy_backward", "layer_norm_backward_rows",
        "layer_norm_backward_cols", "attention_forward", "attention_backward_dq",
        "attention_backward_dkv"}) {
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
  ok(clEnqueueNDRangeKernel(queue_.get(), k, 1, nullptr, &global, nullptr, 0, nullptr, nullptr),
     std::string("clEnqueueNDRangeKernel ") + name);
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

Buffer OpenClBackend::allocate(std::size_t bytes, MemoryKind) {
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

void OpenClBackend::upload(const void* host, Buffer& dst, std::size_t dst_offset,
                           std::size_t bytes) {
  if (bytes == 0)
    return;
  ok(clEnqueueWriteBuffer(queue_.get(), static_cast<cl_mem>(dst.data()), CL_TRUE, dst_offset, bytes,
                          host, 0, nullptr, nullptr),
     "clEnqueueWriteBuffer");
}

void OpenClBackend::download(const Buffer& src, std::size_t src_offset, void* host,
                             std::size_t bytes) {
  if (bytes == 0)
    return;
  ok(clEnqueueReadBuffer(queue_.get(), static_cast<cl_mem>(src.data()), CL_TRUE, src_offset, bytes,
                         host, 0, nullptr, nullptr),
     "clEnqueueReadBuffer");
}

bool OpenClBackend::supports(const OpCall& call) const {
  if (!device_ops::f32_except_ids(call))
    return false;
  switch (call.op) {
    case OpId::copy:
      return call.inputs[0].rank() <= 6;
    case OpId::expand:  // a strided copy whose broadcast dimensions have stride 0
      return call.attrs.shape.size() <= 6;
    case OpId::slice_backward:
    case OpId::sum_squares:
    case OpId::embedding:
    case OpId::embedding_backward:
    case OpId::cross_entropy:
    case OpId::cross_entropy_backward:
    case OpId::layer_norm_backward:
      return true;
    case OpId::causal_attention:
    case OpId::causal_attention_backward: {
      const Tensor& qkv = call.inputs[call.op == OpId::causal_attention ? 0 : 1];
      return qkv.dim(2) / 3 / std::max<std::int64_t>(call.attrs.heads, 1) <= 256;  // LOOM_MAX_HEAD
    }
    case OpId::fill:
      return call.attrs.dtype == DType::f32;
    case OpId::add:
    case OpId::sub:
    case OpId::mul:
    case OpId::div:
      return device_ops::plan_binary(call.op, call.inputs[0].shape(), call.inputs[1].shape())
          .has_value();
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
    case OpId::adamw_step:
      return true;
    case OpId::sum:
      return classify_reduction(call.inputs[0], call.attrs.axes) != ReduceShape::unsupported;
    case OpId::max:
      return call.inputs[0].rank() >= 1 && normalize_axis(call.attrs.axis, call.inputs[0].rank(),
                                                          "max") == call.inputs[0].rank() - 1;
    default:
      return false;
  }
}

void OpenClBackend::matmul(const OpCall& call) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  Tensor& c = call.outputs[0];
  bool ta = call.attrs.trans_a, tb = call.attrs.trans_b;
  std::size_t m = c.dim(-2), n = c.dim(-1), k = ta ? a.dim(-2) : a.dim(-1);
  std::size_t lda = a.dim(-1), ldb = b.dim(-1);
  auto gemm = [&](std::size_t rows, std::size_t a_off, std::size_t b_off, std::size_t c_off) {
    cl_command_queue q = queue_.get();
    auto status = clblast::Gemm<float>(
        clblast::Layout::kRowMajor, ta ? clblast::Transpose::kYes : clblast::Transpose::kNo,
        tb ? clblast::Transpose::kYes : clblast::Transpose::kNo, rows, n, k, 1.0f, mem_of(a),
        off_of(a) + a_off, lda, mem_of(b), off_of(b) + b_off, ldb, 0.0f, mem_of(c),
        off_of(c) + c_off, n, &q, nullptr);
    check(status == clblast::StatusCode::kSuccess,
          "opencl: CLBlast Gemm failed with status " + std::to_string(static_cast<int>(status)));
  };
  if (b.rank() == 2 && !ta) {  // fold the batch into M
    gemm(c.numel() / std::max<std::size_t>(n, 1), 0, 0, 0);
    return;
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> offsets =
      matmul_batch_offsets(a.shape(), b.shape(), c.shape());
  for (std::size_t i = 0; i < offsets.size(); ++i)
    gemm(m, static_cast<std::size_t>(offsets[i].first), static_cast<std::size_t>(offsets[i].second),
         i * m * n);
}

void OpenClBackend::launch(const OpCall& call, Stream&) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  auto n = [](const Tensor& t) { return static_cast<std::size_t>(t.numel()); };
  switch (call.op) {
    case OpId::fill:
      run("fill", n(out[0]), mem_of(out[0]), off_of(out[0]),
          static_cast<cl_float>(call.attrs.alpha));
      return;
    case OpId::add:
    case OpId::sub:
    case OpId::mul:
    case OpId::div: {
      device_ops::BinaryPlan plan = *device_ops::plan_binary(call.op, in[0].shape(), in[1].shape());
      const Tensor& full = plan.other_left ? in[1] : in[0];
      const Tensor& other = plan.other_left ? in[0] : in[1];
      run("binary", n(out[0]), static_cast<cl_int>(plan.op), mem_of(full), off_of(full),
          mem_of(other), off_of(other), mem_of(out[0]), off_of(out[0]),
          static_cast<cl_int>(plan.mode), static_cast<cl_ulong>(plan.period),
          static_cast<cl_int>(plan.other_left));
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
      cl_int op = device_ops::unary_code(call.op);
      run("unary", n(out[0]), op, mem_of(in[0]), off_of(in[0]), mem_of(out[0]), off_of(out[0]),
          static_cast<cl_float>(call.attrs.alpha));
      return;
    }
    case OpId::relu_backward:
    case OpId::gelu_backward:
    case OpId::tanh_backward: {
      cl_int op = device_ops::unary_backward_code(call.op);
      run("unary_backward", n(out[0]), op, mem_of(in[0]), off_of(in[0]), mem_of(in[1]),
          off_of(in[1]), mem_of(out[0]), off_of(out[0]));
      return;
    }
    case OpId::sum:
    case OpId::max: {
      const Tensor& x = in[0];
      std::vector<std::int64_t> axes =
          call.op == OpId::max ? std::vector<std::int64_t>{call.attrs.axis} : call.attrs.axes;
      std::size_t rows = 1;
      ReduceShape shape = classify_reduction(x, axes);
      if (shape == ReduceShape::rows) {
        std::size_t cols = 1;
        std::vector<bool> reduce(x.rank(), axes.empty());
        for (auto a : axes)
          reduce[normalize_axis(a, x.rank(), "sum")] = true;
        for (int d = 0; d < x.rank(); ++d)
          (reduce[d] ? cols : rows) *= x.shape()[d];
        run("reduce_rows", rows, static_cast<cl_int>(call.op == OpId::max), mem_of(x), off_of(x),
            mem_of(out[0]), off_of(out[0]), static_cast<cl_ulong>(cols), 1.0f);
      } else {
        std::size_t cols = n(out[0]);
        rows = n(x) / std::max<std::size_t>(cols, 1);
        run("sum_cols", cols, mem_of(x), off_of(x), mem_of(out[0]), off_of(out[0]),
            static_cast<cl_ulong>(rows), static_cast<cl_ulong>(cols), 1.0f);
      }
      return;
    }
    case OpId::matmul:
      matmul(call);
      return;
    case OpId::copy: {
      const Tensor& x = in[0];
      cl_ulong shape[6] = {1, 1, 1, 1, 1, 1}, stride[6] = {0, 0, 0, 0, 0, 0};
      for (int d = 0; d < x.rank(); ++d) {
        shape[d] = static_cast<cl_ulong>(x.shape()[d]);
        stride[d] = static_cast<cl_ulong>(x.strides()[d]);
      }
      run("copy_strided", n(out[0]), mem_of(x), off_of(x), mem_of(out[0]), off_of(out[0]),
          static_cast<cl_int>(x.rank()), shape[0], shape[1], shape[2], shape[3], shape[4], shape[5],
          stride[0], stride[1], stride[2], stride[3], stride[4], stride[5]);
      return;
    }
    case OpId::expand: {
      // Right-aligned broadcasting: a size-1 or missing dimension of x repeats (stride 0).
      const Tensor& x = in[0];
      const Shape& target = out[0].shape();
      const int rank = static_cast<int>(target.size()), lead = rank - x.rank();
      cl_ulong shape[6] = {1, 1, 1, 1, 1, 1}, stride[6] = {0, 0, 0, 0, 0, 0};
      for (int d = 0; d < rank; ++d) {
        shape[d] = static_cast<cl_ulong>(target[static_cast<std::size_t>(d)]);
        const int xd = d - lead;
        stride[d] = xd < 0 || x.shape()[static_cast<std::size_t>(xd)] == 1
                        ? 0
                        : static_cast<cl_ulong>(x.strides()[static_cast<std::size_t>(xd)]);
      }
      run("copy_strided", n(out[0]), mem_of(x), off_of(x), mem_of(out[0]), off_of(out[0]),
          static_cast<cl_int>(rank), shape[0], shape[1], shape[2], shape[3], shape[4], shape[5],
          stride[0], stride[1], stride[2], stride[3], stride[4], stride[5]);
      return;
    }
    case OpId::slice_backward: {
      const Tensor& dx = out[0];
      int axis = normalize_axis(call.attrs.axis, dx.rank(), "slice_backward");
      cl_ulong inner = 1;
      for (int d = axis + 1; d < dx.rank(); ++d)
        inner *= static_cast<cl_ulong>(dx.shape()[d]);
      run("slice_backward", n(dx), mem_of(in[0]), off_of(in[0]), mem_of(dx), off_of(dx),
          static_cast<cl_ulong>(dx.shape()[axis]), static_cast<cl_ulong>(in[0].shape()[axis]),
          inner, static_cast<cl_ulong>(call.attrs.start));
      return;
    }
    case OpId::sum_squares: {
      std::size_t total = n(in[0]),
                  chunks = std::max<std::size_t>(1, std::min<std::size_t>(1024, total));
      std::size_t chunk = (total + chunks - 1) / chunks;
      Tensor partial = Tensor::empty({static_cast<std::int64_t>(chunks)}, DType::f32, *this);
      run("sum_squares_partial", chunks, mem_of(in[0]), off_of(in[0]), static_cast<cl_ulong>(total),
          static_cast<cl_ulong>(chunk), mem_of(partial));
      run("reduce_rows", 1, cl_int{0}, mem_of(partial), cl_ulong{0}, mem_of(out[0]), off_of(out[0]),
          static_cast<cl_ulong>(chunks), 1.0f);
      return;
    }
    case OpId::embedding: {
      device_ops::checked_ids(in[1], in[0].dim(0), "embedding");
      run("embedding", n(out[0]), mem_of(in[0]), off_of(in[0]), mem_of(in[1]), off_of(in[1]),
          mem_of(out[0]), off_of(out[0]), static_cast<cl_ulong>(in[0].dim(1)));
      return;
    }
    case OpId::embedding_backward: {
      const Tensor& dw = out[0];
      device_ops::checked_ids(in[1], dw.dim(0), "embedding_backward");
      run("embedding_backward", static_cast<std::size_t>(dw.dim(1)), mem_of(in[0]), off_of(in[0]),
          mem_of(in[1]), off_of(in[1]), mem_of(dw), off_of(dw),
          static_cast<cl_ulong>(in[1].numel()), static_cast<cl_ulong>(dw.dim(1)),
          static_cast<cl_ulong>(dw.dim(0)));
      return;
    }
    case OpId::cross_entropy: {
      const Tensor& logits = in[0];
      std::size_t rows = static_cast<std::size_t>(logits.dim(0));
      device_ops::checked_ids(in[1], logits.dim(1), "cross_entropy");
      Tensor row_loss =
          Tensor::empty({std::max<std::int64_t>(logits.dim(0), 1)}, DType::f32, *this);
      run("cross_entropy_rows", rows, mem_of(logits), off_of(logits), mem_of(in[1]), off_of(in[1]),
          mem_of(out[1]), off_of(out[1]), mem_of(row_loss), static_cast<cl_ulong>(logits.dim(1)));
      float inv = rows > 0 ? 1.0f / static_cast<float>(rows) : 0.0f;
      if (rows == 0) {
        run("fill", 1, mem_of(out[0]), off_of(out[0]), 0.0f);
      } else {
        run("reduce_rows", 1, cl_int{0}, mem_of(row_loss), cl_ulong{0}, mem_of(out[0]),
            off_of(out[0]), static_cast<cl_ulong>(rows), inv);
      }
      return;
    }
    case OpId::cross_entropy_backward: {
      const Tensor& logits = in[1];
      device_ops::checked_ids(in[2], logits.dim(1), "cross_entropy_backward");
      float inv = 1.0f / static_cast<float>(std::max<std::int64_t>(logits.dim(0), 1));
      run("cross_entropy_backward", n(out[0]), mem_of(in[0]), off_of(in[0]), mem_of(logits),
          off_of(logits), mem_of(in[2]), off_of(in[2]), mem_of(in[3]), off_of(in[3]),
          mem_of(out[0]), off_of(out[0]), static_cast<cl_ulong>(logits.dim(1)), inv);
      return;
    }
    case OpId::layer_norm_backward: {
      const Tensor& x = in[1];
      std::size_t c = static_cast<std::size_t>(x.dim(-1)), rows = c == 0 ? 0 : n(x) / c;
      run("layer_norm_backward_rows", rows, mem_of(in[0]), off_of(in[0]), mem_of(x), off_of(x),
          mem_of(in[2]), off_of(in[2]), mem_of(in[3]), off_of(in[3]), mem_of(in[4]), off_of(in[4]),
          mem_of(out[0]), off_of(out[0]), static_cast<cl_ulong>(c));
      run("layer_norm_backward_cols", c, mem_of(in[0]), off_of(in[0]), mem_of(x), off_of(x),
          mem_of(in[3]), off_of(in[3]), mem_of(in[4]), off_of(in[4]), mem_of(out[1]),
          off_of(out[1]), mem_of(out[2]), off_of(out[2]), static_cast<cl_ulong>(rows),
          static_cast<cl_ulong>(c));
      return;
    }
    case OpId::causal_attention:
    case OpId::causal_attention_backward: {
      bool forward = call.op == OpId::causal_attention;
      const Tensor& qkv = in[forward ? 0 : 1];
      cl_ulong b = static_cast<cl_ulong>(qkv.dim(0)), t = static_cast<cl_ulong>(qkv.dim(1));
      cl_ulong c = static_cast<cl_ulong>(qkv.dim(2) / 3),
               h = static_cast<cl_ulong>(call.attrs.heads);
      float scale = 1.0f / std::sqrt(static_cast<float>(c / h));
      std::size_t items = static_cast<std::size_t>(b * h * t);
      if (forward) {
        run("attention_forward", items, mem_of(qkv), off_of(qkv), mem_of(out[0]), off_of(out[0]),
            mem_of(out[1]), off_of(out[1]), t, c, h, scale);
      } else {
        for (const char* k : {"attention_backward_dq", "attention_backward_dkv"})
          run(k, items, mem_of(in[0]), off_of(in[0]), mem_of(qkv), off_of(qkv), mem_of(in[2]),
              off_of(in[2]), mem_of(in[3]), off_of(in[3]), mem_of(out[0]), off_of(out[0]), t, c, h,
              scale);
      }
      return;
    }
    case OpId::adamw_step: {
      const Attrs& a = call.attrs;
      auto [step_size, inv_sqrt_bc2, decay] = device_ops::adamw_scalars(a);
      run("adamw", n(out[0]), mem_of(in[0]), off_of(in[0]), mem_of(in[1]), off_of(in[1]),
          mem_of(in[2]), off_of(in[2]), mem_of(in[3]), off_of(in[3]), mem_of(out[0]),
          off_of(out[0]), mem_of(out[1]), off_of(out[1]), mem_of(out[2]), off_of(out[2]),
          static_cast<cl_float>(a.beta1), static_cast<cl_float>(a.beta2), step_size, inv_sqrt_bc2,
          decay, static_cast<cl_float>(a.eps));
      return;
    }
    default:
      throw Error("opencl: launch of unsupported op " + std::string(op_name(call.op)));
  }
}

OpenClBackend* backend() {
  static std::unique_ptr<OpenClBackend> instance = OpenClBackend::open();
  return instance.get();
}

}  // namespace loom::opencl
