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
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "core/dtype.h"

namespace loom {

class Backend;
struct OpCall;

enum class MemoryKind { device, host_pinned };
enum class StreamKind { compute, copy, comm };

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
// Timeline: a monotonically increasing counter shared by streams. signal(v) sets it
// to v once the stream's earlier work is done; wait(v) blocks the stream until it
// reaches v. Host code may wait on it too.
// ---------------------------------------------------------------------------
class Timeline {
 public:
  void signal(std::uint64_t value);
  void wait(std::uint64_t value);  // blocks the calling host thread
  std::uint64_t value() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable reached_;
  std::uint64_t value_ = 0;
};

// ---------------------------------------------------------------------------
// Stream: ordered work on one device.
// ---------------------------------------------------------------------------
class Stream {
 public:
  virtual ~Stream() = default;
  // Copies `bytes` from src+src_offset to dst+dst_offset; buffers may belong to this
  // device or be host-accessible.
  virtual void copy(const Buffer& src, std::size_t src_offset, Buffer& dst, std::size_t dst_offset,
                    std::size_t bytes) = 0;
  virtual void signal(Timeline& timeline, std::uint64_t value) = 0;
  virtual void wait(Timeline& timeline, std::uint64_t value) = 0;
  virtual void synchronize() = 0;
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
  virtual Buffer allocate(std::size_t bytes, MemoryKind kind) = 0;
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
