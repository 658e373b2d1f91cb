#include "core/host_stream.h"

#include <cstring>
#include <exception>
#include <memory>

#include "core/error.h"

namespace loom {

HostStream::HostStream() : thread_([this] { run(); }) {}

HostStream::~HostStream() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void HostStream::submit(std::function<void()> work) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(work));
  }
  wake_.notify_all();
}

void HostStream::submit_call(std::function<void(const OpCall&)> kernel, const OpCall& call) {
  struct Deferred {
    OpId op;
    std::vector<Tensor> inputs, outputs;
    Attrs attrs;
  };
  auto deferred = std::make_shared<Deferred>(
      Deferred{call.op, std::vector<Tensor>(call.inputs.begin(), call.inputs.end()),
               std::vector<Tensor>(call.outputs.begin(), call.outputs.end()), call.attrs});
  submit([kernel = std::move(kernel), deferred] {
    kernel(OpCall{deferred->op, deferred->inputs, deferred->outputs, deferred->attrs});
  });
}

void HostStream::copy(const Buffer& src, std::size_t src_offset, Buffer& dst,
                      std::size_t dst_offset, std::size_t bytes) {
  check(src.owner().host_accessible() && dst.owner().host_accessible(), [&] {
    return "HostStream::copy: both buffers must be host memory (" +
           std::string(src.owner().name()) + " to " + std::string(dst.owner().name()) + ")";
  });
  const std::byte* from = static_cast<const std::byte*>(src.data()) + src_offset;
  std::byte* to = static_cast<std::byte*>(dst.data()) + dst_offset;
  submit([from, to, bytes] { std::memcpy(to, from, bytes); });
}

void HostStream::signal(Timeline& timeline, std::uint64_t value) {
  submit([&timeline, value] { timeline.signal(value); });
}

void HostStream::wait(Timeline& timeline, std::uint64_t value) {
  submit([&timeline, value] { timeline.wait(value); });
}

void HostStream::synchronize() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
  if (!failure_.empty()) {
    std::string message = std::move(failure_);
    failure_.clear();
    throw Error(message);
  }
}

void HostStream::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    // On stop, what was submitted still runs: a destructor must not drop a signal.
    wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty())
      return;
    std::function<void()> work = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    std::string failure;
    try {
      work();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    work = nullptr;  // what it captured is released on this thread, before idle
    lock.lock();
    busy_ = false;
    if (!failure.empty() && failure_.empty())
      failure_ = std::move(failure);
    idle_.notify_all();
  }
}

}  // namespace loom
