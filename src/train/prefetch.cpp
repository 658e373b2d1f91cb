#include "train/prefetch.h"

#include <utility>

#include "core/error.h"

namespace loom::train {

namespace {

// A contiguous host copy's bytes go to a new device tensor on `stream`.
Tensor upload_on(Stream& stream, const Tensor& host, Backend& device) {
  check(host.is_contiguous() && host.backend().host_accessible(),
        "batch prefetch: the batch must be contiguous in host memory, got " + host.describe());
  Tensor on_device = Tensor::empty(host.shape(), host.dtype(), device);
  stream.copy(*host.storage(), static_cast<std::size_t>(host.offset()) * dtype_size(host.dtype()),
              *on_device.storage(),
              static_cast<std::size_t>(on_device.offset()) * dtype_size(on_device.dtype()),
              host.nbytes());
  return on_device;
}

}  // namespace

BatchPrefetch::BatchPrefetch(Backend& device, std::function<data::Batch(std::int64_t)> draw)
    : device_(device), draw_(std::move(draw)), copy_(device.create_stream(StreamKind::copy)) {}

BatchPrefetch::~BatchPrefetch() {
  try {
    copy_->synchronize();
  } catch (const std::exception&) {
    // A failed copy was the step's to report; the memory is released either way.
  }
}

void BatchPrefetch::issue(std::int64_t step) {
  if (pending_) {  // issued and never taken: finish it and drop it
    copy_->synchronize();
    pending_.reset();
  }
  data::Batch host = draw_(step);
  Pending next{step, host, {}};
  next.device.inputs = upload_on(*copy_, host.inputs, device_);
  next.device.targets = upload_on(*copy_, host.targets, device_);
  copy_->signal(uploaded_, static_cast<std::uint64_t>(step) + 1);
  pending_ = std::move(next);
}

data::Batch BatchPrefetch::take(std::int64_t step) {
  retired_.reset();  // its copy completed before the previous step's loss was read
  if (pending_ && pending_->step == step) {
    // The step's kernels wait for the upload on the device; the host goes on.
    device_.default_stream().wait(uploaded_, static_cast<std::uint64_t>(step) + 1);
    retired_ = std::move(pending_->host);
    data::Batch batch = std::move(pending_->device);
    pending_.reset();
    ++prefetched_;
    return batch;
  }
  if (pending_) {
    copy_->synchronize();
    pending_.reset();
  }
  data::Batch host = draw_(step);
  return {host.inputs.to(device_), host.targets.to(device_)};
}

}  // namespace loom::train
