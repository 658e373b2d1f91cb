// core/host_stream.h — a stream whose work runs on a host thread of its own.
//
// The CPU backend's created streams, and the communication stream of data parallelism
// on host memory (MPI's collectives are host calls): work submitted to one HostStream
// runs in submission order on its thread, concurrently with the submitting thread and
// with other streams; order across streams comes from Timeline values alone. wait(v)
// blocks only the stream's thread, so later work on the stream waits and the submitter
// does not.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/op_catalog.h"

namespace loom {

class HostStream final : public Stream {
 public:
  HostStream();
  ~HostStream() override;  // runs what was submitted, then stops the thread
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;

  // Runs `work` on the stream's thread after everything submitted before it. A failure
  // (an exception) is kept and rethrown by synchronize(); later work still runs, so a
  // signal after it is not lost and no waiter hangs.
  void submit(std::function<void()> work);
  // Runs `kernel` on a copy of `call` on the stream's thread: the tensors are handles, so
  // their storage stays alive until the kernel has run; the attributes are copied.
  void submit_call(std::function<void(const OpCall&)> kernel, const OpCall& call);
  // Host memory only (host-accessible buffers); the copy runs on the stream's thread.
  void copy(const Buffer& src, std::size_t src_offset, Buffer& dst, std::size_t dst_offset,
            std::size_t bytes) override;
  void signal(Timeline& timeline, std::uint64_t value) override;
  void wait(Timeline& timeline, std::uint64_t value) override;
  // Blocks until everything submitted so far has run; rethrows the first failure.
  void synchronize() override;

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false, stop_ = false;
  std::string failure_;
  std::thread thread_;
};

}  // namespace loom
