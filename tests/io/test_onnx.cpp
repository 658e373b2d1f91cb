// ONNX import: a PyTorch-exported model gives PyTorch's outputs on every backend, trains
// in Loom, reports the ops it lacks, and bad files get clear errors.
#include <gtest/gtest.h>

#include <fstream>

#include "autograd/functions.h"
#include "core/error.h"
#include "io/onnx.h"
#include "nn/onnx_model.h"
#include "optim/adamw.h"
#include "test_util.h"

namespace loom::testing {
namespace {

namespace ag = loom::autograd;

std::string fixture(const std::string& name) {
  return source_dir() + "/tests/fixtures/onnx/" + name;
}

class OnnxOnBackend : public ::testing::TestWithParam<std::string> {};

TEST_P(OnnxOnBackend, ExportedMlpGivesPyTorchsOutputs) {
  Backend* device = nullptr;
  for (Backend* b : backends())
    if (std::string(b->name()).rfind(GetParam(), 0) == 0)
      device = b;
  ASSERT_NE(device, nullptr);
  nn::OnnxModel model(fixture("mlp_mnist.onnx"), *device);
  EXPECT_EQ(model.parameter_count(), 101770);  // 784*128 + 128 + 128*10 + 10
  Tensor x = io::read_onnx_tensor(fixture("mlp_mnist/input_0.pb"), cpu());
  Tensor want = io::read_onnx_tensor(fixture("mlp_mnist/output_0.pb"), cpu());
  EXPECT_EQ(x.shape(), (Shape{2, 1, 28, 28}));
  ag::Tape tape;
  Tensor got = model.forward(tape, x, {}).value();
  ASSERT_EQ(got.shape(), want.shape());
  EXPECT_LE(worst_ratio(values(got), values(want), 1e-5, 1e-6), 1.0);
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (Backend* b : backends()) {
    std::string name(b->name());
    names.push_back(name.substr(0, name.find(':')));
  }
  return names;
}

INSTANTIATE_TEST_SUITE_P(All, OnnxOnBackend, ::testing::ValuesIn(backend_names()),
                         [](const auto& info) { return info.param; });

TEST(Onnx, ImportedModelTrains) {
  // The parameters are the ONNX initializers under their names; gradients reach all of
  // them and a few AdamW steps on one batch lower its loss.
  nn::OnnxModel model(fixture("mlp_mnist.onnx"), cpu());
  ASSERT_EQ(model.parameters().size(), 4u);
  EXPECT_NE(model.find("net.1.weight"), nullptr);
  nn::Rng rng(3);
  Tensor x = random({16, 1, 28, 28}, rng, 0.0f, 1.0f), y = random_ids({16}, 10, rng);
  optim::AdamW optimizer(model.parameters(), {0.9, 0.999, 1e-8, 0.0});
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    ag::Tape tape;
    ag::Var loss = ag::cross_entropy(tape, model.forward(tape, x, {true, 1}), y);
    tape.backward(loss);
    for (const nn::Parameter& p : model.parameters())
      ASSERT_TRUE(p.var.grad().defined()) << p.name;
    optimizer.step(1e-3);
    optimizer.zero_grad();
    (step == 0 ? first : last) = loss.value().item();
  }
  EXPECT_LT(last, 0.5 * first);
}

TEST(Onnx, CoverageNamesTheOpsLoomLacksAndRunningStopsAtTheFirst) {
  nn::OnnxModel model(fixture("tiny_gpt_block.onnx"), cpu());
  bool erf_listed = false, gemm_supported = false;
  for (const auto& use : model.coverage()) {
    if (use.op == "Erf")
      erf_listed = !use.supported;
    if (use.op == "Gemm")
      gemm_supported = use.supported;
  }
  EXPECT_TRUE(erf_listed);
  EXPECT_TRUE(gemm_supported);
  std::vector<std::int64_t> ids(2 * 32, 1);
  Tensor idx = Tensor::from_host({2, 32}, DType::i64, ids.data(), cpu());
  ag::Tape tape;
  std::string message = error_of([&] { model.forward(tape, idx, {}); });
  EXPECT_NE(message.find("tiny_gpt_block.onnx: node"), std::string::npos) << message;
  EXPECT_NE(message.find("is not supported by Loom's importer yet"), std::string::npos) << message;
}

TEST(Onnx, BadFilesAndInputsGetClearErrors) {
  std::string dir = temp_dir("onnx_bad");
  EXPECT_NE(error_of([&] {
              io::read_onnx(dir + "/absent.onnx", cpu());
            }).find("absent.onnx: cannot open"),
            std::string::npos);
  {
    std::ofstream f(dir + "/text.onnx");
    f << "this is not a protobuf model\n";
  }
  std::string message = error_of([&] { io::read_onnx(dir + "/text.onnx", cpu()); });
  EXPECT_NE(message.find("text.onnx: not an ONNX model"), std::string::npos) << message;
  // A truncated model: the protobuf ends in the middle of a field.
  {
    std::ifstream in(fixture("mlp_mnist.onnx"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream out(dir + "/cut.onnx", std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  message = error_of([&] { io::read_onnx(dir + "/cut.onnx", cpu()); });
  EXPECT_NE(message.find("cut.onnx"), std::string::npos) << message;
  message = error_of([&] { io::read_onnx_tensor(dir + "/text.onnx", cpu()); });
  EXPECT_NE(message.find("text.onnx"), std::string::npos) << message;

  nn::OnnxModel model(fixture("mlp_mnist.onnx"), cpu());
  nn::Rng rng(1);
  ag::Tape tape;
  message = error_of([&] { model.forward(tape, random({2, 1, 28, 27}, rng), {}); });
  EXPECT_NE(message.find("input 'input'"), std::string::npos) << message;
  EXPECT_NE(message.find("[2,1,28,28]"), std::string::npos) << message;
  message = error_of([&] { model.forward(tape, random_ids({2, 784}, 5, rng), {}); });
  EXPECT_NE(message.find("expected f32"), std::string::npos) << message;
}

}  // namespace
}  // namespace loom::testing
