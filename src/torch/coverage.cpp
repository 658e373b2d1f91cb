#include "torch/coverage.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <mutex>

namespace loom::torch_device {

namespace {
std::mutex mutex;
std::map<std::string, OpCoverage>& table() {
  static std::map<std::string, OpCoverage> t;
  return t;
}
}  // namespace

std::map<std::string, OpCoverage> coverage() {
  std::lock_guard<std::mutex> lock(mutex);
  return table();
}

void reset_coverage() {
  std::lock_guard<std::mutex> lock(mutex);
  table().clear();
}

bool fallback_is_error() {
  const char* v = std::getenv("LOOM_TORCH_FALLBACK");
  return v != nullptr && std::string(v) == "error";
}

RecordedCall::RecordedCall(const char* name, const c10::Device& device)
    : name_(name), device_(device), start_(std::chrono::steady_clock::now()) {
  for (int p = 0; p < 3; ++p)
    before_[p] = dispatch::stats().totals[p];
}

RecordedCall::~RecordedCall() = default;

void RecordedCall::done() {
  if (done_)
    return;
  done_ = true;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::uint64_t paths[3] = {0, 0, 0}, bytes = 0;  // native, decomposed, fallback kernels
  for (int p = 0; p < 3; ++p) {
    const dispatch::PathCount& now = dispatch::stats().totals[p];
    paths[p] = now.calls - before_[p].calls;
    bytes += now.bytes_moved - before_[p].bytes_moved;
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    OpCoverage& c = table()[name_];
    ++c.calls;
    // The call's path is its worst kernel's: one Loom CPU fallback makes it a fallback.
    if (paths[2] > 0)
      ++c.loom_fallback;
    else if (paths[1] > 0)
      ++c.decomposed;
    else
      ++c.native;
    c.seconds += seconds;
    c.bytes_copied += bytes;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(paths[2] == 0 || !fallback_is_error(), "loom: aten::", name_, " on ",
                              device_,
                              " ran a Loom kernel through the CPU fallback "
                              "(LOOM_TORCH_FALLBACK=error)");
}

void record_pytorch_fallback(const std::string& name, double seconds, std::uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex);
  OpCoverage& c = table()[name];
  ++c.calls;
  ++c.pytorch_fallback;
  c.seconds += seconds;
  c.bytes_copied += bytes;
}

}  // namespace loom::torch_device
