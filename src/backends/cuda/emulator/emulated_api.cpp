// backends/cuda/emulator/emulated_api.cpp — the emulated CUDA driver: one device, its memory
// (checked ranges), streams that run late, events, modules and kernel launches on the
// block scheduler; the API table (cuBLAS and cuBLASLt from emulated_blas.cpp).
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

#include "backends/cuda/emulator/emulated_device.h"
#include "backends/cuda/emulator/emulated_kernels.h"
#include "core/error.h"

namespace loom::cuda::emulator::detail {

thread_local std::string problem;

CUresult fail(CUresult status, std::string why) {
  problem = std::move(why);
  return status;
}
cublasStatus_t fail(cublasStatus_t status, std::string why) {
  problem = std::move(why);
  return status;
}

Device& device() {
  static Device d;
  return d;
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

}  // namespace loom::cuda::emulator::detail

namespace loom::cuda::emulator {
namespace {

using namespace detail;

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
  add_blas(a);
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
