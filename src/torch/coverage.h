// torch/coverage.h — which ATen operators a script called on loom devices, and how each ran:
// natively on the Loom backend, through a Loom decomposition, through Loom's CPU fallback
// (dispatch's own counts, read around the call), or through PyTorch's CPU fallback (an ATen
// op Loom does not map). LOOM_TORCH_FALLBACK=error turns a fallback of either kind into an
// error naming the op (docs/pytorch.md).
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "dispatch/dispatch.h"

namespace loom::torch_device {

struct OpCoverage {
  std::uint64_t calls = 0;
  std::uint64_t native = 0, decomposed = 0, loom_fallback = 0, pytorch_fallback = 0;
  double seconds = 0;
  std::uint64_t bytes_copied = 0;  // host<->device bytes of the fallbacks
};

// Every ATen operator seen so far, by "name.overload" ("add.out").
std::map<std::string, OpCoverage> coverage();
void reset_coverage();
bool fallback_is_error();  // LOOM_TORCH_FALLBACK=error

// Records one call of ATen op `name` on `backend`: the Loom kernels it ran (dispatch's counts
// before and after), their paths and its time. With LOOM_TORCH_FALLBACK=error, a call that
// needed Loom's CPU fallback throws naming the op.
class RecordedCall {
 public:
  RecordedCall(const char* name, const c10::Device& device);
  ~RecordedCall();
  RecordedCall(const RecordedCall&) = delete;
  RecordedCall& operator=(const RecordedCall&) = delete;
  // Called at the end of a successful call: attributes the paths (may throw, see above).
  void done();

 private:
  std::string name_;
  c10::Device device_;
  dispatch::PathCount before_[3];  // dispatch's totals by path when the call began
  std::chrono::steady_clock::time_point start_;
  bool done_ = false;
};

// An ATen op's name in the report, "sqrt.out", from its at::_ops type ("aten::sqrt", "out").
template <class AtenOp>
const char* name_of() {
  static const std::string name = std::string(AtenOp::name).substr(6) + "." + AtenOp::overload_name;
  return name.c_str();
}

// PyTorch's CPU fallback took `name` (with the bytes copied and the time).
void record_pytorch_fallback(const std::string& name, double seconds, std::uint64_t bytes);

}  // namespace loom::torch_device
