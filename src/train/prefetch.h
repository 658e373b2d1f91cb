// train/prefetch.h — the next step's batch uploaded on the device's copy stream while the
// current step computes.
//
// issue(s) draws step s's batch in host memory and copies it into fresh device tensors on
// a copy stream, then signals uploaded() = s + 1. take(s) makes the default stream wait
// for that value on the device (an OpenCL barrier on the copy queue's marker, a CUDA
// stream waiting on an event) and returns the tensors, so the step's first kernel runs
// after its batch has arrived and the host never waits for the copy. Called as take(s),
// issue(s + 1), then the step's compute: the upload of s + 1 overlaps step s. A step that
// was not issued is drawn and uploaded when taken. Host batches stay alive until the
// following take (by then the copy has completed: the default stream waited for it and
// the step read its loss), since a stream's copy from host memory may return before the
// copy is done.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "core/backend.h"
#include "data/text.h"

namespace loom::train {

class BatchPrefetch {
 public:
  // `draw(step)` gives step's batch in host memory (this process's share of it).
  BatchPrefetch(Backend& device, std::function<data::Batch(std::int64_t)> draw);
  ~BatchPrefetch();  // waits for a copy still in flight
  BatchPrefetch(const BatchPrefetch&) = delete;
  BatchPrefetch& operator=(const BatchPrefetch&) = delete;

  void issue(std::int64_t step);
  data::Batch take(std::int64_t step);
  // Reaches step + 1 once step's batch is on the device.
  Timeline& uploaded() { return uploaded_; }
  std::int64_t prefetched() const { return prefetched_; }  // batches taken from the copy stream

 private:
  struct Pending {
    std::int64_t step;
    data::Batch host, device;
  };
  Backend& device_;
  std::function<data::Batch(std::int64_t)> draw_;
  std::unique_ptr<Stream> copy_;
  Timeline uploaded_;
  std::optional<Pending> pending_;      // issued, not yet taken
  std::optional<data::Batch> retired_;  // the last taken step's host batch, kept one step
  std::int64_t prefetched_ = 0;
};

}  // namespace loom::train
