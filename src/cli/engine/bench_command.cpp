#include "cli/engine/bench_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "autograd/functions.h"
#include "core/error.h"
#include "dispatch/devices.h"
#include "dispatch/dispatch.h"
#include "io/atomic_file.h"
#include "nn/gpt.h"
#include "nn/init.h"
#include "optim/adamw.h"

namespace loom::cli {
namespace {

// Median seconds of `reps` runs of f (after two warm-up runs), each ended by a device
// synchronisation so asynchronous backends are timed to completion.
template <class F>
double median_seconds(Backend& device, int reps, F f) {
  for (int i = 0; i < 2; ++i)
    f();
  device.default_stream().synchronize();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto start = std::chrono::steady_clock::now();
    f();
    device.default_stream().synchronize();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

CLI::App* add_bench_command(CLI::App& app, BenchOptions& o) {
  CLI::App* bench =
      app.add_subcommand("bench", "measure a backend and write its device profile (JSON)");
  bench->add_option("--device", o.device, "backend to measure (cpu, partial, opencl, ...)");
  bench->add_option("--out", o.out, "profile file (default: profile-<device>.json)");
  bench->add_option("--chip", o.chip, "catalog chip id this device is, recorded in the profile");
  bench->add_flag("--quick", o.quick, "smaller sizes and fewer repetitions (tests)");
  return bench;
}

namespace {

// GEMM throughput by size and operand type: C[n,n] = A[n,n] B[n,n], 2 n^3 FLOPs. bf16 is
// measured where the backend offers it (set_matmul_precision), as Loom runs it: on the CPU
// an emulation, on a GPU the tensor cores. A GPU also gets the large sizes.
void measure_gemm(const BenchOptions& o, Backend& device, int reps, nn::Rng& rng,
                  nlohmann::ordered_json& profile) {
  std::vector<std::int64_t> sizes = o.quick ? std::vector<std::int64_t>{64, 256}
                                            : std::vector<std::int64_t>{256, 512, 1024, 2048};
  if (!o.quick && o.device == "cuda")
    sizes.insert(sizes.end(), {4096, 8192});
  for (DType dtype : {DType::f32, DType::bf16}) {
    if (!device.set_matmul_precision(dtype))
      continue;
    for (std::int64_t n : sizes) {
      Tensor a = nn::normal_tensor({n, n}, 1.0, rng, device),
             b = nn::normal_tensor({n, n}, 1.0, rng, device);
      double s = median_seconds(device, reps, [&] { dispatch::call1(OpId::matmul, {a, b}); });
      double tflops = 2.0 * static_cast<double>(n) * n * n / s / 1e12;
      std::string name(dtype_name(dtype));
      profile["gemm"].push_back(
          {{"dtype", name}, {"m", n}, {"n", n}, {"k", n}, {"tflops", tflops}});
      std::fprintf(stderr, "gemm %lld^3 %s: %.1f GFLOP/s\n", static_cast<long long>(n),
                   name.c_str(), tflops * 1e3);
    }
  }
  device.set_matmul_precision(DType::f32);
}

// Memory bandwidth (y = alpha x reads and writes every byte once) and launch latency (a
// one-element add, dispatch included).
void measure_memory(const BenchOptions& o, Backend& device, int reps,
                    nlohmann::ordered_json& profile) {
  std::int64_t elements = o.quick ? (1 << 20) : (16 << 20);
  Tensor x = nn::constant_tensor({elements}, 1.0f, device);
  Attrs half;
  half.alpha = 0.5;
  double s = median_seconds(device, reps, [&] { dispatch::call1(OpId::scale, {x}, half); });
  double gbs = 2.0 * static_cast<double>(elements) * 4.0 / s / 1e9;
  profile["memory_bandwidth_gbs"] = gbs;
  std::fprintf(stderr, "memory bandwidth: %.1f GB/s\n", gbs);
  Tensor one = nn::constant_tensor({1}, 1.0f, device);
  double latency = median_seconds(device, reps * 5, [&] {
    dispatch::call1(OpId::add, {one, one});
  });
  profile["launch_latency_us"] = latency * 1e6;
  std::fprintf(stderr, "launch latency: %.1f us\n", latency * 1e6);
}

// Time per operator in one training step of the default GPT.
void measure_step_ops(Backend& device, nn::Rng& rng, nlohmann::ordered_json& profile) {
  nn::Gpt gpt({65, 64, 4, 4, 128, 0.0}, 1, device);
  optim::AdamW opt(gpt.parameters(), {});
  std::vector<std::int32_t> ids(12 * 64);
  for (auto& v : ids)
    v = static_cast<std::int32_t>(rng.next() % 65);
  Tensor in = Tensor::from_ints({12, 64}, ids, device),
         target = Tensor::from_ints({12 * 64}, ids, device);
  auto step = [&] {
    autograd::Tape tape;
    tape.backward(autograd::cross_entropy(tape, gpt.forward(tape, in, {true, 1}), target));
    opt.step(1e-4);
    opt.zero_grad();
  };
  step();  // warm-up (allocations, kernel compilation)
  device.default_stream().synchronize();
  dispatch::stats().reset();
  auto start = std::chrono::steady_clock::now();
  step();
  device.default_stream().synchronize();
  profile["step_ms"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e3;
  nlohmann::ordered_json ops = nlohmann::ordered_json::object();
  for (const auto& [key, count] : dispatch::stats().counts) {
    const auto& [backend, op, path] = key;
    if (backend != device.name())
      continue;
    auto& entry = ops[std::string(op_name(op))];
    if (entry.is_null())
      entry = {{"calls", std::uint64_t{0}}, {"ms", 0.0}, {"path", dispatch::path_name(path)}};
    entry["calls"] = entry["calls"].get<std::uint64_t>() + count.calls;
    entry["ms"] = entry["ms"].get<double>() + count.seconds * 1e3;
  }
  profile["ops"] = {{"model", "default gpt (L4 d128 h4 T64 B12), one training step"},
                    {"by_op", ops}};
}

}  // namespace

int run_bench(const BenchOptions& o) {
  Backend& device = dispatch::device(o.device);
  const int reps = o.quick ? 3 : 7;
  nn::Rng rng(1);
  nlohmann::ordered_json profile{{"format", "loom-device-profile/1"},
                                 {"device", device.info().name}};
  if (!o.chip.empty())
    profile["chip"] = o.chip;
  measure_gemm(o, device, reps, rng, profile);
  measure_memory(o, device, reps, profile);
  measure_step_ops(device, rng, profile);
  std::string path = o.out.empty() ? "profile-" + o.device + ".json" : o.out;
  io::write_file_atomically(path, profile.dump(2) + "\n");
  std::printf("%s\n", path.c_str());
  return 0;
}

}  // namespace loom::cli
