// PyTorch parity: the weights, batch, loss, gradients and 10 AdamW losses in
// tests/fixtures/gpt_parity.safetensors were computed by PyTorch
// (tools/make_parity_fixture.py); Loom must reproduce them.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "autograd/functions.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "test_util.h"

namespace loom::testing {
namespace {

namespace ag = loom::autograd;

struct Fixture {
  io::SafetensorsFile file = io::SafetensorsFile::read(source_dir() + "/tests/fixtures/gpt_parity.safetensors");
  Tensor tensor(const std::string& name) const {
    const io::SafetensorsEntry* e = file.find(name);
    if (e == nullptr) throw Error("fixture lacks " + name);
    return file.load_f32(*e, cpu());
  }
  Tensor ids(const std::string& name) const {
    std::vector<float> f = tensor(name).to_floats();
    std::vector<std::int32_t> v(f.begin(), f.end());
    return Tensor::from_ints(tensor(name).shape(), v, cpu());
  }
  std::unique_ptr<nn::Gpt> model() const {
    auto cfg = nlohmann::json::parse(file.metadata().at("config"));
    nn::GptConfig c{cfg["vocab"], cfg["context"], cfg["layers"], cfg["heads"], cfg["width"], 0.0};
    auto gpt = std::make_unique<nn::Gpt>(c, 0, cpu());
    for (nn::Parameter& p : gpt->parameters()) p.var.set_value(tensor(p.name));
    return gpt;
  }
  ag::Var loss(nn::Gpt& gpt, ag::Tape& tape) const {
    Tensor x = ids("batch.x");
    Tensor y = ids("batch.y").reshape({-1});
    return ag::cross_entropy(tape, gpt.forward(tape, x, {}), y);
  }
};

double max_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

TEST(TorchParity, LossAndEveryGradient) {
  Fixture f;
  auto gpt = f.model();
  ag::Tape tape;
  ag::Var loss = f.loss(*gpt, tape);
  double expected = f.tensor("loss").item();
  EXPECT_NEAR(loss.value().item(), expected, 1e-5 * expected);
  tape.backward(loss);
  for (nn::Parameter& p : gpt->parameters()) {
    SCOPED_TRACE(p.name);
    ASSERT_TRUE(p.var.grad().defined());
    // Largest gradient error relative to the tensor's largest gradient.
    EXPECT_LE(max_relative(values(p.var.grad()), values(f.tensor("grad." + p.name))), 1e-4);
  }
}

TEST(TorchParity, TenAdamWSteps) {
  Fixture f;
  auto gpt = f.model();
  auto cfg = nlohmann::json::parse(f.file.metadata().at("adamw"));
  optim::AdamW opt(gpt->parameters(), {cfg["betas"][0], cfg["betas"][1], cfg["eps"], cfg["weight_decay"]});
  std::vector<float> expected = f.tensor("adamw_losses").to_floats();
  for (std::size_t step = 0; step < expected.size(); ++step) {
    ag::Tape tape;
    ag::Var loss = f.loss(*gpt, tape);
    EXPECT_NEAR(loss.value().item(), expected[step], 1e-3 * expected[step]) << "step " << step;
    tape.backward(loss);
    opt.step(cfg["lr"]);
    opt.zero_grad();
  }
}

}  // namespace
}  // namespace loom::testing
