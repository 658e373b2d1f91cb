#include "dispatch/dispatch.h"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <set>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"

namespace loom::dispatch {
namespace {

bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' && value[0] != '0';
}

std::string describe_inputs(std::span<const Tensor> inputs) {
  std::string s;
  for (const Tensor& t : inputs) {
    if (!s.empty())
      s += ", ";
    s += t.describe();
  }
  return s;
}

void debug_once(const std::string& backend, OpId op, Path path) {
  static const bool enabled = env_flag("LOOM_DEBUG_DISPATCH");
  if (!enabled)
    return;
  static std::mutex mutex;
  static std::set<std::tuple<std::string, OpId, Path>> seen;
  std::lock_guard lock(mutex);
  if (seen.insert({backend, op, path}).second)
    std::cerr << "[dispatch] " << backend << " " << op_name(op) << " -> " << path_name(path)
              << "\n";
}

void count(const std::string& backend, OpId op, Path path, std::uint64_t bytes, double seconds) {
  for (PathCount* c : {&stats().counts[{backend, op, path}],
                       &stats().totals[static_cast<int>(path)]}) {
    ++c->calls;
    c->bytes_moved += bytes;
    c->seconds += seconds;
  }
}

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Backend& backend_of(OpId op, std::span<const Tensor> inputs, Backend* device) {
  Backend* chosen = nullptr;
  for (const Tensor& t : inputs) {
    if (!t.defined())
      continue;
    if (chosen == nullptr)
      chosen = &t.backend();
    // The message is built only on failure: an op of many inputs (a concat of thousands of
    // slices) would otherwise describe them all at every call.
    check(&t.backend() == chosen, [&] {
      return std::string(op_name(op)) + ": inputs live on different devices (" +
             describe_inputs(inputs) + "); move them with to() first";
    });
  }
  if (chosen != nullptr)
    return *chosen;
  return device != nullptr ? *device : static_cast<Backend&>(cpu::backend());
}

thread_local Recorder* active_recorder = nullptr;
std::atomic<bool> synchronous_timing{false};

}  // namespace

void execute_decomposed(Backend& backend, OpId op, std::span<const Tensor> inputs,
                        std::span<Tensor> outputs, const Attrs& attrs);

// Runs a call whose inputs and outputs are ready on `backend`.
void execute(Backend& backend, OpId op, std::span<const Tensor> inputs, std::span<Tensor> outputs,
             const Attrs& attrs) {
  OpCall call{op, inputs, outputs, attrs};
  std::string name(backend.name());
  auto start = std::chrono::steady_clock::now();
  if (backend.supports(call)) {
    backend.launch(call, backend.default_stream());
    if (synchronous_timing.load(std::memory_order_relaxed))
      backend.default_stream().synchronize();
    count(name, op, Path::native, 0, since(start));
    debug_once(name, op, Path::native);
    return;
  }
  if (decomposition(op) != nullptr) {
    execute_decomposed(backend, op, inputs, outputs, attrs);
    return;
  }
  check(!env_flag("LOOM_STRICT"), [&] {
    return "LOOM_STRICT: " + std::string(op_name(op)) + " on " + name +
           " would fall back to the CPU (inputs: " + describe_inputs(inputs) + ")";
  });
  // CPU fallback: copy inputs to the host, run the CPU kernel, copy outputs back.
  cpu::CpuBackend& host = cpu::backend();
  std::uint64_t moved = 0;
  std::vector<Tensor> host_inputs;
  for (const Tensor& t : inputs) {
    host_inputs.push_back(t.defined() ? t.to(host) : t);
    moved += t.defined() ? t.nbytes() : 0;
  }
  std::vector<Tensor> host_outputs;
  for (const Tensor& t : outputs)
    host_outputs.push_back(Tensor::empty(t.shape(), t.dtype(), host));
  OpCall host_call{op, host_inputs, host_outputs, attrs};
  host.launch(host_call, host.default_stream());
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    backend.upload(host_outputs[i].data<void>(), *outputs[i].storage(),
                   static_cast<std::size_t>(outputs[i].offset()) * dtype_size(outputs[i].dtype()),
                   outputs[i].nbytes());
    moved += outputs[i].nbytes();
  }
  count(name, op, Path::fallback, moved, since(start));
  debug_once(name, op, Path::fallback);
}

namespace {

// Runs a decomposition's sub-ops on one device, through dispatch again.
class DeviceRunner final : public OpRunner {
 public:
  explicit DeviceRunner(Backend& device) : device_(device) {}
  std::vector<Tensor> run(OpId op, std::span<const Tensor> inputs, const Attrs& attrs) override {
    return call(op, inputs, attrs, &device_);
  }

 private:
  Backend& device_;
};

}  // namespace

// A node the backend has no kernel for, run as its decomposition on the same device and
// copied into the outputs it must write (a fused node on a backend without a fused kernel).
// Nothing is recorded: the caller records the op itself.
void execute_decomposed(Backend& backend, OpId op, std::span<const Tensor> inputs,
                        std::span<Tensor> outputs, const Attrs& attrs) {
  auto start = std::chrono::steady_clock::now();
  Recorder* recorder = set_recorder(nullptr);
  struct Restore {
    Recorder* recorder;
    ~Restore() { set_recorder(recorder); }
  } restore{recorder};
  DeviceRunner runner(backend);
  std::vector<Tensor> results = decomposition(op)(runner, inputs, attrs);
  check(results.size() == outputs.size(), [&] {
    return std::string(op_name(op)) + ": decomposition returned the wrong number of outputs";
  });
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    check(results[i].numel() == outputs[i].numel(), [&] {
      return std::string(op_name(op)) + ": decomposition output " + std::to_string(i) + " is " +
             results[i].describe() + ", expected " + outputs[i].describe();
    });
    std::array<Tensor, 1> from{contiguous(results[i]).reshape(outputs[i].shape())};
    std::array<Tensor, 1> to{outputs[i]};
    execute(backend, OpId::copy, from, to, Attrs{});
  }
  count(std::string(backend.name()), op, Path::decomposed, 0, since(start));
  debug_once(std::string(backend.name()), op, Path::decomposed);
}

namespace {

// Runs the kernel, then tells the recorder (if any) what ran.
void run_recorded(Backend& backend, OpId op, std::span<const Tensor> inputs,
                  std::span<Tensor> outputs, const Attrs& attrs, bool fresh_outputs) {
  execute(backend, op, inputs, outputs, attrs);
  if (active_recorder != nullptr)
    active_recorder->executed(backend, op, inputs, outputs, attrs, fresh_outputs);
}

}  // namespace

void set_synchronous_timing(bool on) {
  synchronous_timing.store(on);
}

Recorder* set_recorder(Recorder* recorder) {
  Recorder* previous = active_recorder;
  active_recorder = recorder;
  return previous;
}

bool recording() {
  return active_recorder != nullptr;
}

const char* path_name(Path path) {
  switch (path) {
    case Path::native:
      return "native";
    case Path::decomposed:
      return "decomposed";
    case Path::fallback:
      return "fallback";
  }
  return "?";
}

Stats& stats() {
  static Stats instance;
  return instance;
}

Tensor contiguous(const Tensor& x) {
  if (!x.defined() || x.is_contiguous())
    return x;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.backend());
  std::array<Tensor, 1> in{x};
  std::array<Tensor, 1> out{y};
  run_recorded(x.backend(), OpId::copy, in, out, Attrs{}, true);
  return y;
}

std::vector<Tensor> call(OpId op, std::span<const Tensor> inputs, const Attrs& attrs,
                         Backend* device) {
  const OpInfo& info = op_info(op);
  // Every op call passes these checks: their messages are built only when one fails.
  check(info.num_inputs < 0 ? !inputs.empty() : static_cast<int>(inputs.size()) == info.num_inputs,
        [&] {
          return std::string(info.name) + ": got " + std::to_string(inputs.size()) +
                 " inputs, expected " +
                 (info.num_inputs < 0 ? "at least 1" : std::to_string(info.num_inputs));
        });
  Backend& backend = backend_of(op, inputs, device);
  std::vector<TensorSpec> specs = info.infer(inputs, attrs);
  std::vector<Tensor> ready;
  ready.reserve(inputs.size());
  for (const Tensor& t : inputs)
    ready.push_back(op == OpId::copy ? t : contiguous(t));
  if (DecomposeFn decompose = decomposition(op);
      decompose != nullptr && !backend.supports(OpCall{op, ready, {}, attrs})) {
    auto start = std::chrono::steady_clock::now();
    DeviceRunner runner(backend);
    std::vector<Tensor> outputs = decompose(runner, ready, attrs);
    check(outputs.size() == specs.size(), [&] {
      return std::string(info.name) + ": decomposition returned the wrong number of outputs";
    });
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      check(
          outputs[i].numel() == shape_numel(specs[i].shape) && outputs[i].dtype() == specs[i].dtype,
          [&] {
            return std::string(info.name) + ": decomposition output " + std::to_string(i) + " is " +
                   outputs[i].describe() + ", expected " + shape_str(specs[i].shape);
          });
      if (outputs[i].shape() != specs[i].shape)
        outputs[i] = contiguous(outputs[i]).reshape(specs[i].shape);
    }
    count(std::string(backend.name()), op, Path::decomposed, 0, since(start));
    debug_once(std::string(backend.name()), op, Path::decomposed);
    return outputs;
  }
  std::vector<Tensor> outputs;
  outputs.reserve(specs.size());
  for (const TensorSpec& spec : specs)
    outputs.push_back(Tensor::empty(spec.shape, spec.dtype, backend));
  run_recorded(backend, op, ready, outputs, attrs, true);
  return outputs;
}

std::vector<Tensor> call(OpId op, std::initializer_list<Tensor> inputs, const Attrs& attrs,
                         Backend* device) {
  return call(op, std::span<const Tensor>(inputs.begin(), inputs.size()), attrs, device);
}

Tensor call1(OpId op, std::initializer_list<Tensor> inputs, const Attrs& attrs) {
  return call(op, inputs, attrs).front();
}

void call_into(OpId op, std::span<const Tensor> inputs, std::span<Tensor> outputs,
               const Attrs& attrs) {
  const OpInfo& info = op_info(op);
  check(static_cast<int>(inputs.size()) == info.num_inputs &&
            (info.num_outputs < 0 || static_cast<int>(outputs.size()) == info.num_outputs),
        [&] { return std::string(info.name) + ": wrong number of inputs or outputs"; });
  Backend& backend = backend_of(op, inputs, nullptr);
  std::vector<TensorSpec> specs = info.infer(inputs, attrs);
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    check(outputs[i].shape() == specs[i].shape && outputs[i].dtype() == specs[i].dtype &&
              outputs[i].is_contiguous() && &outputs[i].backend() == &backend,
          [&] {
            return std::string(info.name) + ": output " + std::to_string(i) + " is " +
                   outputs[i].describe() + ", expected contiguous " +
                   std::string(dtype_name(specs[i].dtype)) + shape_str(specs[i].shape);
          });
  }
  std::vector<Tensor> ready;
  for (const Tensor& t : inputs)
    ready.push_back(contiguous(t));
  run_recorded(backend, op, ready, outputs, attrs, false);
}

}  // namespace loom::dispatch
