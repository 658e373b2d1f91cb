// backends/cuda/emulator/emulated_device.h — the emulated device the emulator's API files
// share: its memory, streams, events and cuBLASLt descriptors, the failure text of the
// last call, and the stream queues. Not for use outside backends/cuda/emulator.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backends/cuda/emulator/emulated_api.h"

namespace loom::cuda::emulator::detail {

using Clock = std::chrono::steady_clock;

// The text of the last failure on this thread (last_problem() hands it out).
extern thread_local std::string problem;
CUresult fail(CUresult status, std::string why);
cublasStatus_t fail(cublasStatus_t status, std::string why);

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
// The one emulated device.
Device& device();

template <class Handle>
Handle new_handle() {
  Device& d = device();
  std::lock_guard lock(d.mutex);
  d.next_handle += 64;
  return reinterpret_cast<Handle>(d.next_handle);
}

// "" when [address, address + bytes) lies inside one live allocation, else why not.
std::string outside_allocation(std::uintptr_t address, std::size_t bytes);
// CUDA_SUCCESS, or CUDA_ERROR_INVALID_VALUE naming `call` when the range is not allocated.
CUresult check_range(std::uintptr_t address, std::size_t bytes, const char* call);
// A stream's key in Device::streams.
inline std::uintptr_t key(CUstream stream) {
  return reinterpret_cast<std::uintptr_t>(stream);
}
// Queues `work` on `stream`; on the legacy stream it runs now, after every queue.
CUresult enqueue(CUstream stream, std::function<CUresult()> work);
// Runs `stream`'s entries until it has run `until` of them (with device().queues held).
CUresult run_until(std::uintptr_t id, std::uint64_t until);

// Fills in the cuBLAS and cuBLASLt entries of `api` (emulated_blas.cpp).
void add_blas(Api& api);

}  // namespace loom::cuda::emulator::detail
