// Streams that do something: work launched on a created stream runs in that stream's
// order and not on the caller's; Timeline values order streams against each other and
// the host. The tests read the recorded order of events, never durations.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/host_stream.h"
#include "core/op_catalog.h"
#include "test_util.h"
#include "train/prefetch.h"
#ifdef LOOM_HAVE_OPENCL
#include "backends/opencl/opencl_backend.h"
#endif

namespace loom::testing {
namespace {

// A marker the test reaches by hand.
class HandMarker final : public TimelineMarker {
 public:
  bool reached() override {
    std::lock_guard lock(mutex_);
    return reached_;
  }
  void wait() override {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return reached_; });
  }
  void reach() {
    {
      std::lock_guard lock(mutex_);
      reached_ = true;
    }
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool reached_ = false;
};

// Entries appended from any thread, in the order they happen.
class EventLog {
 public:
  void add(const std::string& entry) {
    std::lock_guard lock(mutex_);
    entries_.push_back(entry);
  }
  std::vector<std::string> entries() {
    std::lock_guard lock(mutex_);
    return entries_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> entries_;
};

TEST(Timeline, AValueSignalledWithAMarkerIsPendingUntilTheMarkerIsReached) {
  Timeline timeline;
  auto marker = std::make_shared<HandMarker>();
  timeline.signal_at(2, marker);
  EXPECT_EQ(timeline.value(), 0u);
  EXPECT_EQ(timeline.marker_for(1), marker);  // waiting for 2 covers waiting for 1
  EXPECT_EQ(timeline.marker_for(2), marker);
  EXPECT_EQ(timeline.marker_for(3), nullptr);  // nothing signalled covers 3
  std::thread waiter([&] { timeline.wait(2); });
  marker->reach();
  waiter.join();
  EXPECT_EQ(timeline.value(), 2u);
  EXPECT_EQ(timeline.marker_for(2), nullptr);  // reached: nothing to wait for
  timeline.signal(1);
  EXPECT_EQ(timeline.value(), 2u);  // never goes down
  timeline.signal_at(2, std::make_shared<HandMarker>());
  EXPECT_EQ(timeline.marker_for(2), nullptr);  // a value already reached stays reached
}

TEST(Timeline, AHostWaiterFollowsAMarkerSignalledAfterItBeganWaiting) {
  Timeline timeline;
  auto marker = std::make_shared<HandMarker>();
  std::promise<void> waiting;
  std::thread waiter([&] {
    waiting.set_value();
    timeline.wait(1);
  });
  waiting.get_future().wait();
  timeline.signal_at(1, marker);
  marker->reach();
  waiter.join();
  EXPECT_EQ(timeline.value(), 1u);
}

TEST(HostStream, WorkRunsInStreamOrderAndAWaitHoldsOnlyTheStream) {
  Timeline gate, a_done;
  EventLog log;
  HostStream a, b;
  a.wait(gate, 1);  // a's later work waits for the host to open the gate
  a.submit([&] { log.add("a"); });
  a.signal(a_done, 1);
  b.wait(a_done, 1);  // b's work waits for a's, not for the host
  b.submit([&] { log.add("b"); });
  log.add("host");  // the host was not held by either wait
  gate.signal(1);
  b.synchronize();
  EXPECT_EQ(log.entries(), (std::vector<std::string>{"host", "a", "b"}));
}

TEST(HostStream, AFailureIsRethrownBySynchronizeAndLaterSignalsStillHappen) {
  Timeline done;
  HostStream stream;
  stream.submit([] { throw Error("bucket 3: all-reduce failed"); });
  stream.signal(done, 1);
  done.wait(1);  // the signal after the failure happened: a waiter does not hang
  EXPECT_EQ(error_of([&] { stream.synchronize(); }), "bucket 3: all-reduce failed");
  EXPECT_EQ(error_of([&] { stream.synchronize(); }), "");  // reported once
}

// On every backend: an add launched on a created compute stream, a copy of its result on
// a created copy stream after a Timeline value, the host waiting on the copy's value.
class StreamsOnBackend : public ::testing::TestWithParam<std::string> {};

TEST_P(StreamsOnBackend, ACopyStreamWaitingOnATimelineSeesTheComputeStreamsResult) {
  Backend& device = backend_named(GetParam());
  nn::Rng rng(11);
  const Shape shape{4099};
  Tensor a = random(shape, rng), b = random(shape, rng);
  std::vector<Tensor> inputs{a.to(device), b.to(device)};
  std::vector<Tensor> sum{Tensor::empty(shape, DType::f32, device)};
  Tensor copied = Tensor::empty(shape, DType::f32, device);
  std::unique_ptr<Stream> compute = device.create_stream(StreamKind::compute);
  std::unique_ptr<Stream> copy = device.create_stream(StreamKind::copy);
  Attrs attrs;
  Timeline timeline;
  device.launch(OpCall{OpId::add, inputs, sum, attrs}, *compute);
  compute->signal(timeline, 1);
  copy->wait(timeline, 1);
  copy->copy(*sum[0].storage(), 0, *copied.storage(), 0, sum[0].nbytes());
  copy->signal(timeline, 2);
  timeline.wait(2);
  std::vector<double> expected = values(a), got = values(copied), rhs = values(b);
  for (std::size_t i = 0; i < expected.size(); ++i)
    expected[i] = static_cast<float>(expected[i]) + static_cast<float>(rhs[i]);
  EXPECT_EQ(got, expected);
  compute->synchronize();
  copy->synchronize();
}

INSTANTIATE_TEST_SUITE_P(All, StreamsOnBackend, ::testing::ValuesIn(backend_names()),
                         [](const auto& info) { return info.param; });

TEST(CpuStreams, AKernelOnACreatedStreamRunsOnItsThreadAfterItsWait) {
  Backend& device = cpu();
  std::unique_ptr<Stream> stream = device.create_stream(StreamKind::compute);
  Timeline gate;
  const std::vector<float> values{1, 2, 3}, zeros{0, 0, 0};
  Tensor x = Tensor::from_floats({3}, values, device);
  std::vector<Tensor> inputs{x, x}, out{Tensor::from_floats({3}, zeros, device)};
  Attrs attrs;
  stream->wait(gate, 1);
  device.launch(OpCall{OpId::add, inputs, out, attrs}, *stream);
  EXPECT_EQ(out[0].to_floats(), (std::vector<float>{0, 0, 0}));  // held by the gate
  gate.signal(1);
  stream->synchronize();
  EXPECT_EQ(out[0].to_floats(), (std::vector<float>{2, 4, 6}));
}

#ifdef LOOM_HAVE_OPENCL
// PoCL's `basic` device (POCL_DEVICES=basic selects it) runs queued commands on the host
// thread that flushes or waits, one queue at a time: a queue held at a user event holds
// every queue. The tests that hold a queue need a device whose queues run by themselves.
bool holding_a_queue_holds_all(Backend& device) {
  return device.info().name.find("basic-") != std::string::npos;
}
#endif

// The graph-mode trainer's batch prefetch, on each device with memory of its own: the
// next step's batch is uploaded on the copy stream while compute submitted after it is
// still held (OpenCL: behind a user event the test opens; the CUDA emulator: streams run
// only when waited for). An upload queued behind that compute would never reach its
// timeline value while the compute is held: the test fails, it does not hang (30 s).
class PrefetchOnDevice : public ::testing::TestWithParam<std::string> {};

data::Batch numbered_batch(std::int64_t step) {
  std::vector<std::int32_t> ids(6), targets(6);
  for (int i = 0; i < 6; ++i) {
    ids[i] = static_cast<std::int32_t>(step * 10 + i);
    targets[i] = static_cast<std::int32_t>(step * 10 + 5 - i);
  }
  return {Tensor::from_ints({2, 3}, ids, cpu()), Tensor::from_ints({6}, targets, cpu())};
}

TEST_P(PrefetchOnDevice, TheNextBatchUploadsWhileComputeSubmittedAfterItIsHeld) {
  Backend& device = backend_named(GetParam());
  const std::vector<float> values{1, 2, 3, 4};
  Tensor x = Tensor::from_floats({4}, values, cpu()).to(device);
  std::vector<Tensor> inputs{x, x}, sum{Tensor::empty({4}, DType::f32, device)};
  Attrs attrs;
  Timeline computed;
  train::BatchPrefetch prefetch(device, numbered_batch);
#ifdef LOOM_HAVE_OPENCL
  if (GetParam() == "opencl" && holding_a_queue_holds_all(device))
    GTEST_SKIP() << device.info().name << " runs one queue at a time";
  cl_event gate = nullptr;
  if (GetParam() == "opencl") {
    cl_int err = CL_SUCCESS;
    auto& cl = static_cast<opencl::OpenClBackend&>(device);
    gate = clCreateUserEvent(cl.context(), &err);
    ASSERT_EQ(err, CL_SUCCESS);
    ASSERT_EQ(clEnqueueBarrierWithWaitList(cl.queue(), 1, &gate, nullptr), CL_SUCCESS);
  }
#endif
  prefetch.issue(1);
  device.launch(OpCall{OpId::add, inputs, sum, attrs}, device.default_stream());  // "the step"
  device.default_stream().signal(computed, 1);
  auto uploaded = std::async(std::launch::async, [&] { prefetch.uploaded().wait(2); });
  EXPECT_EQ(uploaded.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "the upload waited for compute submitted after it";
  EXPECT_EQ(computed.value(), 0u);  // the compute is still held, or has not run
#ifdef LOOM_HAVE_OPENCL
  if (gate != nullptr) {
    clSetUserEventStatus(gate, CL_COMPLETE);
    clReleaseEvent(gate);
  }
#endif
  uploaded.get();
  data::Batch batch = prefetch.take(1);  // the default stream waits for the upload
  EXPECT_EQ(batch.inputs.to_ints(), numbered_batch(1).inputs.to_ints());
  EXPECT_EQ(batch.targets.to_ints(), numbered_batch(1).targets.to_ints());
  EXPECT_EQ(&batch.inputs.backend(), &device);
  EXPECT_EQ(sum[0].to_floats(), (std::vector<float>{2, 4, 6, 8}));
  EXPECT_EQ(prefetch.prefetched(), 1);
  data::Batch unissued = prefetch.take(2);  // drawn and uploaded when taken
  EXPECT_EQ(unissued.inputs.to_ints(), numbered_batch(2).inputs.to_ints());
  EXPECT_EQ(prefetch.prefetched(), 1);
}

// The backends with memory of their own (on host memory the trainer does not prefetch).
std::vector<std::string> device_memory_backends() {
  std::vector<std::string> names;
  for (const std::string& name : backend_names())
    if (!backend_named(name).host_accessible())
      names.push_back(name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(All, PrefetchOnDevice, ::testing::ValuesIn(device_memory_backends()),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PrefetchOnDevice);  // a build without devices

#ifdef LOOM_HAVE_OPENCL
// Device-side ordering: the compute queue is held at a user event the test opens; the
// copy stream's wait becomes a barrier on the compute queue's marker, so enqueueing the
// whole sequence returns without the host waiting, and nothing has run before the gate
// opens. A wait done on the host would hold this thread: the test fails, not hangs.
TEST(OpenClStreams, AWaitOnAnotherQueuesMarkerIsEnqueuedNotWaitedOnTheHost) {
  opencl::OpenClBackend* device = opencl::backend();
  if (device == nullptr)
    GTEST_SKIP() << "no opencl device";
  if (holding_a_queue_holds_all(*device))
    GTEST_SKIP() << device->info().name << " runs one queue at a time";
  std::unique_ptr<Stream> compute = device->create_stream(StreamKind::compute);
  std::unique_ptr<Stream> copy = device->create_stream(StreamKind::copy);
  cl_int err = CL_SUCCESS;
  cl_event gate = clCreateUserEvent(device->context(), &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(
      clEnqueueBarrierWithWaitList(opencl::OpenClBackend::queue_of(*compute), 1, &gate, nullptr),
      CL_SUCCESS);
  const std::vector<float> values{1, 2, 3, 4, 5};
  Tensor x = Tensor::from_floats({5}, values, cpu()).to(*device);
  std::vector<Tensor> inputs{x, x}, sum{Tensor::empty({5}, DType::f32, *device)};
  Tensor copied = Tensor::empty({5}, DType::f32, *device);
  Attrs attrs;
  Timeline timeline;
  auto enqueued = std::async(std::launch::async, [&] {
    device->launch(OpCall{OpId::add, inputs, sum, attrs}, *compute);
    compute->signal(timeline, 1);
    copy->wait(timeline, 1);
    copy->copy(*sum[0].storage(), 0, *copied.storage(), 0, sum[0].nbytes());
    copy->signal(timeline, 2);
  });
  bool returned = enqueued.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  EXPECT_TRUE(returned) << "a stream's wait held the host";
  EXPECT_EQ(timeline.value(), 0u);  // held at the gate: neither stream has run
  clSetUserEventStatus(gate, CL_COMPLETE);
  clReleaseEvent(gate);
  enqueued.get();
  timeline.wait(2);
  EXPECT_EQ(copied.to_floats(), (std::vector<float>{2, 4, 6, 8, 10}));
  compute->synchronize();
}
#endif

}  // namespace
}  // namespace loom::testing
