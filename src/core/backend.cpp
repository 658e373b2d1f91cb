#include "core/backend.h"

namespace loom {

void Timeline::advance(std::uint64_t value) const {
  if (value > value_)
    value_ = value;
  pending_.erase(pending_.begin(), pending_.upper_bound(value_));
}

void Timeline::poll() const {
  // Markers of one queue complete in order; markers of different queues need not, so
  // each is asked (the map is small: the values in flight).
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second->reached()) {
      advance(it->first);
      it = pending_.upper_bound(value_);
    } else {
      ++it;
    }
  }
}

void Timeline::signal(std::uint64_t value) {
  {
    std::lock_guard lock(mutex_);
    advance(value);
  }
  reached_.notify_all();
}

void Timeline::signal_at(std::uint64_t value, std::shared_ptr<TimelineMarker> marker) {
  {
    std::lock_guard lock(mutex_);
    if (value <= value_)
      return;
    std::shared_ptr<TimelineMarker>& slot = pending_[value];
    slot = std::move(marker);  // a later signal of the same value supersedes (it is later work)
  }
  reached_.notify_all();  // a host waiter may now wait on the marker instead
}

void Timeline::wait(std::uint64_t value) {
  std::unique_lock lock(mutex_);
  while (true) {
    poll();
    if (value_ >= value)
      return;
    auto covering = pending_.lower_bound(value);
    if (covering == pending_.end()) {
      // Nothing signalled covers it yet: wait for a host signal or a new marker.
      reached_.wait(lock);
      continue;
    }
    std::uint64_t covered = covering->first;
    std::shared_ptr<TimelineMarker> marker = covering->second;
    lock.unlock();
    marker->wait();
    lock.lock();
    advance(covered);
    reached_.notify_all();
  }
}

std::uint64_t Timeline::value() const {
  std::lock_guard lock(mutex_);
  poll();
  return value_;
}

std::shared_ptr<TimelineMarker> Timeline::marker_for(std::uint64_t value) const {
  std::lock_guard lock(mutex_);
  if (value_ >= value)
    return nullptr;
  auto covering = pending_.lower_bound(value);
  return covering == pending_.end() ? nullptr : covering->second;
}

}  // namespace loom
