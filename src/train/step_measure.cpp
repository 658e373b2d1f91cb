#include "train/step_measure.h"

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <system_error>

#include "autograd/tape.h"
#include "core/error.h"
#include "dispatch/devices.h"
#include "nn/decoder.h"
#include "nn/init.h"
#include "onnx/model.h"
#include "optim/adamw.h"
#include "train/training_run.h"

namespace loom::train {

namespace fs = std::filesystem;

StepMeasure measure_steps(Backend& device, int warmup, int steps,
                          const std::function<void()>& step) {
  check(steps >= 1, "a measured step count of " + std::to_string(steps) + ", expected >= 1");
  for (int i = 0; i < warmup; ++i)
    step();
  dispatch::stats().reset();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i)
    step();
  StepMeasure measured;
  measured.step_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
  const auto per_step = static_cast<std::uint64_t>(steps);
  for (const auto& [key, count] : dispatch::stats().counts) {
    const auto& [backend, op, path] = key;
    if (backend != device.name())
      continue;
    OpPaths& paths = measured.ops[op];
    dispatch::PathCount share = count;
    share.calls /= per_step;
    share.bytes_moved /= per_step;
    share.seconds /= steps;
    (path == dispatch::Path::native       ? paths.native
     : path == dispatch::Path::decomposed ? paths.decomposed
                                          : paths.fallback) = share;
  }
  return measured;
}

namespace {

// A folder of the system's temporary space for one measurement, removed with it.
class TemporaryFolder {
 public:
  TemporaryFolder() {
    std::string pattern = (fs::temp_directory_path() / "loom-step-XXXXXX").string();
    check(::mkdtemp(pattern.data()) != nullptr,
          pattern + ": cannot create a temporary folder for the measured run");
    path_ = pattern;
  }
  TemporaryFolder(const TemporaryFolder&) = delete;
  TemporaryFolder& operator=(const TemporaryFolder&) = delete;
  ~TemporaryFolder() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

StepMeasure measure_training_step(TrainConfig config, const std::string& device_name, int steps) {
  TemporaryFolder folder;
  config.device = device_name;
  config.out = folder.path();
  config.resume = config.auto_resume = false;
  config.save = config.progress = config.json = false;
  config.pipeline = 1;  // one process: the step of one data-parallel replica
  config.zero = 0;
  config.init.clear();  // the weights' values do not change the step
  // The capturing step and the checked replay come before the timed steps in graph mode;
  // the run is exactly as long as the steps taken (its learning rates' schedule, and the
  // prefetcher, which fetches no batch past the last step).
  const bool graph = config.execution() == ExecutionMode::graph;
  const int warmup = graph ? 2 : (steps > 1 ? 1 : 0);
  config.steps = warmup + steps;
  config.warmup = std::min<std::int64_t>(config.warmup, config.steps);

  TrainingRun run(config);
  std::unique_ptr<StepMode> mode = make_step_mode(run);
  std::int64_t step = 0;
  StepMeasure measured = measure_steps(run.device, warmup, steps, [&] {
    const double lr = optim::cosine_lr(step, config.lr, config.min_lr, config.warmup, config.steps);
    mode->run(step);
    run.update(lr);
    ++step;
  });
  run.device.default_stream().synchronize();
  measured.vocab = run.source.text() ? run.source.vocab() : 0;
  Summary summary;
  mode->summarize(summary);
  measured.graph_nodes = summary.graph_nodes;
  measured.graph_fused_chains = summary.graph_fused_chains;
  return measured;
}

namespace {

// The ONNX graph's first input as declared and targets one per row of its logits.
void onnx_batch(nn::OnnxModel& model, nn::Rng& rng, Backend& device, SyntheticStep& s) {
  const auto& graph = model.graph();
  Shape shape;
  for (std::int64_t d : graph.inputs.front().shape)
    shape.push_back(d > 0 ? d : 1);
  const std::int64_t classes =
      !graph.outputs.front().shape.empty() && graph.outputs.front().shape.back() > 0
          ? graph.outputs.front().shape.back()
          : 2;
  if (graph.inputs.front().dtype == DType::f32) {
    s.inputs = nn::normal_tensor(shape, 1.0, rng, device);
  } else {  // integer inputs are held on the host, as the importer reads them
    std::vector<std::int32_t> x(static_cast<std::size_t>(shape_numel(shape)));
    for (auto& v : x)
      v = static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(classes));
    s.inputs = Tensor::from_ints(shape, x, dispatch::device("cpu"));
  }
  autograd::Tape probe;
  probe.set_recording(false);
  std::vector<std::int32_t> y(static_cast<std::size_t>(model.forward(probe, s.inputs, {}).dim(0)));
  for (auto& v : y)
    v = static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(classes));
  s.targets = Tensor::from_ints({static_cast<std::int64_t>(y.size())}, y, device);
}

std::vector<std::int32_t> random_ids(std::size_t n, std::uint64_t below, nn::Rng& rng) {
  std::vector<std::int32_t> ids(n);
  for (auto& v : ids)
    v = static_cast<std::int32_t>(rng.next() % below);
  return ids;
}

}  // namespace

SyntheticStep synthetic_step(const ModelSpec& spec, std::int64_t batch, Backend& device) {
  SyntheticStep s;
  s.model = make_model(spec, 1, device);
  nn::Rng rng(7);
  if (spec.kind == "gpt" || nn::is_decoder_family(spec.kind)) {
    const auto n = static_cast<std::size_t>(batch * spec.context);
    const auto vocab = static_cast<std::uint64_t>(spec.vocab);
    std::vector<std::int32_t> x = random_ids(n, vocab, rng);
    std::vector<std::int32_t> y = random_ids(n, vocab, rng);
    s.inputs = Tensor::from_ints({batch, spec.context}, x, device);
    s.targets = Tensor::from_ints({batch * spec.context}, y, device);
  } else if (auto* imported = dynamic_cast<nn::OnnxModel*>(s.model.get())) {
    onnx_batch(*imported, rng, device, s);
  } else {
    s.inputs = nn::normal_tensor({batch, 1, 28, 28}, 1.0, rng, device);
    s.targets =
        Tensor::from_ints({batch}, random_ids(static_cast<std::size_t>(batch), 10, rng), device);
  }
  return s;
}

}  // namespace loom::train
