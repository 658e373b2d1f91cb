// Gradients: every autograd function (and so every backward op) against central finite
// differences. Forward passes run in f32; the probe loss sum(out * R) is accumulated in
// double, and eps is chosen so rounding stays far below the tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include <gtest/gtest-spi.h>
#include "autograd/functions.h"
#include "dispatch/devices.h"
#include "dispatch/dispatch.h"
#include "test_util.h"

namespace loom::testing {
namespace {

namespace ag = loom::autograd;
using Fn = std::function<ag::Var(ag::Tape&, const std::vector<ag::Var>&)>;

// The backend under test: every gradient check runs on every available backend.
Backend* current = nullptr;

class Gradcheck : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { current = &dispatch::device(GetParam()); }
};

double probe_loss(const Tensor& out, const std::vector<double>& weights) {
  std::vector<double> v = values(out);
  double total = 0.0;
  for (std::size_t i = 0; i < v.size(); ++i)
    total += v[i] * weights[i];
  return total;
}

// Checks d(sum(f(x) * R))/dx for every input x_i flagged in `differentiable`.
void gradcheck(const std::vector<Tensor>& inputs, const Fn& f,
               std::vector<bool> differentiable = {}, double eps = 1e-2, double rtol = 2e-2,
               double atol = 2e-3) {
  if (differentiable.empty())
    differentiable.assign(inputs.size(), true);
  nn::Rng rng(7);
  std::vector<ag::Var> vars;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    vars.emplace_back(inputs[i].to(*current), differentiable[i]);
  ag::Tape tape;
  ag::Var out = f(tape, vars);
  std::vector<double> weights(out.value().numel());
  for (double& w : weights)
    w = 2.0 * rng.uniform() - 1.0;
  std::vector<float> wf(weights.begin(), weights.end());
  ag::Var r(Tensor::from_floats(out.shape(), wf, *current));
  tape.backward(ag::sum(tape, ag::mul(tape, out, r)));

  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!differentiable[i])
      continue;
    SCOPED_TRACE("input " + std::to_string(i));
    ASSERT_TRUE(vars[i].grad().defined()) << "no gradient reached input " << i;
    std::vector<double> analytic = values(vars[i].grad());
    std::vector<float> base = vars[i].value().to_floats();
    std::int64_t n = static_cast<std::int64_t>(base.size());
    std::int64_t step = std::max<std::int64_t>(1, n / 48);  // probe at most ~48 elements
    for (std::int64_t j = 0; j < n; j += step) {
      auto eval = [&](float delta) {
        std::vector<float> moved = base;
        moved[j] += delta;
        std::vector<ag::Var> probe = vars;
        probe[i] = ag::Var(Tensor::from_floats(inputs[i].shape(), moved, *current));
        ag::Tape quiet;
        quiet.set_recording(false);
        return probe_loss(f(quiet, probe).value(), weights);
      };
      double numeric =
          (eval(static_cast<float>(eps)) - eval(static_cast<float>(-eps))) / (2.0 * eps);
      EXPECT_NEAR(analytic[j], numeric, atol + rtol * std::abs(numeric)) << "element " << j;
    }
  }
}

Tensor r(const Shape& s, float lo = -1.0f, float hi = 1.0f) {
  static nn::Rng rng(99);
  return random(s, rng, lo, hi);
}

// Values bounded away from 0, so kinks (relu) and the probe step never meet.
Tensor away_from_zero(const Shape& s) {
  std::vector<float> v = r(s).to_floats();
  for (float& x : v)
    x = x < 0 ? x - 0.1f : x + 0.1f;
  return Tensor::from_floats(s, v, cpu());
}

TEST_P(Gradcheck, AddSubWithBroadcast) {
  gradcheck({r({2, 3, 4}), r({4})}, [](ag::Tape& t, auto& v) { return ag::add(t, v[0], v[1]); });
  gradcheck({r({2, 1, 4}), r({3, 1})}, [](ag::Tape& t, auto& v) { return ag::sub(t, v[0], v[1]); });
}

// where: each element's gradient goes to the side it was taken from, broadcasting summed
// back; expand sums its gradient back to the input's shape.
// The math functions with a gradient, each inside its domain.
TEST_P(Gradcheck, MathFunctions) {
  for (MathFunction f :
       {MathFunction::sin, MathFunction::cos, MathFunction::tan, MathFunction::asin,
        MathFunction::acos, MathFunction::atan, MathFunction::sinh, MathFunction::cosh,
        MathFunction::asinh, MathFunction::acosh, MathFunction::atanh}) {
    SCOPED_TRACE(static_cast<int>(f));
    const bool unit =
        f == MathFunction::asin || f == MathFunction::acos || f == MathFunction::atanh;
    Tensor x = f == MathFunction::acosh ? r({3, 4}, 1.5f, 3.0f)
               : unit                   ? r({3, 4}, -0.7f, 0.7f)
                                        : r({3, 4}, -1.2f, 1.2f);
    gradcheck({x}, [f](ag::Tape& t, auto& v) { return ag::math(t, v[0], f); });
  }
}

TEST_P(Gradcheck, WhereAndExpandWithBroadcast) {
  Attrs gt;
  gt.comparison = Comparison::gt;
  Tensor cond = dispatch::call1(OpId::compare, {r({3, 4}), r({1})}, gt);
  gradcheck({r({3, 4}), r({4})}, [cond](ag::Tape& t, auto& v) {
    return ag::where(t, cond.to(v[0].value().backend()), v[0], v[1]);
  });
  gradcheck({r({3, 1})}, [](ag::Tape& t, auto& v) { return ag::expand(t, v[0], {2, 3, 5}); });
}

TEST_P(Gradcheck, MulDivWithBroadcast) {
  gradcheck({r({3, 4}), r({1, 4})}, [](ag::Tape& t, auto& v) { return ag::mul(t, v[0], v[1]); });
  gradcheck({r({3, 4}), r({3, 4}, 0.5f, 2.0f)},
            [](ag::Tape& t, auto& v) { return ag::div(t, v[0], v[1]); });
}

TEST_P(Gradcheck, UnaryFunctions) {
  gradcheck({r({3, 5})}, [](ag::Tape& t, auto& v) { return ag::scale(t, v[0], -1.5); });
  gradcheck({r({3, 5})}, [](ag::Tape& t, auto& v) { return ag::exp(t, v[0]); });
  gradcheck({r({3, 5}, 0.5f, 3.0f)}, [](ag::Tape& t, auto& v) { return ag::log(t, v[0]); });
  gradcheck({r({3, 5})}, [](ag::Tape& t, auto& v) { return ag::tanh(t, v[0]); });
  gradcheck({r({3, 5}, 0.5f, 3.0f)}, [](ag::Tape& t, auto& v) { return ag::sqrt(t, v[0]); });
  gradcheck({r({3, 5}, -2.0f, 2.0f)}, [](ag::Tape& t, auto& v) { return ag::erf(t, v[0]); });
  gradcheck({away_from_zero({3, 5})}, [](ag::Tape& t, auto& v) { return ag::relu(t, v[0]); });
  gradcheck({r({3, 5}, -3.0f, 3.0f)}, [](ag::Tape& t, auto& v) { return ag::gelu(t, v[0]); });
  gradcheck({r({6, 7})}, [](ag::Tape& t, auto& v) { return ag::dropout(t, v[0], 0.4, 11); });
}

TEST_P(Gradcheck, Reductions) {
  gradcheck({r({3, 4, 5})}, [](ag::Tape& t, auto& v) { return ag::sum(t, v[0], {0, 2}); });
  gradcheck({r({3, 4})}, [](ag::Tape& t, auto& v) { return ag::mean(t, v[0], {1}, true); });
  gradcheck({r({3, 4})}, [](ag::Tape& t, auto& v) { return ag::mean(t, v[0]); });
  gradcheck(
      {r({4, 6})}, [](ag::Tape& t, auto& v) { return ag::max(t, v[0], 1); }, {}, 1e-3);
}

TEST_P(Gradcheck, SoftmaxFamilyAndCrossEntropy) {
  gradcheck({r({4, 7}, -2.0f, 2.0f)}, [](ag::Tape& t, auto& v) { return ag::softmax(t, v[0]); });
  gradcheck({r({4, 7}, -2.0f, 2.0f)},
            [](ag::Tape& t, auto& v) { return ag::log_softmax(t, v[0]); });
  nn::Rng rng(3);
  Tensor targets = random_ids({6}, 9, rng).to(*current);
  gradcheck({r({6, 9}, -2.0f, 2.0f)},
            [targets](ag::Tape& t, auto& v) { return ag::cross_entropy(t, v[0], targets); });
}

TEST_P(Gradcheck, MatmulAllTransposes) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(std::to_string(ta) + std::to_string(tb));
      Shape a = ta ? Shape{5, 3} : Shape{3, 5}, b = tb ? Shape{4, 5} : Shape{5, 4};
      gradcheck({r(a), r(b)},
                [ta, tb](ag::Tape& t, auto& v) { return ag::matmul(t, v[0], v[1], ta, tb); });
    }
  }
  gradcheck({r({2, 3, 5}), r({5, 4})},
            [](ag::Tape& t, auto& v) { return ag::matmul(t, v[0], v[1]); });
  gradcheck({r({2, 3, 5}), r({4, 5})},
            [](ag::Tape& t, auto& v) { return ag::matmul(t, v[0], v[1], false, true); });
  gradcheck({r({2, 1, 3, 5}), r({3, 5, 4})},
            [](ag::Tape& t, auto& v) { return ag::matmul(t, v[0], v[1]); });
}

TEST_P(Gradcheck, Linear) {
  gradcheck({r({2, 3, 5}), r({5, 4}), r({4})},
            [](ag::Tape& t, auto& v) { return ag::linear(t, v[0], v[1], v[2]); });
  gradcheck({r({3, 5}), r({4, 5}), r({4})},
            [](ag::Tape& t, auto& v) { return ag::linear(t, v[0], v[1], v[2], true); });
}

TEST_P(Gradcheck, LayerNorm) {
  gradcheck(
      {r({3, 8}, -2.0f, 2.0f), r({8}), r({8})},
      [](ag::Tape& t, auto& v) { return ag::layer_norm(t, v[0], v[1], v[2]); }, {}, 5e-3);
}

TEST_P(Gradcheck, Embedding) {
  nn::Rng rng(5);
  Tensor ids = random_ids({2, 6}, 4, rng).to(*current);  // repeated ids: scatter-add must sum
  gradcheck({r({4, 3})}, [ids](ag::Tape& t, auto& v) { return ag::embedding(t, v[0], ids); });
}

TEST_P(Gradcheck, CausalAttention) {
  gradcheck({r({2, 5, 12})}, [](ag::Tape& t, auto& v) { return ag::causal_attention(t, v[0], 2); });
}

TEST_P(Gradcheck, SiluAndSwiglu) {
  gradcheck({r({3, 7}, -3.0f, 3.0f)}, [](ag::Tape& t, auto& v) { return ag::silu(t, v[0]); });
  gradcheck({r({2, 3, 5}, -3.0f, 3.0f), r({2, 3, 5})},
            [](ag::Tape& t, auto& v) { return ag::swiglu(t, v[0], v[1]); });
}

TEST_P(Gradcheck, RmsNorm) {
  gradcheck(
      {r({3, 8}, -2.0f, 2.0f), r({8})},
      [](ag::Tape& t, auto& v) { return ag::rms_norm(t, v[0], v[1], 1e-6); }, {}, 5e-3);
  gradcheck(
      {r({2, 3, 2, 4}, -2.0f, 2.0f), r({4})},  // per head (Qwen3's q/k norm)
      [](ag::Tape& t, auto& v) { return ag::rms_norm(t, v[0], v[1], 1e-6); }, {}, 5e-3);
}

TEST_P(Gradcheck, Rope) {
  // Tables of arbitrary angles: the op must rotate each (i, i + D/2) pair by its row's angle.
  nn::Rng rng(11);
  std::vector<float> c, s, ns;
  for (int i = 0; i < 5 * 3; ++i) {
    double angle = 6.0 * rng.uniform();
    c.push_back(static_cast<float>(std::cos(angle)));
    s.push_back(static_cast<float>(std::sin(angle)));
    ns.push_back(-s.back());
  }
  Tensor cos_t = Tensor::from_floats({5, 3}, c, *current);
  Tensor sin_t = Tensor::from_floats({5, 3}, s, *current);
  Tensor neg_sin = Tensor::from_floats({5, 3}, ns, *current);
  gradcheck({r({2, 5, 2, 6})},
            [&](ag::Tape& t, auto& v) { return ag::rope(t, v[0], cos_t, sin_t, neg_sin); });
}

TEST_P(Gradcheck, GroupedQueryAttention) {
  // 4 query heads over 2 key/value heads; 3 queries at the end of 5 positions (a KV cache).
  gradcheck({r({2, 5, 4, 3}), r({2, 5, 2, 3}), r({2, 5, 2, 3})},
            [](ag::Tape& t, auto& v) { return ag::attention(t, v[0], v[1], v[2]); });
  gradcheck({r({1, 3, 4, 3}), r({1, 5, 1, 3}), r({1, 5, 1, 3})},
            [](ag::Tape& t, auto& v) { return ag::attention(t, v[0], v[1], v[2]); });
}

TEST_P(Gradcheck, Conv2dAndPooling) {
  gradcheck({r({2, 2, 5, 5}), r({3, 2, 3, 3}), r({3})},
            [](ag::Tape& t, auto& v) { return ag::conv2d(t, v[0], v[1], v[2], 1, 1); });
  gradcheck({r({1, 2, 7, 7}), r({2, 2, 3, 3}), r({2})},
            [](ag::Tape& t, auto& v) { return ag::conv2d(t, v[0], v[1], v[2], 2, 0); });
  gradcheck(
      {r({1, 2, 4, 6})}, [](ag::Tape& t, auto& v) { return ag::max_pool2d(t, v[0], 2, 2); }, {},
      1e-3);
  gradcheck({r({1, 2, 4, 6})}, [](ag::Tape& t, auto& v) { return ag::avg_pool2d(t, v[0], 2, 2); });
}

TEST_P(Gradcheck, TopKValues) {
  // Random rows keep the k-th and (k+1)-th values apart by more than the finite-difference
  // step, so the choice does not move under it.
  gradcheck(
      {r({4, 8})}, [](ag::Tape& t, auto& v) { return ag::top_k(t, v[0], 2).values; }, {}, 1e-3);
  gradcheck(
      {r({2, 3, 6})}, [](ag::Tape& t, auto& v) { return ag::top_k(t, v[0], 6).values; }, {}, 1e-3);
}

TEST_P(Gradcheck, ViewsAndConcat) {
  gradcheck({r({2, 6})}, [](ag::Tape& t, auto& v) { return ag::reshape(t, v[0], {3, 4}); });
  gradcheck({r({2, 3, 4})}, [](ag::Tape& t, auto& v) { return ag::permute(t, v[0], {2, 0, 1}); });
  gradcheck({r({5, 4})}, [](ag::Tape& t, auto& v) { return ag::slice(t, v[0], 0, 1, 4); });
  gradcheck({r({2, 3}), r({2, 2})}, [](ag::Tape& t, auto& v) {
    return ag::concat(t, {v[0], v[1]}, 1);
  });
}

TEST_P(Gradcheck, ReusedVariableAccumulates) {
  // x is used twice: the gradient of x*x + x must be 2x + 1.
  gradcheck({r({4})},
            [](ag::Tape& t, auto& v) { return ag::add(t, ag::mul(t, v[0], v[0]), v[0]); });
}

TEST_P(Gradcheck, DetectsAWrongBackwardRule) {
  // A deliberately wrong rule (d/dx x^2 taken as x) must fail the check.
  EXPECT_NONFATAL_FAILURE(
      gradcheck({r({1}, 0.5f, 1.0f)},
                [](ag::Tape& t, auto& v) {
                  Tensor x = v[0].value();
                  Tensor y = dispatch::call1(OpId::mul, {x, x});
                  return t.record({v[0]}, y, [x](const Tensor& g) {
                    return std::vector<Tensor>{dispatch::call1(OpId::mul, {g, x})};
                  });
                }),
      "element");
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Gradcheck, ::testing::ValuesIn(dispatch::device_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace loom::testing

namespace loom::testing {
namespace {

// Backward seeded at a non-scalar output (a pipeline stage's boundary) with gradient g
// gives the gradient of sum(g * y); a seed of the wrong shape is refused.
TEST(TapeSeededBackward, EqualsTheGradientOfTheWeightedSum) {
  nn::Rng rng(11);
  Tensor x0 = random({3, 4}, rng), g = random({3, 4}, rng);
  autograd::Tape tape;
  autograd::Var x(x0, true);
  autograd::Var y = autograd::gelu(tape, autograd::mul(tape, x, x));
  tape.backward(y, g);
  std::vector<double> seeded = values(x.grad());

  autograd::Tape reference;
  autograd::Var x2(x0, true);
  autograd::Var weighted =
      autograd::mul(reference, autograd::gelu(reference, autograd::mul(reference, x2, x2)),
                    autograd::Var(g, false));
  reference.backward(autograd::sum(reference, weighted, {}, false));
  EXPECT_LE(worst_ratio(seeded, values(x2.grad()), 1e-6, 1e-7), 1.0);

  autograd::Tape again;
  autograd::Var x3(x0, true);
  autograd::Var y3 = autograd::gelu(again, x3);
  EXPECT_NE(error_of([&] {
              again.backward(y3, random({4, 3}, rng));
            }).find("does not match the output"),
            std::string::npos);
}

}  // namespace
}  // namespace loom::testing
