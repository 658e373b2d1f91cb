// Graph mode (floor 4): a captured and replayed step gives the same numbers as eager
// execution, bit for bit, on every backend; the passes remove only dead nodes and never
// let two live tensors share memory; bad use is refused with a clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <optional>

#include "autograd/functions.h"
#include "core/error.h"
#include "dispatch/dispatch.h"
#include "graph/graph.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "test_util.h"

namespace loom::testing {
namespace {

namespace ag = loom::autograd;

struct StepResult {
  std::vector<double> loss;
  std::vector<std::vector<double>> grads;
};

// One GPT training step, eager or graph: the graph is captured on the first call and
// replayed after, with the batch, the parameters and the dropout seed as inputs.
class GptStepper {
 public:
  GptStepper(Backend& device, bool graph_mode)
      : device_(device), graph_mode_(graph_mode), gpt_({40, 16, 2, 2, 32, 0.1}, 7, device) {}

  StepResult step(const Tensor& ids, const Tensor& targets, std::uint64_t step_seed) {
    nn::ForwardOptions options{true, step_seed};
    auto& params = gpt_.parameters();
    Tensor x = ids.to(device_), y = targets.to(device_);
    std::vector<Tensor> inputs{x, y};
    for (const nn::Parameter& p : params)
      inputs.push_back(p.var.value());
    Tensor loss;
    if (!graph_mode_ || !graph_) {
      std::optional<graph::Capture> capture;
      if (graph_mode_)
        capture.emplace(inputs);
      ag::Tape tape;
      ag::Var l = ag::cross_entropy(tape, gpt_.forward(tape, x, options), y);
      tape.backward(l);
      loss = l.value();
      if (capture) {
        std::vector<Tensor> outputs{loss};
        for (const nn::Parameter& p : params)
          outputs.push_back(p.var.grad());
        graph_ = capture->finish(outputs);
        graph_->eliminate_dead_nodes();
        graph_->plan_memory();
      }
    } else {
      graph::ReplayOptions replay;
      replay.step_seed = step_seed;
      graph_->replay(inputs, replay);
      loss = graph_->output(0);
      for (std::size_t i = 0; i < params.size(); ++i)
        params[i].var.state()->grad = graph_->output(i + 1);
    }
    StepResult r{values(loss), {}};
    for (const nn::Parameter& p : params)
      r.grads.push_back(values(p.var.grad()));
    optim::AdamW(params, {}).step(1e-2);  // a fresh optimizer each step: enough to move the weights
    for (nn::Parameter& p : params)
      p.var.zero_grad();
    return r;
  }

  std::optional<graph::Graph> graph_;

 private:
  Backend& device_;
  bool graph_mode_;
  nn::Gpt gpt_;
};

class GraphOnBackend : public ::testing::TestWithParam<std::string> {};

TEST_P(GraphOnBackend, ReplayedGptStepsMatchEagerStepsBitForBit) {
  Backend* device = &backend_named(GetParam());
  GptStepper eager(*device, false), graph(*device, true);
  nn::Rng rng(3);
  for (int step = 0; step < 4; ++step) {
    // A new batch and a new dropout seed each step: replay must use both.
    Tensor ids = random_ids({3, 16}, 40, rng), targets = random_ids({48}, 40, rng);
    const std::uint64_t seed = 1000 + static_cast<std::uint64_t>(step);
    StepResult a = eager.step(ids, targets, seed), b = graph.step(ids, targets, seed);
    EXPECT_EQ(a.loss, b.loss) << "step " << step;
    ASSERT_EQ(a.grads.size(), b.grads.size());
    for (std::size_t i = 0; i < a.grads.size(); ++i)
      EXPECT_EQ(a.grads[i], b.grads[i]) << "step " << step << ", gradient " << i;
  }
  const graph::GraphStats& stats = graph.graph_->stats();
  EXPECT_GT(stats.nodes, 20u);
  EXPECT_TRUE(stats.planned);
  EXPECT_LT(stats.memory_bytes, stats.internal_bytes) << graph.graph_->summary();
}

INSTANTIATE_TEST_SUITE_P(All, GraphOnBackend, ::testing::ValuesIn(backend_names()),
                         [](const auto& info) { return info.param; });

TEST(Graph, DeadNodesAreRemovedAndLiveOnesKept) {
  nn::Rng rng(1);
  Tensor x = random({5, 7}, rng);
  std::array<Tensor, 1> inputs{x};
  graph::Capture capture(inputs);
  Tensor unused = dispatch::call1(OpId::exp, {x});  // nobody reads it
  Tensor y = dispatch::call1(OpId::mul, {x, x});
  Tensor z = dispatch::call1(OpId::add, {y, x});
  std::array<Tensor, 1> outputs{z};
  graph::Graph g = capture.finish(outputs);
  EXPECT_EQ(g.nodes().size(), 3u);
  g.eliminate_dead_nodes();
  ASSERT_EQ(g.nodes().size(), 2u);
  EXPECT_EQ(g.nodes()[0].op, OpId::mul);
  EXPECT_EQ(g.nodes()[1].op, OpId::add);
  // Replay with another input: z = x * x + x on the new values.
  Tensor x2 = random({5, 7}, rng);
  std::array<Tensor, 1> next{x2};
  g.replay(next);
  std::vector<double> got = values(g.output(0)), in = values(x2);
  for (std::size_t i = 0; i < in.size(); ++i)
    EXPECT_EQ(got[i],
              static_cast<double>(static_cast<float>(in[i] * in[i]) + static_cast<float>(in[i])));
}

TEST(Graph, InPlaceWritesToExternalStateAreKeptAndRepeated) {
  // An AdamW step captured on state the graph does not own: each replay must update the
  // parameter and moments in place, as eager steps would.
  nn::Rng rng(2);
  Tensor p0 = random({4, 6}, rng);
  auto run = [&](bool graph_mode) {
    Tensor p = p0.to(cpu()), m = Tensor::from_floats({4, 6}, std::vector<float>(24, 0.0f), cpu()),
           v = Tensor::from_floats({4, 6}, std::vector<float>(24, 0.0f), cpu());
    Attrs a;
    a.lr = 0.1;
    a.weight_decay = 0.01;
    auto step = [&] {
      Tensor g = dispatch::call1(OpId::tanh, {p});  // a gradient that depends on p
      std::array<Tensor, 4> in{p, g, m, v};
      std::array<Tensor, 3> out{p, m, v};
      dispatch::call_into(OpId::adamw_step, in, out, a);
    };
    std::array<Tensor, 1> inputs{p};
    if (!graph_mode) {
      for (int i = 0; i < 3; ++i)
        step();
      return values(p);
    }
    graph::Capture capture(inputs);
    step();
    graph::Graph g = capture.finish({});
    g.eliminate_dead_nodes();
    EXPECT_EQ(g.nodes().size(), 2u);  // no outputs, but the writes are side effects
    g.plan_memory();
    g.replay(inputs);
    g.replay(inputs);
    return values(p);
  };
  EXPECT_EQ(run(false), run(true));
}

TEST(Graph, PlannedMemoryNeverSharesBytesBetweenLiveTensors) {
  GptStepper stepper(cpu(), true);
  nn::Rng rng(4);
  stepper.step(random_ids({3, 16}, 40, rng), random_ids({48}, 40, rng), 1);
  const graph::Graph& g = *stepper.graph_;
  const auto life = g.lifetimes();
  const auto& offsets = g.arena_offsets();
  std::size_t internal = 0;
  for (std::size_t a = 0; a < g.storages().size(); ++a) {
    if (!g.storages()[a].internal || life[a].first < 0)
      continue;
    ++internal;
    ASSERT_GE(offsets[a], 0);
    for (std::size_t b = a + 1; b < g.storages().size(); ++b) {
      if (!g.storages()[b].internal || life[b].first < 0)
        continue;
      const bool same_time = life[a].first <= life[b].second && life[b].first <= life[a].second;
      const bool same_bytes =
          offsets[a] < offsets[b] + static_cast<std::int64_t>(g.storages()[b].bytes) &&
          offsets[b] < offsets[a] + static_cast<std::int64_t>(g.storages()[a].bytes);
      EXPECT_FALSE(same_time && same_bytes) << "storages " << a << " and " << b;
    }
  }
  EXPECT_GT(internal, 20u);
}

TEST(CapturedStep, CapturesThenChecksThenReplays) {
  nn::Rng rng(7);
  Tensor w = random({4, 4}, rng);
  graph::CapturedStep step;
  for (int call = 0; call < 4; ++call) {
    Tensor x = random({3, 4}, rng);  // a new input each call
    std::array<Tensor, 2> inputs{x, w};
    auto eager = [&] {
      return std::vector<Tensor>{
          dispatch::call1(OpId::tanh, {dispatch::call1(OpId::matmul, {x, w})})};
    };
    std::vector<Tensor> got = step.run(inputs, eager);
    EXPECT_EQ(values(got[0]), values(eager()[0])) << "call " << call;
    EXPECT_EQ(step.replayed(), call >= 2) << "call " << call;
  }
}

TEST(CapturedStep, AStepThatMakesTensorsOutsideDispatchIsCaughtOnTheSecondCall) {
  // The step uploads per-call host data itself: the capture sees a constant, so a replay
  // would repeat the first call's values. The second call's check refuses it.
  nn::Rng rng(8);
  graph::CapturedStep step;
  Tensor anchor = random({2, 3}, rng);
  std::array<Tensor, 1> inputs{anchor};
  for (int call = 0; call < 2; ++call) {
    auto eager = [&] {
      std::vector<float> fresh(6, static_cast<float>(call + 1));
      Tensor uploaded = Tensor::from_floats({2, 3}, fresh, cpu());
      return std::vector<Tensor>{dispatch::call1(OpId::add, {anchor, uploaded})};
    };
    std::string message = error_of([&] { step.run(inputs, eager); });
    if (call == 0)
      EXPECT_EQ(message, "");
    else
      EXPECT_NE(message.find("differs from the same step run eagerly"), std::string::npos)
          << message;
  }
}

TEST(Graph, BadUseIsRefusedWithAClearError) {
  nn::Rng rng(5);
  Tensor x = random({4, 4}, rng);
  Tensor xt = x.transpose(0, 1);
  std::array<Tensor, 1> strided{xt};
  EXPECT_NE(error_of([&] { graph::Capture c(strided); }).find("contiguous"), std::string::npos);
  std::array<Tensor, 2> shared{x, x.reshape({16})};
  EXPECT_NE(error_of([&] { graph::Capture c(shared); }).find("shares storage"), std::string::npos);

  std::array<Tensor, 1> inputs{x};
  graph::Capture capture(inputs);
  Tensor y = dispatch::call1(OpId::exp, {x});
  std::array<Tensor, 1> outputs{y};
  graph::Graph g = capture.finish(outputs);
  std::array<Tensor, 1> wrong{random({4, 5}, rng)};
  std::string message = error_of([&] { g.replay(wrong); });
  EXPECT_NE(message.find("input 0"), std::string::npos) << message;
  EXPECT_NE(message.find("[4,4]"), std::string::npos) << message;
  std::array<Tensor, 0> none{};
  EXPECT_NE(error_of([&] { g.replay(none); }).find("captured with 1"), std::string::npos);
}

TEST(Graph, ReadingOutsideADeclaredInputIsRefused) {
  nn::Rng rng(6);
  Tensor whole = random({4, 4}, rng);
  Tensor top = whole.slice(0, 0, 2);  // the declared input: rows 0-1
  std::array<Tensor, 1> inputs{top};
  graph::Capture capture(inputs);
  std::string message = error_of([&] { dispatch::call1(OpId::exp, {whole}); });
  EXPECT_NE(message.find("outside input 0"), std::string::npos) << message;
}

}  // namespace
}  // namespace loom::testing
