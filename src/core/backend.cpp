#include "core/backend.h"

namespace loom {

void Timeline::signal(std::uint64_t value) {
  {
    std::lock_guard lock(mutex_);
    if (value > value_)
      value_ = value;
  }
  reached_.notify_all();
}

void Timeline::wait(std::uint64_t value) {
  std::unique_lock lock(mutex_);
  reached_.wait(lock, [&] { return value_ >= value; });
}

std::uint64_t Timeline::value() const {
  std::lock_guard lock(mutex_);
  return value_;
}

}  // namespace loom
