// core/backend.h — the hardware contract. A new chip implements Backend and Stream;
// everything above floor 1 (dispatch, autograd, nn, training) is written against this.
//
// Rules (docs/architecture.md): a Buffer is an RAII handle that returns its bytes to the backend
// that made it; work on a Stream is ordered; order across streams is expressed with
// Timeline values (monotonic counters, as IREE's timeline semaphores), never implied.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/error.h"

namespace loom {

class Backend;
struct OpCall;

// What a created stream is for: a hint (a chip with copy engines may put copies on a
// queue of their own). Communication on host memory runs on a HostStream
// (core/host_stream.h); device collectives would bring their own kind.
enum class StreamKind { compute, copy };

// What a device is and can do; the planner's device profile extends these measured figures.
struct DeviceInfo {
  std::string name;              // e.g. "cpu (2 threads, avx512)"
  std::size_t memory_bytes = 0;  // usable device memory
  double peak_flops_f32 = 0;     // FLOP/s, theoretical
  double memory_bandwidth = 0;   // bytes/s, theoretical (0 = unknown)
  bool host_accessible = false;  // true when device pointers are plain host pointers
};

// ---------------------------------------------------------------------------
// Buffer: device memory owned by one backend, released on destruction.
// ---------------------------------------------------------------------------
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* data, std::size_t bytes, Backend* owner)
      : data_(data), bytes_(bytes), owner_(owner) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& other) noexcept { swap(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    Buffer moved(std::move(other));
    swap(moved);
    return *this;
  }
  ~Buffer();

  void* data() const { return data_; }  // device address; a host pointer only if host_accessible
  std::size_t bytes() const { return bytes_; }
  Backend& owner() const { return *owner_; }

 private:
  void swap(Buffer& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    std::swap(owner_, other.owner_);
  }
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Backend* owner_ = nullptr;
};

// ---------------------------------------------------------------------------
// TimelineMarker: a point in one device queue's work (an OpenCL event, a CUDA event).
// A device stream's signal(v) leaves one on the timeline instead of blocking, so a stream
// of the same device can wait for it on the device, and the host only when it asks.
// ---------------------------------------------------------------------------
class TimelineMarker {
 public:
  virtual ~TimelineMarker() = default;
  virtual bool reached() = 0;  // without blocking: has the work before it completed?
  virtual void wait() = 0;     // blocks the calling host thread until it has
};

// ---------------------------------------------------------------------------
// Timeline: a monotonically increasing counter shared by streams. signal(v) sets it
// to v once the stream's earlier work is done; wait(v) blocks the stream until it
// reaches v. Host code may wait on it too. A value signalled by a device stream is
// pending until its marker is reached; values never go down (max of all signals).
// ---------------------------------------------------------------------------
class Timeline {
 public:
  void signal(std::uint64_t value);  // reached now
  // Reached when `marker` is (a device stream's signal).
  void signal_at(std::uint64_t value, std::shared_ptr<TimelineMarker> marker);
  void wait(std::uint64_t value);  // blocks the calling host thread
  std::uint64_t value() const;     // the largest value reached so far
  // The marker whose value is the smallest pending one >= `value`, or null when `value`
  // is reached or no pending marker covers it (a stream then waits on the host). A
  // device stream waits for this marker on the device when it belongs to its device.
  std::shared_ptr<TimelineMarker> marker_for(std::uint64_t value) const;

 private:
  void advance(std::uint64_t value) const;  // with mutex_ held: value_ = max, settled markers go
  void poll() const;                        // with mutex_ held: advance past reached markers

  mutable std::mutex mutex_;
  std::condition_variable reached_;
  mutable std::uint64_t value_ = 0;
  mutable std::map<std::uint64_t, std::shared_ptr<TimelineMarker>> pending_;
};

// ---------------------------------------------------------------------------
// Stream: ordered work on one device.
// ---------------------------------------------------------------------------
// Work submitted to one stream runs in submission order; streams run concurrently with
// each other and with the host, ordered only by Timeline values. Everything a stream's
// work reads or writes (buffers, host memory) must stay alive and unchanged by others
// until that work is done: until a value the stream signalled after it is reached, or
// synchronize() returns. launch() keeps its call's tensors alive itself.
class Stream {
 public:
  virtual ~Stream() = default;
  // Copies `bytes` from src+src_offset to dst+dst_offset; buffers may belong to this
  // device or be host-accessible. May return before the copy is done (see above).
  virtual void copy(const Buffer& src, std::size_t src_offset, Buffer& dst, std::size_t dst_offset,
                    std::size_t bytes) = 0;
  // The timeline reaches `value` once the stream's work submitted so far is done.
  virtual void signal(Timeline& timeline, std::uint64_t value) = 0;
  // The stream's later work starts once the timeline reaches `value`; the caller is not held
  // (a stream of the same device waits on the device, others on a thread of their own or,
  // where a backend has neither, on the host).
  virtual void wait(Timeline& timeline, std::uint64_t value) = 0;
  virtual void synchronize() = 0;  // blocks the host until the stream's work is done
};

// ---------------------------------------------------------------------------
// Backend: the whole contract a new chip implements.
// ---------------------------------------------------------------------------
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;  // "cpu", "opencl:0", "cuda:0"
  virtual DeviceInfo info() const = 0;
  // Cheap form of info().host_accessible, asked on every host access to a tensor.
  virtual bool host_accessible() const { return info().host_accessible; }
  virtual Buffer allocate(std::size_t bytes) = 0;
  virtual std::unique_ptr<Stream> create_stream(StreamKind kind) = 0;
  // The coverage truth: can this backend run this call natively (op, dtypes, layout)?
  virtual bool supports(const OpCall& call) const = 0;
  // Runs one operator on `stream`. Only called when supports(call) is true.
  virtual void launch(const OpCall& call, Stream& stream) = 0;
  // The stream dispatch uses when the caller names none; ordered with everything it ran.
  virtual Stream& default_stream() = 0;

  // Operand precision of the products inside matmul, linear and attention: f32 (the
  // default) or bf16 (operands rounded to bf16, products accumulated in f32; weights,
  // activations and optimizer state stay f32). Returns false when the backend cannot.
  virtual bool set_matmul_precision(DType dtype) { return dtype == DType::f32; }

  // The host threads the backend's kernels use (the CPU's OpenMP and oneDNN pool). Returns
  // false when the backend has no such setting (its kernels run on the device); throws
  // when `threads` is below 1.
  virtual bool set_threads(int threads) {
    check(threads >= 1, [&] { return "threads = " + std::to_string(threads) + ", expected >= 1"; });
    return false;
  }

  // Returns memory the backend's allocator keeps for reuse to the system (or driver), e.g.
  // before a graph allocates its planned memory. Default: nothing is cached.
  virtual void release_cached_memory() {}

  // Blocking host<->device transfers on the default stream.
  virtual void upload(const void* host, Buffer& dst, std::size_t dst_offset, std::size_t bytes) = 0;
  virtual void download(const Buffer& src, std::size_t src_offset, void* host,
                        std::size_t bytes) = 0;

 protected:
  friend class Buffer;
  // Returns memory obtained from allocate(); called by ~Buffer.
  virtual void release(void* data, std::size_t bytes) noexcept = 0;
};

inline Buffer::~Buffer() {
  if (data_ != nullptr)
    owner_->release(data_, bytes_);
}

}  // namespace loom
