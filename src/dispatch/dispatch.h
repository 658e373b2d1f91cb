// dispatch/ — the one door every operator call goes through.
//
// For each call: validate and infer output shapes (catalog), make inputs contiguous,
// then on the inputs' device run (1) the backend's native kernel when supports() says
// so, else (2) the op's decomposition into other catalog ops (each again native,
// decomposed or fallback, on the same device), else (3) the CPU kernel with explicit
// copies in and out. Every path is counted. LOOM_STRICT=1 turns a fallback into an
// error; LOOM_DEBUG_DISPATCH=1 prints each distinct decision once.
// supports() is asked with the inputs and attributes; its outputs span is empty.
#pragma once

#include <cstdint>
#include <map>
#include <tuple>
#include <span>
#include <string>
#include <vector>

#include "core/op_catalog.h"
#include "core/tensor.h"

namespace loom::dispatch {

enum class Path { native, decomposed, fallback };
const char* path_name(Path path);

struct PathCount {
  std::uint64_t calls = 0;
  std::uint64_t bytes_moved = 0;  // host<->device bytes copied for fallbacks
  double seconds = 0;             // wall time in the kernel (and copies), host-measured
};

// Counts per (backend name, op, path).
struct Stats {
  std::map<std::tuple<std::string, OpId, Path>, PathCount> counts;
  void reset() { counts.clear(); }
};
Stats& stats();

// Runs `op` and returns its outputs (new tensors on the inputs' device). `device` picks
// the backend for ops without inputs (fill); nullptr means the CPU.
std::vector<Tensor> call(OpId op, std::span<const Tensor> inputs, const Attrs& attrs = {},
                         Backend* device = nullptr);
std::vector<Tensor> call(OpId op, std::initializer_list<Tensor> inputs, const Attrs& attrs = {},
                         Backend* device = nullptr);
// Convenience for single-output ops.
Tensor call1(OpId op, std::initializer_list<Tensor> inputs, const Attrs& attrs = {});

// Runs `op` writing into existing contiguous `outputs` (in-place ops such as adamw_step,
// whose outputs alias inputs).
void call_into(OpId op, std::span<const Tensor> inputs, std::span<Tensor> outputs, const Attrs& attrs);

// A contiguous tensor with the same values (the input itself when already contiguous).
Tensor contiguous(const Tensor& x);

}  // namespace loom::dispatch
