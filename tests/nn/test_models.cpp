#include <gtest/gtest.h>

#include <cmath>

#include "autograd/functions.h"
#include "core/error.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "optim/adamw.h"
#include "test_util.h"

namespace loom::testing {
namespace {

namespace ag = loom::autograd;

TEST(Gpt, HuggingFaceNamesAndShapes) {
  nn::Gpt gpt({65, 16, 2, 2, 32, 0.0}, 1, cpu());
  EXPECT_EQ(gpt.find("transformer.wte.weight")->var.shape(), (Shape{65, 32}));
  EXPECT_EQ(gpt.find("transformer.h.1.attn.c_attn.weight")->var.shape(), (Shape{32, 96}));  // Conv1D [in,out]
  EXPECT_EQ(gpt.find("transformer.h.0.mlp.c_proj.weight")->var.shape(), (Shape{128, 32}));
  EXPECT_NE(gpt.find("transformer.ln_f.bias"), nullptr);
  EXPECT_EQ(gpt.find("lm_head.weight"), nullptr);  // tied to wte
  // 12 tensors per block + wte, wpe, ln_f.{weight,bias}
  EXPECT_EQ(gpt.parameters().size(), 2u * 12u + 4u);
}

TEST(Gpt, InitialLossIsNearUniform) {
  nn::Gpt gpt({65, 16, 2, 2, 32, 0.0}, 1, cpu());
  nn::Rng rng(2);
  ag::Tape tape;
  Tensor x = random_ids({4, 16}, 65, rng), y = random_ids({64}, 65, rng);
  ag::Var loss = ag::cross_entropy(tape, gpt.forward(tape, x, {}), y);
  EXPECT_NEAR(loss.value().item(), std::log(65.0), 0.15);
}

TEST(Gpt, RejectsTooLongSequences) {
  nn::Gpt gpt({65, 8, 1, 1, 8, 0.0}, 1, cpu());
  nn::Rng rng(2);
  ag::Tape tape;
  EXPECT_THROW(gpt.forward(tape, random_ids({1, 9}, 65, rng), {}), Error);
  EXPECT_THROW(nn::Gpt({65, 8, 1, 3, 8, 0.0}, 1, cpu()), Error);  // heads must divide width
}

template <class Model>
double overfit(Model& model, const Tensor& x, const Tensor& y, int steps, double lr) {
  optim::AdamW opt(model.parameters(), {0.9, 0.99, 1e-8, 0.0});
  double last = 0;
  for (int i = 0; i < steps; ++i) {
    ag::Tape tape;
    ag::Var loss = ag::cross_entropy(tape, model.forward(tape, x, {true, 1}), y);
    last = loss.value().item();
    tape.backward(loss);
    opt.step(lr);
    opt.zero_grad();
  }
  return last;
}

TEST(Gpt, OverfitsOneBatch) {
  nn::Gpt gpt({16, 8, 2, 2, 32, 0.0}, 3, cpu());
  nn::Rng rng(4);
  Tensor x = random_ids({2, 8}, 16, rng), y = random_ids({16}, 16, rng);
  EXPECT_LT(overfit(gpt, x, y, 80, 3e-3), 0.3);
}

TEST(Gpt, DropoutIsSeededAndOffInEvaluation) {
  nn::Gpt gpt({16, 8, 1, 2, 16, 0.5}, 3, cpu());
  nn::Rng rng(4);
  Tensor x = random_ids({2, 8}, 16, rng);
  ag::Tape tape;
  auto a = gpt.forward(tape, x, {true, 7}).value().to_floats();
  auto b = gpt.forward(tape, x, {true, 7}).value().to_floats();
  auto c = gpt.forward(tape, x, {true, 8}).value().to_floats();
  auto e1 = gpt.forward(tape, x, {false, 7}).value().to_floats();
  auto e2 = gpt.forward(tape, x, {false, 8}).value().to_floats();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(e1, e2);
}

TEST(ImageModels, MlpAndCnnOverfitOneBatch) {
  nn::Rng rng(5);
  Tensor images = random({8, 1, 28, 28}, rng);
  Tensor labels = random_ids({8}, 10, rng);
  nn::Mlp mlp({}, 1, cpu());
  EXPECT_LT(overfit(mlp, images, labels, 30, 1e-3), 0.05);
  nn::Cnn cnn({}, 1, cpu());
  EXPECT_LT(overfit(cnn, images, labels, 30, 1e-3), 0.1);
}

TEST(Schedule, CosineWithWarmupMatchesNanoGpt) {
  EXPECT_DOUBLE_EQ(optim::cosine_lr(0, 1e-3, 1e-4, 100, 2000), 1e-3 * 1 / 101);
  EXPECT_DOUBLE_EQ(optim::cosine_lr(100, 1e-3, 1e-4, 100, 2000), 1e-3);
  EXPECT_NEAR(optim::cosine_lr(1050, 1e-3, 1e-4, 100, 2000), 5.5e-4, 1e-12);
  EXPECT_DOUBLE_EQ(optim::cosine_lr(2001, 1e-3, 1e-4, 100, 2000), 1e-4);
}

}  // namespace
}  // namespace loom::testing

namespace loom::testing {
namespace {

TEST(Gpt, WithoutBiasTheBiasesStayZeroAndUntrained) {
  nn::Gpt gpt({16, 8, 1, 2, 16, 0.0, /*bias=*/false}, 3, cpu());
  nn::Rng rng(4);
  Tensor x = random_ids({2, 8}, 16, rng), y = random_ids({16}, 16, rng);
  overfit(gpt, x, y, 5, 1e-2);
  for (nn::Parameter& p : gpt.parameters()) {
    if (p.name.size() < 5 || p.name.substr(p.name.size() - 5) != ".bias") continue;
    EXPECT_FALSE(p.var.requires_grad()) << p.name;
    for (float v : p.var.value().to_floats()) EXPECT_EQ(v, 0.0f) << p.name;
  }
}

}  // namespace
}  // namespace loom::testing
