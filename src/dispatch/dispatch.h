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
#include <span>
#include <string>
#include <tuple>
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

// Counts per (backend name, op, path), and per path over all of them (read cheaply around
// one call: the PyTorch device's coverage report).
struct Stats {
  std::map<std::tuple<std::string, OpId, Path>, PathCount> counts;
  PathCount totals[3];  // by Path: native, decomposed, fallback
  void reset() {
    counts.clear();
    for (PathCount& t : totals)
      t = PathCount{};
  }
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
void call_into(OpId op, std::span<const Tensor> inputs, std::span<Tensor> outputs,
               const Attrs& attrs);

// A contiguous tensor with the same values (the input itself when already contiguous).
Tensor contiguous(const Tensor& x);

// Runs one kernel on `backend`: native when supports() says so, else the op's
// decomposition on the same device (its results copied into `outputs`), else the CPU
// fallback (LOOM_STRICT applies). Inputs and outputs are ready (contiguous, on `backend`).
// Counted like any call. This is how a captured graph (graph/) replays its nodes; a
// captured node has a decomposition only when it was made by a graph pass (a fused node).
void execute(Backend& backend, OpId op, std::span<const Tensor> inputs, std::span<Tensor> outputs,
             const Attrs& attrs);

// Listens to every kernel dispatch runs, after decompositions are expanded and inputs made
// contiguous: what graph capture (graph/) records. `fresh_outputs` is true when dispatch
// allocated the outputs for this call (false for call_into, whose outputs already exist).
class Recorder {
 public:
  virtual ~Recorder() = default;
  virtual void executed(Backend& backend, OpId op, std::span<const Tensor> inputs,
                        std::span<const Tensor> outputs, const Attrs& attrs,
                        bool fresh_outputs) = 0;
};
// Installs `recorder` for calls made on this thread (nullptr removes it); returns the previous one.
Recorder* set_recorder(Recorder* recorder);
// Whether a recorder listens on this thread (a graph is being captured): code that reads a
// device tensor's values on the host asks, since a replay would repeat the values it read.
bool recording();

// When on, each native launch waits for its device to finish before it is counted, so the
// time in stats() is the device's time per op, not the host's time to enqueue it (for
// profiling asynchronous devices: `loom ops --sync`; it removes all overlap). Off by default.
void set_synchronous_timing(bool on);

}  // namespace loom::dispatch
