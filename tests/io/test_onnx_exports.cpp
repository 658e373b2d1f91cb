// Models exported by current PyTorch (2.x), with both of its exporters, imported by Loom:
// each gives ONNX Runtime's output on every backend, and trains, eagerly and as a captured
// graph, to the same losses. The fixtures are made by tools/export_pytorch2.py
// (tests/fixtures/onnx/pytorch2; ONNX Runtime's outputs come with them, so no ONNX
// Runtime is needed here).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "autograd/functions.h"
#include "graph/graph.h"
#include "onnx/parser.h"
#include "onnx/model.h"
#include "optim/adamw.h"
#include "test_util.h"

namespace loom::testing {
namespace {

namespace ag = loom::autograd;

std::string exports_dir() {
  return source_dir() + "/tests/fixtures/onnx/pytorch2";
}

// The exports' stems ("gpt2.dynamo", ...), sorted.
std::vector<std::string> export_names() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(exports_dir()))
    if (entry.path().extension() == ".onnx")
      names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

bool token_model(const std::string& name) {
  return name.rfind("gpt2", 0) == 0;
}

class PyTorch2Exports : public ::testing::TestWithParam<std::string> {};

// The criterion the import is held to: max |Loom - ONNX Runtime| <= 1e-4 x max(1, max
// |ONNX Runtime|), on the example input the export script recorded.
TEST_P(PyTorch2Exports, GiveOnnxRuntimesOutputs) {
  Backend& device = backend_named(GetParam());
  const std::vector<std::string> names = export_names();
  // gpt2, gpt2_dynamic, resnet, mobilenet, each from the dynamo and the TorchScript
  // exporter; resnet_train, the TorchScript exporter's training-mode export (its
  // BatchNormalization on batch statistics).
  ASSERT_EQ(names.size(), 9u);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    nn::OnnxModel model(exports_dir() + "/" + name + ".onnx", device);
    if (name.find(".dynamo") != std::string::npos) {
      EXPECT_GE(model.graph().opset, 18);
    }
    const std::string data = exports_dir() + "/" + name + "/test_data_set_0/";
    Tensor x = io::read_onnx_tensor(data + "input_0.pb", cpu());
    Tensor want = io::read_onnx_tensor(data + "output_0.pb", cpu());
    ag::Tape tape;
    tape.set_recording(false);
    Tensor got = model.run(tape, {x}, {}).front().value();
    ASSERT_EQ(got.shape(), want.shape());
    std::vector<double> g = values(got), w = values(want);
    double scale = 1.0, worst = 0.0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      scale = std::max(scale, std::fabs(w[i]));
      const double diff = std::fabs(g[i] - w[i]);
      worst = std::isnan(diff) ? INFINITY : std::max(worst, diff);
    }
    EXPECT_LE(worst, 1e-4 * scale);
  }
}

struct TrainingRun {
  std::vector<double> losses;
  bool replayed = false;
  std::size_t graph_nodes = 0;
};

// `steps` AdamW steps on one batch: next-token cross entropy on random targets for the
// token models, cross entropy on random labels for the image models. In graph mode the
// forward and backward pass are captured once and replayed.
TrainingRun train(const std::string& name, Backend& device, bool graph_mode, int steps) {
  nn::OnnxModel model(exports_dir() + "/" + name + ".onnx", device);
  nn::Rng rng(17);
  const bool tokens = token_model(name);
  Tensor x = tokens ? random_ids({2, 32}, 65, rng)
                    : io::read_onnx_tensor(
                          exports_dir() + "/" + name + "/test_data_set_0/input_0.pb", cpu());
  Tensor y = tokens ? random_ids({64}, 65, rng) : random_ids({2}, 10, rng);
  x = x.to(device);
  y = y.to(device);
  optim::AdamW optimizer(model.parameters(), {0.9, 0.999, 1e-8, 0.01});
  graph::CapturedStep captured;
  TrainingRun run;
  for (int step = 0; step < steps; ++step) {
    auto eager = [&] {
      ag::Tape tape;
      ag::Var loss = ag::cross_entropy(tape, model.forward(tape, x, {true, 1}), y);
      tape.backward(loss);
      std::vector<Tensor> outs{loss.value()};
      for (const nn::Parameter& p : model.parameters())
        outs.push_back(p.var.grad());
      return outs;
    };
    if (graph_mode) {
      std::vector<Tensor> inputs{x, y};
      for (const nn::Parameter& p : model.parameters())
        inputs.push_back(p.var.value());
      std::vector<Tensor> outs = captured.run(inputs, eager);
      for (std::size_t i = 0; i < model.parameters().size(); ++i)
        model.parameters()[i].var.state()->grad = outs[i + 1];
      run.losses.push_back(outs[0].item());
      run.replayed = captured.replayed();
    } else {
      run.losses.push_back(eager()[0].item());
    }
    optimizer.step(2e-3);
    optimizer.zero_grad();
  }
  if (captured.graph() != nullptr)
    run.graph_nodes = captured.graph()->stats().nodes;
  return run;
}

// 20 steps (4 under the sanitizers, which check memory, not numbers, and on the CUDA
// emulator, whose runs check the backend's host code and kernels, not the training: 20
// emulated steps of the six exports took three minutes, the longest test of the suite):
// the loss falls by a tenth (over the short runs, at all), and the captured graph's losses
// equal the eager ones within 1e-5 relative. cpu, partial, opencl and a GPU train 20.
TEST_P(PyTorch2Exports, TrainEagerlyAndAsAGraphAlike) {
  Backend& device = backend_named(GetParam());
  const bool short_run = kSanitizedBuild || cuda_emulated(GetParam());
  const int steps = short_run ? 4 : 20;
  for (const std::string& name : export_names()) {
    // Under the sanitizers, one export of each model: the importer's host code is what
    // they check, and the second exporter adds minutes, not coverage of it.
    if (kSanitizedBuild && name.find(".torchscript") != std::string::npos)
      continue;
    // Nor on the CUDA emulator, whose runs check the backend's host code (MobileNet's
    // second export alone takes 50 s there), except the training-mode ResNet, the only
    // export of its kind. cpu, partial, opencl and a real GPU train all nine.
    if (cuda_emulated(GetParam()) && name.find(".torchscript") != std::string::npos &&
        name.rfind("resnet_train", 0) != 0)
      continue;
    // Nor MobileNet on the CUDA emulator there: its depthwise layers' column sums take
    // minutes emulated under the sanitizers, and the host code they run is cpu's too.
    if (kSanitizedBuild && GetParam() == "cuda" && name.rfind("mobilenet", 0) == 0)
      continue;
    SCOPED_TRACE(name);
    TrainingRun eager = train(name, device, false, steps);
    TrainingRun graph = train(name, device, true, steps);
    EXPECT_TRUE(graph.replayed) << "the last step did not replay the captured graph";
    EXPECT_GT(graph.graph_nodes, 0u);
    ASSERT_EQ(eager.losses.size(), graph.losses.size());
    for (std::size_t s = 0; s < eager.losses.size(); ++s)
      EXPECT_NEAR(graph.losses[s], eager.losses[s], 1e-5 * std::fabs(eager.losses[s]))
          << "step " << s;
    // By a tenth over 20 steps; over the short runs, at all.
    EXPECT_LT(eager.losses.back(), (short_run ? 1.0 : 0.9) * eager.losses.front())
        << "the loss did not fall";
  }
}

INSTANTIATE_TEST_SUITE_P(All, PyTorch2Exports, ::testing::ValuesIn(backend_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace loom::testing
