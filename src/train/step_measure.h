// train/step_measure.h — a training step measured: its time, and every op it ran on its
// device by path (native, decomposed, fallback). `loom ops` reports it; with a training
// config (`loom ops --config JOB`, the fleet service's speed probe) the step is the one
// `loom train` runs, built from the same pieces (TrainingRun, make_step_mode).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "core/backend.h"
#include "dispatch/dispatch.h"
#include "nn/model.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace loom::train {

// One op's calls in a step, by the path dispatch took (per step).
struct OpPaths {
  dispatch::PathCount native, decomposed, fallback;
  bool used() const { return native.calls + decomposed.calls + fallback.calls > 0; }
  // The path that decides coverage: fallback if any call fell back, else decomposed, else native.
  dispatch::Path path() const {
    if (fallback.calls)
      return dispatch::Path::fallback;
    if (decomposed.calls)
      return dispatch::Path::decomposed;
    return dispatch::Path::native;
  }
};

struct StepMeasure {
  double step_seconds = 0;      // mean wall time of a timed step
  std::map<OpId, OpPaths> ops;  // the device's op calls, per step
  std::int64_t vocab = 0;       // a text model's vocabulary (0: images)
  std::optional<std::int64_t> graph_nodes, graph_fused_chains;  // graph mode: the replayed graph
};

// Runs `step` `warmup` times untimed (first-step costs: allocation, kernel selection,
// capture), then `steps` times with dispatch's counters reset first; returns the mean
// time and `device`'s op calls per timed step.
StepMeasure measure_steps(Backend& device, int warmup, int steps,
                          const std::function<void()>& step);

// The training step `config` describes, as `loom train` runs it on `device_name`: its
// model, data, dropout, precision, bias, and mode (eager; graph with or without fusion,
// measured after the capturing step and the step checked against eager execution). One
// process (pipeline and ZeRO settings are not measured: they need the job's processes);
// nothing is written (the run's folder is a temporary one, removed after).
StepMeasure measure_training_step(TrainConfig config, const std::string& device_name, int steps);

// A model built from flags alone (`loom ops --model gpt|mlp|cnn|onnx`, seed 1) and one
// batch of random data shaped for it (seed 7): token ids and targets below the vocabulary
// (gpt; `batch` windows of spec.context); normal 28x28 images and labels 0-9 (mlp, cnn);
// the ONNX graph's first input as declared (symbolic dimensions: 1), normal if float, else
// ids below the output's last axis, with targets one per row of the logits (onnx).
struct SyntheticStep {
  std::unique_ptr<nn::Model> model;
  Tensor inputs, targets;
};
SyntheticStep synthetic_step(const ModelSpec& spec, std::int64_t batch, Backend& device);

}  // namespace loom::train
