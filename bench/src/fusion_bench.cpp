// fusion_bench: an imported model's training step in eager mode, in graph mode without
// fusion and in graph mode with fusion (and fusion without its row reductions, and without
// the GEMM epilogue passes: biases folded into linear, chains into matmul_elementwise),
// side by side in one process (bench/compare_fusion).
//
// Each round runs every mode for --steps steps (each mode with a fresh model loaded from
// the file, so all start from the same weights) and keeps the median step time of each;
// the table gives the median over rounds, and the ratios. The first --warmup steps of a
// run (graph mode's capture and its checking replay among them) are not timed.
//
// Usage: fusion_bench [--device cpu] [--rounds 5] [--steps 40] [--warmup 5] [--threads 2]
//                     [--only eager|graph|fused] MODEL.onnx...
// --only runs one mode and prints its median alone: for a profiler (perf record) to see
// that mode's step without the others'.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "dispatch/devices.h"
#include "graph/graph.h"
#include "nn/init.h"
#include "onnx/model.h"
#include "optim/adamw.h"

namespace {

using namespace loom;
namespace ag = loom::autograd;

enum class Mode { eager, graph, fused_elementwise, fused_without_gemm_biases, fused };
const char* mode_name(Mode m) {
  return m == Mode::eager                       ? "eager"
         : m == Mode::graph                     ? "graph"
         : m == Mode::fused_elementwise         ? "graph + fusion without reductions"
         : m == Mode::fused_without_gemm_biases ? "graph + fusion without GEMM epilogues"
                                                : "graph + fusion";
}

struct Run {
  double median_ms = 0;
  std::size_t nodes = 0, chains = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Next-token cross entropy for a model that reads token ids, else the mean squared
// distance to a fixed target.
Run run_mode(const std::string& path, Backend& device, Mode mode, int steps, int warmup) {
  nn::OnnxModel model(path, device);
  const auto& input = model.graph().inputs.front();
  const bool tokens = input.dtype != DType::f32;
  Shape shape;
  for (std::int64_t d : input.shape)
    shape.push_back(d > 0 ? d : 2);  // a symbolic dimension: 2
  nn::Rng rng(7);
  const std::int64_t n = shape_numel(shape);
  Tensor x, y;
  if (tokens) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n)), next(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<std::int32_t>(rng.next() % 65);
      next[i] = static_cast<std::int32_t>(rng.next() % 65);
    }
    x = Tensor::from_ints(shape, ids, device);
    y = Tensor::from_ints({n}, next, device);
  } else {
    std::vector<float> in(static_cast<std::size_t>(n)), target(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
      in[i] = static_cast<float>(rng.normal(0.0, 1.0));
      target[i] = static_cast<float>(rng.normal(0.0, 1.0));
    }
    x = Tensor::from_floats(shape, in, device);
    y = Tensor::from_floats(shape, target, device);
  }
  optim::AdamW optimizer(model.parameters(), {0.9, 0.999, 1e-8, 0.01});
  graph::Passes passes;
  passes.fuse_elementwise = mode != Mode::eager && mode != Mode::graph;
  passes.merge_duplicates = passes.fuse_elementwise;
  passes.fold_gemm_biases = passes.fuse_elementwise && mode != Mode::fused_without_gemm_biases;
  passes.fold_gemm_epilogues = passes.fold_gemm_biases;
  passes.fusion.reductions = mode != Mode::fused_elementwise;
  graph::CapturedStep captured(passes);
  auto forward_backward = [&] {
    ag::Tape tape;
    ag::Var out = model.forward(tape, x, {true, 1});
    ag::Var loss;
    if (tokens) {
      loss = ag::cross_entropy(tape, out, y);
    } else {
      ag::Var diff = ag::sub(tape, out, ag::Var(y.reshape(out.shape())));
      loss = ag::mean(tape, ag::mul(tape, diff, diff));
    }
    tape.backward(loss);
    std::vector<Tensor> outs{loss.value()};
    for (const nn::Parameter& p : model.parameters())
      outs.push_back(p.var.grad());
    return outs;
  };
  std::vector<double> ms;
  for (int step = 0; step < warmup + steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    std::vector<Tensor> outs;
    if (mode == Mode::eager) {
      outs = forward_backward();
    } else {
      std::vector<Tensor> inputs{x, y};
      for (const nn::Parameter& p : model.parameters())
        inputs.push_back(p.var.value());
      const bool capturing = captured.graph() == nullptr;
      outs = captured.run(inputs, forward_backward);
      if (capturing)
        if (const char* debug = std::getenv("LOOM_DEBUG_GRAPH");
            debug != nullptr && debug[0] == '1')
          std::fprintf(stderr, "[graph] %s: the captured step after its passes:\n%s",
                       std::string(device.name()).c_str(), captured.graph()->listing().c_str());
      for (std::size_t i = 0; i < model.parameters().size(); ++i)
        model.parameters()[i].var.state()->grad = outs[i + 1];
    }
    optimizer.step(1e-3);
    optimizer.zero_grad();
    (void)outs[0].item();  // waits for the device
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e3;
    if (step >= warmup)
      ms.push_back(elapsed);
  }
  Run run{median(ms), 0, 0};
  if (captured.graph() != nullptr) {
    run.nodes = captured.graph()->stats().nodes;
    run.chains = captured.fusion().chains.size();
  }
  return run;
}

int usage(const char* message) {
  std::fprintf(stderr,
               "fusion_bench: %s\nusage: fusion_bench [--device cpu] [--rounds 5] [--steps 40] "
               "[--warmup 5] [--threads 2] [--only eager|graph|fused] MODEL.onnx...\n",
               message);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_name = "cpu";
  int rounds = 5, steps = 40, warmup = 5, threads = 2;
  std::string only;
  std::vector<std::string> models;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--device")
      device_name = value();
    else if (arg == "--rounds")
      rounds = std::atoi(value().c_str());
    else if (arg == "--steps")
      steps = std::atoi(value().c_str());
    else if (arg == "--warmup")
      warmup = std::atoi(value().c_str());
    else if (arg == "--threads")
      threads = std::atoi(value().c_str());
    else if (arg == "--only")
      only = value();
    else if (!arg.empty() && arg[0] == '-')
      return usage(("unknown option " + arg).c_str());
    else
      models.push_back(arg);
  }
  if (models.empty() || rounds < 1 || steps < 1 || warmup < 3 || threads < 1)
    return usage("give at least one model; rounds, steps and threads >= 1, warmup >= 3");
  if (!only.empty() && only != "eager" && only != "graph" && only != "fused")
    return usage(("--only takes eager, graph or fused, not '" + only + "'").c_str());
  try {
    cpu::set_num_threads(threads);
    Backend& device = dispatch::device(device_name);
    std::printf("device %s, %d threads, %d rounds of %d timed steps\n\n",
                device.info().name.c_str(), threads, rounds, steps);
    if (!only.empty()) {
      const Mode mode = only == "eager" ? Mode::eager : only == "graph" ? Mode::graph : Mode::fused;
      for (const std::string& path : models) {
        std::vector<double> ms;
        for (int r = 0; r < rounds; ++r)
          ms.push_back(run_mode(path, device, mode, steps, warmup).median_ms);
        std::printf("%s %s: %.3f ms/step\n", path.c_str(), mode_name(mode), median(ms));
      }
      return 0;
    }
    std::printf(
        "| model | eager ms/step | graph ms/step | fusion without reductions ms/step | fusion "
        "without GEMM epilogues ms/step | graph + fusion ms/step | eager / fused | graph / fused | "
        "graph nodes (without reductions; without GEMM epilogues; fused) | fused chains (without "
        "reductions; fused) |\n");
    std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (const std::string& path : models) {
      std::map<Mode, std::vector<double>> ms;
      std::map<Mode, Run> last;
      for (int r = 0; r < rounds; ++r)
        for (Mode mode : {Mode::eager, Mode::graph, Mode::fused_elementwise,
                          Mode::fused_without_gemm_biases, Mode::fused}) {
          Run run = run_mode(path, device, mode, steps, warmup);
          ms[mode].push_back(run.median_ms);
          last[mode] = run;
          std::fprintf(stderr, "# %s round %d: %s %.3f ms\n", path.c_str(), r + 1, mode_name(mode),
                       run.median_ms);
        }
      const double e = median(ms[Mode::eager]), g = median(ms[Mode::graph]),
                   w = median(ms[Mode::fused_elementwise]),
                   nb = median(ms[Mode::fused_without_gemm_biases]), f = median(ms[Mode::fused]);
      std::string name = path.substr(path.find_last_of('/') + 1);
      std::printf(
          "| %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.2fx | %.2fx | %zu (%zu; %zu; %zu) | %zu; "
          "%zu |\n",
          name.c_str(), e, g, w, nb, f, e / f, g / f, last[Mode::graph].nodes,
          last[Mode::fused_elementwise].nodes, last[Mode::fused_without_gemm_biases].nodes,
          last[Mode::fused].nodes, last[Mode::fused_elementwise].chains, last[Mode::fused].chains);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusion_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
