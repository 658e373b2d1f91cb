// Graph fusion (graph/fusion.cpp): chains of elementwise nodes become one fused node
// that computes what the chain computed, on every backend; values read outside a chain,
// in-place writes and bad programs are respected or refused.
#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <optional>

#include "autograd/functions.h"
#include "core/error.h"
#include "core/fused_elementwise.h"
#include "dispatch/dispatch.h"
#include "graph/graph.h"
#include "nn/gpt.h"
#include "onnx/model.h"
#include "optim/adamw.h"
#include "test_util.h"

#if LOOM_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace loom::testing {
namespace {

namespace ag = loom::autograd;

// y = gelu(x * w + b) * 0.5, with a per-row term: one chain of five nodes.
TEST(Fusion, AChainBecomesOneNodeThatGivesTheSameBits) {
  nn::Rng rng(1);
  Tensor x = random({6, 300}, rng), w = random({300}, rng), b = random({6, 1}, rng);
  std::array<Tensor, 3> inputs{x, w, b};
  auto step = [&](const Tensor& x, const Tensor& w, const Tensor& b) {
    Attrs half;
    half.alpha = 0.5;
    Tensor h = dispatch::call1(OpId::add, {dispatch::call1(OpId::mul, {x, w}), b});
    return dispatch::call(OpId::scale,
                          {dispatch::call1(OpId::gelu, {dispatch::call1(OpId::exp, {h})})}, half)
        .front();
  };
  graph::Capture capture(inputs);
  std::array<Tensor, 1> outputs{step(x, w, b)};
  graph::Graph g = capture.finish(outputs);
  ASSERT_EQ(g.nodes().size(), 5u);
  graph::FusionReport report = g.fuse_elementwise();
  ASSERT_EQ(g.nodes().size(), 1u) << g.listing();
  EXPECT_EQ(g.nodes()[0].op, OpId::fused_elementwise);
  ASSERT_EQ(report.chains.size(), 1u);
  EXPECT_EQ(report.chains[0].members, 5u);
  EXPECT_EQ(report.chains[0].program, "scale(gelu(exp(add(mul(x0, x1), x2))))");
  EXPECT_EQ(g.nodes()[0].inputs.size(), 3u);
  g.plan_memory();
  for (int round = 0; round < 2; ++round) {
    Tensor x2 = random({6, 300}, rng), w2 = random({300}, rng), b2 = random({6, 1}, rng);
    std::array<Tensor, 3> next{x2, w2, b2};
    g.replay(next);
    EXPECT_EQ(values(g.output(0)), values(step(x2, w2, b2))) << "round " << round;
  }
}

// A value that a non-elementwise node (here a sum) also reads must stay in memory: the
// chain ends there, and what reads it after is a second chain.
TEST(Fusion, AValueReadOutsideTheChainIsKept) {
  nn::Rng rng(2);
  Tensor x = random({4, 5}, rng);
  std::array<Tensor, 1> inputs{x};
  graph::Capture capture(inputs);
  Tensor e = dispatch::call1(OpId::exp, {dispatch::call1(OpId::mul, {x, x})});
  Tensor total = dispatch::call1(OpId::sum, {e});
  Tensor y = dispatch::call1(OpId::tanh, {dispatch::call1(OpId::add, {e, total})});
  std::array<Tensor, 1> outputs{y};
  graph::Graph g = capture.finish(outputs);
  g.fuse_elementwise();
  ASSERT_EQ(g.nodes().size(), 3u) << g.listing();
  EXPECT_EQ(g.nodes()[0].op, OpId::fused_elementwise);  // exp(mul(x, x))
  EXPECT_EQ(g.nodes()[1].op, OpId::sum);
  EXPECT_EQ(g.nodes()[2].op, OpId::fused_elementwise);  // tanh(add(e, total))
  Tensor x2 = random({4, 5}, rng);
  std::array<Tensor, 1> next{x2};
  g.replay(next);
  Tensor e2 = dispatch::call1(OpId::exp, {dispatch::call1(OpId::mul, {x2, x2})});
  Tensor want = dispatch::call1(
      OpId::tanh, {dispatch::call1(OpId::add, {e2, dispatch::call1(OpId::sum, {e2})})});
  EXPECT_EQ(values(g.output(0)), values(want));
}

// A value read again after the chain's end (here by a sum, and as a graph output) does not
// end the chain: the fused node writes it as a second and third output.
TEST(Fusion, AValueReadAfterTheChainIsWrittenByTheFusedNode) {
  nn::Rng rng(5);
  Tensor x = random({4, 50}, rng);
  std::array<Tensor, 1> inputs{x};
  auto step = [&](const Tensor& x) {
    Tensor h = dispatch::call1(OpId::mul, {x, x});
    Tensor e = dispatch::call1(OpId::exp, {h});
    Tensor y = dispatch::call1(OpId::tanh, {e});
    Tensor total = dispatch::call1(OpId::sum, {h});
    return std::vector<Tensor>{y, total, e};
  };
  graph::Capture capture(inputs);
  std::vector<Tensor> outputs = step(x);
  graph::Graph g = capture.finish(outputs);
  graph::FusionReport report = g.fuse_elementwise();
  ASSERT_EQ(g.nodes().size(), 2u) << g.listing();
  EXPECT_EQ(g.nodes()[0].op, OpId::fused_elementwise);
  EXPECT_EQ(g.nodes()[0].outputs.size(), 3u);  // h (read by the sum), e (an output), y
  EXPECT_EQ(report.chains[0].program, "mul(x0, x0); exp(mul(x0, x0)); tanh(exp(mul(x0, x0)))");
  g.plan_memory();
  Tensor x2 = random({4, 50}, rng);
  std::array<Tensor, 1> next{x2};
  g.replay(next);
  std::vector<Tensor> want = step(x2);
  for (std::size_t k = 0; k < want.size(); ++k)
    EXPECT_EQ(values(g.output(k)), values(want[k])) << "output " << k;
}

// A chain's nodes run at its end's place. A node that reads a tensor which another node
// rewrites in place before the chain ends must not move past that write.
TEST(Fusion, AnInPlaceWriteBeforeTheChainsEndKeepsTheReaderInPlace) {
  nn::Rng rng(3);
  Tensor p0 = random({3, 4}, rng), q = random({3, 4}, rng);
  auto run = [&](bool fuse) {
    Tensor p = p0.to(cpu());
    std::array<Tensor, 2> inputs{p, q};
    graph::Capture capture(inputs);
    Tensor doubled = dispatch::call1(OpId::add, {p, p});  // reads p before the write
    std::array<Tensor, 1> in{q}, out{p};
    Attrs a;
    a.alpha = 3.0;
    dispatch::call_into(OpId::scale, in, out, a);  // p = 3 q, in place
    Tensor y = dispatch::call1(OpId::mul, {doubled, q});
    std::array<Tensor, 1> outputs{y};
    graph::Graph g = capture.finish(outputs);
    if (fuse)
      g.fuse_elementwise();
    std::array<Tensor, 2> again{p0.to(cpu()), q};
    g.replay(again);
    return std::make_pair(values(g.output(0)), g.nodes().size());
  };
  auto [unfused, unfused_nodes] = run(false);
  auto [fused, fused_nodes] = run(true);
  EXPECT_EQ(fused, unfused);
  EXPECT_EQ(fused_nodes, unfused_nodes);  // add cannot join mul: scale rewrites p between them
  std::vector<double> p = values(p0), qs = values(q);
  EXPECT_EQ(unfused[0],
            static_cast<double>(static_cast<float>(p[0] + p[0]) * static_cast<float>(qs[0])));
}

TEST(Fusion, BadProgramsAreRefusedWithTheirFault) {
  nn::Rng rng(4);
  Tensor x = random({2, 3}, rng);
  auto run = [&](std::vector<ElementwiseStep> steps, std::vector<Tensor> in, Shape shape = {2, 3}) {
    auto program = std::make_shared<ElementwiseProgram>();
    program->num_inputs = static_cast<int>(in.size());
    program->steps = std::move(steps);
    Attrs a;
    a.shape = std::move(shape);
    a.program = program;
    return error_of([&] { dispatch::call(OpId::fused_elementwise, in, a); });
  };
  using S = ElementwiseStep;
  EXPECT_NE(run({S{OpId::exp, {1, -1}}}, {x})
                .find("step 0 (exp) reads register 1, expected one of the 1"),
            std::string::npos);
  EXPECT_NE(run({S{OpId::softmax, {0, -1}}}, {x})
                .find("step 0 is softmax, which is not an elementwise op"),
            std::string::npos);
  EXPECT_NE(run({S{OpId::exp, {0, 0}}}, {x}).find("takes 1 operand, got a second"),
            std::string::npos);
  EXPECT_NE(run({S{OpId::add, {0, 1}}}, {x, random({4}, rng)})
                .find("input 1 f32[4] on cpu does not broadcast to the output shape [2,3]"),
            std::string::npos);
  EXPECT_NE(run({}, {x}).find("the program has no steps"), std::string::npos);
  Attrs none;
  none.shape = {2, 3};
  EXPECT_NE(
      error_of([&] { dispatch::call(OpId::fused_elementwise, {x}, none); }).find("no program"),
      std::string::npos);
}

// A matmul whose product only a bias add reads becomes one linear node; one whose product
// something else reads too, and one whose add is not of one value per column, stay apart.
TEST(Fusion, AGemmBiasFoldsIntoLinearOnlyWhenTheAddAloneReadsTheProduct) {
  nn::Rng rng(4);
  Tensor x = random({2, 3, 8}, rng), w = random({8, 5}, rng), b = random({5}, rng),
         rows = random({3, 1}, rng);
  std::array<Tensor, 4> inputs{x, w, b, rows};
  auto step = [&](const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& rows) {
    Tensor y = dispatch::call1(OpId::add, {dispatch::call1(OpId::matmul, {x, w}), b});
    Tensor p = dispatch::call1(OpId::matmul, {x, w});
    Tensor read_twice = dispatch::call1(OpId::mul, {dispatch::call1(OpId::add, {p, b}), p});
    Tensor per_row = dispatch::call1(OpId::add, {dispatch::call1(OpId::matmul, {x, w}), rows});
    return std::array<Tensor, 3>{y, read_twice, per_row};
  };
  graph::Capture capture(inputs);
  std::array<Tensor, 3> outputs = step(x, w, b, rows);
  graph::Graph g = capture.finish(outputs);
  const std::size_t before = g.nodes().size();
  ASSERT_EQ(g.fold_gemm_biases(), 1u) << g.listing();
  EXPECT_EQ(g.nodes().size(), before - 1);
  EXPECT_EQ(g.nodes()[0].op, OpId::linear);
  EXPECT_EQ(g.stats().gemm_biases, 1u);
  g.plan_memory();
  Tensor x2 = random({2, 3, 8}, rng), w2 = random({8, 5}, rng), b2 = random({5}, rng),
         rows2 = random({3, 1}, rng);
  std::array<Tensor, 4> next{x2, w2, b2, rows2};
  g.replay(next);
  std::array<Tensor, 3> want = step(x2, w2, b2, rows2);
  for (std::size_t k = 0; k < want.size(); ++k)
    EXPECT_LE(worst_ratio(values(g.output(k)), values(want[k]), 1e-6, 1e-6), 1.0) << "output " << k;
}

// A copy or fill that repeats an earlier one on the same, unchanged inputs is dropped and
// its readers read the first one's output; one whose input was rewritten in between, or
// with other attributes, stays. The replay gives the eager step's bits.
TEST(Fusion, ARepeatedCopyOrFillIsMergedUnlessItsInputChangedInBetween) {
  nn::Rng rng(5);
  Tensor x = random({4, 6}, rng);
  std::array<Tensor, 1> inputs{x};
  auto fill = [](double value) {
    Attrs a;
    a.shape = {1};
    a.alpha = value;
    return dispatch::call1(OpId::fill, {}, a);
  };
  auto step = [&](const Tensor& x) {
    Tensor a = dispatch::contiguous(x.transpose(0, 1));
    Tensor b = dispatch::contiguous(x.transpose(0, 1));  // repeats a
    Tensor two = fill(2.0), two_again = fill(2.0), three = fill(3.0);
    Tensor t = dispatch::call1(OpId::add, {x, x});
    Tensor before = dispatch::contiguous(t.transpose(0, 1));
    Attrs triple;
    triple.alpha = 3.0;
    std::array<Tensor, 1> in{t}, out{t};
    dispatch::call_into(OpId::scale, in, out, triple);  // t rewritten in place
    Tensor after = dispatch::contiguous(t.transpose(0, 1));
    Tensor ab = dispatch::call1(OpId::mul, {a, b});
    Tensor constants =
        dispatch::call1(OpId::mul, {dispatch::call1(OpId::add, {two, two_again}), three});
    Tensor moved = dispatch::call1(OpId::sub, {after, before});
    return std::array<Tensor, 3>{ab, constants, moved};
  };
  graph::Capture capture(inputs);
  std::array<Tensor, 3> outputs = step(x);
  graph::Graph g = capture.finish(outputs);
  const std::size_t before = g.nodes().size();
  ASSERT_EQ(g.merge_duplicate_nodes(), 2u) << g.listing();
  EXPECT_EQ(g.nodes().size(), before - 2);
  EXPECT_EQ(g.stats().duplicates, 2u);
  std::size_t copies = 0, fills = 0;
  for (const graph::Node& n : g.nodes()) {
    copies += n.op == OpId::copy;
    fills += n.op == OpId::fill;
  }
  EXPECT_EQ(copies, 3u);  // a, and the two around the in-place write
  EXPECT_EQ(fills, 2u);   // 2 and 3
  g.plan_memory();
  Tensor x2 = random({4, 6}, rng);
  std::array<Tensor, 1> next{x2};
  g.replay(next);
  std::array<Tensor, 3> want = step(x2);
  for (std::size_t k = 0; k < want.size(); ++k)
    EXPECT_EQ(values(g.output(k)), values(want[k])) << "output " << k;
}

// ---- imported models train the same fused and unfused, on every backend -------------

struct Trained {
  std::vector<double> losses;
  std::vector<std::vector<double>> params;
  std::size_t nodes = 0, chains = 0, gemm_biases = 0, gemm_epilogues = 0;
};

// `steps` AdamW steps of `model` in graph mode on the batch (x, y), the forward and
// backward pass captured once and replayed: `loss_of` is the step's loss.
Trained train_in_graph(nn::Model& model, const Tensor& x, const Tensor& y,
                       const std::function<ag::Var(ag::Tape&)>& loss_of,
                       const graph::Passes& passes, int steps) {
  optim::AdamW optimizer(model.parameters(), {0.9, 0.999, 1e-8, 0.01});
  graph::CapturedStep captured(passes);
  Trained result;
  for (int step = 0; step < steps; ++step) {
    std::vector<Tensor> inputs{x, y};
    for (const nn::Parameter& p : model.parameters())
      inputs.push_back(p.var.value());
    auto eager = [&] {
      ag::Tape tape;
      ag::Var loss = loss_of(tape);
      tape.backward(loss);
      std::vector<Tensor> outs{loss.value()};
      for (const nn::Parameter& p : model.parameters())
        outs.push_back(p.var.grad());
      return outs;
    };
    std::vector<Tensor> outs = captured.run(inputs, eager);
    for (std::size_t i = 0; i < model.parameters().size(); ++i)
      model.parameters()[i].var.state()->grad = outs[i + 1];
    result.losses.push_back(outs[0].item());
    optimizer.step(3e-3);
    optimizer.zero_grad();
  }
  for (const nn::Parameter& p : model.parameters())
    result.params.push_back(values(p.var.value()));
  result.nodes = captured.graph()->stats().nodes;
  result.chains = captured.fusion().chains.size();
  result.gemm_biases = captured.fusion().gemm_biases;
  result.gemm_epilogues = captured.fusion().gemm_epilogues;
  return result;
}

// An imported model trained so. Token models (the GPT block) train on next-token cross
// entropy; float models (the encoder layer) on the mean squared distance to a target.
Trained train_imported(const std::string& name, Backend& device, const graph::Passes& passes,
                       int steps) {
  nn::OnnxModel model(source_dir() + "/tests/fixtures/onnx/" + name + ".onnx", device);
  const bool tokens = name == "tiny_gpt_block";
  nn::Rng rng(11);
  Tensor x = (tokens ? random_ids({2, 32}, 65, rng) : random({2, 16, 64}, rng)).to(device);
  Tensor y = (tokens ? random_ids({64}, 65, rng) : random({32, 64}, rng)).to(device);
  auto loss_of = [&](ag::Tape& tape) {
    ag::Var out = model.forward(tape, x, {true, 1});
    if (tokens)
      return ag::cross_entropy(tape, out, y);
    ag::Var diff = ag::sub(tape, out, ag::Var(y));
    return ag::mean(tape, ag::mul(tape, diff, diff));
  };
  return train_in_graph(model, x, y, loss_of, passes, steps);
}

// Per-step losses and final parameters of `b` within 1e-5 relative of `a`'s: the
// tolerance of a pass that rounds differently from the graph it replaces.
void expect_within_1e5(const Trained& a, const Trained& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (std::size_t s = 0; s < a.losses.size(); ++s)
    EXPECT_NEAR(b.losses[s], a.losses[s], 1e-5 * std::max(std::abs(a.losses[s]), 1e-3))
        << "step " << s;
  ASSERT_EQ(a.params.size(), b.params.size());
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    double worst = 0, scale = 0;
    for (std::size_t k = 0; k < a.params[i].size(); ++k) {
      worst = std::max(worst, std::abs(b.params[i][k] - a.params[i][k]));
      scale = std::max(scale, std::abs(a.params[i][k]));
    }
    EXPECT_LE(worst, 1e-5 * scale) << "parameter " << i;
  }
}

class FusionOnBackend : public ::testing::TestWithParam<std::string> {};

// 20 steps: per-step losses and final parameters of the fused graph equal the unfused
// graph's (bit for bit: the CPU's fused kernel does each step's float expression, and the
// other backends run the node decomposed).
TEST_P(FusionOnBackend, ImportedModelsTrainTheSameFusedAndUnfused) {
  Backend& device = backend_named(GetParam());
  graph::Passes unfused, fused, no_reductions;
  // Elementwise fusion alone: folding GEMM biases rounds differently, and so do CUDA's
  // cuBLASLt epilogues (their own tests below).
  for (graph::Passes* p : {&unfused, &fused, &no_reductions})
    p->fold_gemm_biases = p->fold_gemm_epilogues = false;
  unfused.fuse_elementwise = false;
  fused.fusion.without_kernel = true;  // on a backend without a fused kernel, the decomposition
  no_reductions.fusion.without_kernel = true;
  no_reductions.fusion.reductions = false;
  for (std::string name : {"tiny_gpt_block", "transformer_encoder_layer"}) {
    SCOPED_TRACE(name);
    Trained c = train_imported(name, device, no_reductions, 20);
    dispatch::stats().reset();
    Trained a = train_imported(name, device, unfused, 20);
    Trained b = train_imported(name, device, fused, 20);
    EXPECT_GE(b.chains, 5u);
    EXPECT_LT(b.nodes + b.chains, a.nodes) << "fusion removed fewer nodes than it made";
    // Reductions in chains: the layer norms written in primitives (forward and backward)
    // take their means and row sums into the chains around them.
    EXPECT_LT(b.nodes, c.nodes) << "no reduction joined a chain";
    EXPECT_EQ(c.losses, a.losses);
    // Every backend here computes each step's float expression as the unfused kernel
    // does (the CPU's fused kernel) or runs the unfused kernels (decomposed): the same bits.
    EXPECT_EQ(b.losses, a.losses);
    ASSERT_EQ(a.params.size(), b.params.size());
    for (std::size_t i = 0; i < a.params.size(); ++i)
      EXPECT_EQ(b.params[i], a.params[i]) << "parameter " << i;
    EXPECT_LT(b.losses.back(), a.losses.front());  // it trained
    // The fused nodes ran: natively where the backend has the kernel, else decomposed.
    const std::string backend(device.name());
    const auto& counts = dispatch::stats().counts;
    std::uint64_t ran = 0;
    for (dispatch::Path path : {dispatch::Path::native, dispatch::Path::decomposed})
      if (auto it = counts.find({backend, OpId::fused_elementwise, path}); it != counts.end())
        ran += it->second.calls;
    EXPECT_GE(ran, b.chains * 17) << "the fused nodes were not replayed";
  }
}

// The GEMM-bias pass: with it, the imported models' MatMul + Add(bias) pairs run as one
// linear node where the backend has a native linear; over 20 steps the losses and final
// parameters stay within 1e-5 relative of the unfused graph's (the GEMM's sums start from
// the bias instead of adding it after), and equal them where nothing was folded.
TEST_P(FusionOnBackend, GemmBiasesFoldIntoLinearWithinTheStatedTolerance) {
  Backend& device = backend_named(GetParam());
  graph::Passes unfused, folded;
  unfused.fuse_elementwise = folded.fuse_elementwise = false;
  unfused.fold_gemm_epilogues = folded.fold_gemm_epilogues = false;  // the bias pass alone
  unfused.fold_gemm_biases = false;
  Attrs no_attrs;
  const Tensor x = Tensor::empty({0, 0}, DType::f32, device),
               b = Tensor::empty({0}, DType::f32, device);
  Tensor y = Tensor::empty({0, 0}, DType::f32, device);
  const Tensor in[] = {x, x, b};
  Tensor out[] = {y};
  const bool native = device.supports(OpCall{OpId::linear, in, out, no_attrs});
  for (std::string name : {"tiny_gpt_block", "transformer_encoder_layer"}) {
    SCOPED_TRACE(name);
    Trained a = train_imported(name, device, unfused, 20);
    Trained b = train_imported(name, device, folded, 20);
    EXPECT_EQ(a.gemm_biases, 0u);
    if (!native) {
      EXPECT_EQ(b.gemm_biases, 0u);
      EXPECT_EQ(b.losses, a.losses);
      continue;
    }
    // Each model's linear layers are MatMul + Add in the export: forward products at least.
    EXPECT_GE(b.gemm_biases, 2u);
    EXPECT_EQ(b.nodes + b.gemm_biases, a.nodes);
    if (std::string(GetParam()) == "opencl") {
      // OpenCL adds the bias after the product's sum (in the GEMM kernel, or after
      // CLBlast's product): the unfused graph's bits, not just within the tolerance.
      EXPECT_EQ(b.losses, a.losses);
      EXPECT_EQ(b.params, a.params);
      continue;
    }
    expect_within_1e5(a, b);
  }
}

// The GEMM-epilogue pass: a product that a chain reads next runs as one
// matmul_elementwise node where the backend has that kernel for the chain (OpenCL: chains
// of adds, multiplies and selections, run in the GEMM kernel's store). Over 20 steps: the
// bits of the graph without the pass (OpenCL's linear adds its bias after the sum, as the
// program's first step does). Elsewhere nothing folds and nothing changes (the CPU runs
// matmul_elementwise as its decomposition; where a backend folds with other rounding, the
// losses must stay within 1e-5 relative).
TEST_P(FusionOnBackend, GemmEpiloguesRunTheChainOnTheProduct) {
  Backend& device = backend_named(GetParam());
  graph::Passes without, with;
  without.fold_gemm_epilogues = false;
  const Tensor x = Tensor::empty({0, 0}, DType::f32, device);
  Tensor y = Tensor::empty({0, 0}, DType::f32, device);
  auto program = std::make_shared<ElementwiseProgram>();
  program->num_inputs = 1;
  program->steps.push_back(ElementwiseStep{OpId::relu, {0, -1}});
  Attrs probe;
  probe.program = program;
  const Tensor in[] = {x, x};
  Tensor out[] = {y};
  const bool native = device.supports(OpCall{OpId::matmul_elementwise, in, out, probe});
  for (std::string name : {"tiny_gpt_block", "transformer_encoder_layer"}) {
    SCOPED_TRACE(name);
    Trained a = train_imported(name, device, without, 20);
    dispatch::stats().reset();
    Trained b = train_imported(name, device, with, 20);
    EXPECT_EQ(a.gemm_epilogues, 0u);
    if (!native) {
      EXPECT_EQ(b.gemm_epilogues, 0u);
      EXPECT_EQ(b.losses, a.losses);
      continue;
    }
    // Attention's scores feed their scale and mask, a backward product the ReLU's or an
    // elementwise gradient: two folds at least in each model.
    EXPECT_GE(b.gemm_epilogues, 2u);
    EXPECT_EQ(b.nodes + b.gemm_epilogues, a.nodes);
    const auto& counts = dispatch::stats().counts;
    auto it =
        counts.find({std::string(device.name()), OpId::matmul_elementwise, dispatch::Path::native});
    ASSERT_NE(it, counts.end()) << "no matmul_elementwise ran natively";
    EXPECT_GE(it->second.calls, b.gemm_epilogues * 17);
    if (std::string(GetParam()) == "opencl") {
      EXPECT_EQ(b.losses, a.losses);
      EXPECT_EQ(b.params, a.params);
      continue;
    }
    expect_within_1e5(a, b);
  }
}

// A product read through a reshape (as autograd reads a linear layer's [B*T, N] product as
// [B, T, N]) folds too, where the backend runs matmul_elementwise: the node works in the
// product's shape, with the chain's whole operands and outputs viewed in it and a
// per-column operand as its row. A chain whose other operand repeats over the batch (it
// has no view in the product's shape) stays unfolded. Outputs as the unfused graph's.
TEST_P(FusionOnBackend, AProductReadThroughAReshapeFolds) {
  Backend& device = backend_named(GetParam());
  nn::Rng rng(6);
  Tensor x = random({6, 4}, rng).to(device), w = random({4, 8}, rng).to(device),
         whole = random({2, 3, 8}, rng).to(device), column = random({1, 1, 8}, rng).to(device),
         per_batch = random({3, 8}, rng).to(device);
  std::array<Tensor, 5> inputs{x, w, whole, column, per_batch};
  auto step = [&](std::span<const Tensor> in) {
    auto product = [&] { return dispatch::call1(OpId::matmul, {in[0], in[1]}).reshape({2, 3, 8}); };
    Tensor folds = dispatch::call1(
        OpId::relu,
        {dispatch::call1(OpId::add, {dispatch::call1(OpId::mul, {product(), in[2]}), in[3]})});
    Tensor stays = dispatch::call1(OpId::mul, {product(), in[4]});
    return std::array<Tensor, 2>{folds, stays};
  };
  graph::Capture capture(inputs);
  std::array<Tensor, 2> outputs = step(inputs);
  graph::Graph g = capture.finish(outputs);
  g.fuse_elementwise();
  const std::size_t folded = g.fold_gemm_epilogues();
  const Tensor probe_in[] = {x, x};
  Tensor probe_out[] = {x};
  auto relu = std::make_shared<ElementwiseProgram>();
  relu->num_inputs = 1;
  relu->steps.push_back(ElementwiseStep{OpId::relu, {0, -1}});
  Attrs probe;
  probe.program = relu;
  if (!device.supports(OpCall{OpId::matmul_elementwise, probe_in, probe_out, probe})) {
    EXPECT_EQ(folded, 0u);
    return;
  }
  ASSERT_EQ(folded, 1u) << g.listing();
  for (const graph::Node& node : g.nodes()) {
    if (node.op == OpId::matmul_elementwise) {
      EXPECT_EQ(node.attrs.shape, (Shape{6, 8}));
    }
  }
  g.plan_memory();
  std::array<Tensor, 5> next{random({6, 4}, rng).to(device), random({4, 8}, rng).to(device),
                             random({2, 3, 8}, rng).to(device), random({1, 1, 8}, rng).to(device),
                             random({3, 8}, rng).to(device)};
  g.replay(next);
  std::array<Tensor, 2> want = step(next);
  for (std::size_t k = 0; k < want.size(); ++k)
    EXPECT_LE(worst_ratio(values(g.output(k)), values(want[k]), 1e-6, 1e-6), 1.0) << "output " << k;
}

// The GPT's own layers in graph mode, 20 steps with the GEMM-epilogue pass and without:
// per-step losses and final parameters within 1e-5 relative. Where the pass folds with
// other rounding (CUDA: cuBLASLt adds a residual before the bias, may sum the product in
// another order, and computes GELU its own way), that is the stated tolerance; where
// nothing folds, nothing changes. On CUDA the MLP's linear and GELU (keeping GELU's input
// for the backward pass), GELU's gradient after the product that feeds it, and both
// projections' bias and residual add run as cuBLASLt epilogues.
TEST_P(FusionOnBackend, GptTrainsWithinTheToleranceWithGemmEpilogues) {
  Backend& device = backend_named(GetParam());
  auto train = [&](const graph::Passes& passes) {
    nn::Gpt gpt({40, 16, 2, 2, 32, 0.0}, 7, device);
    nn::Rng rng(4);
    const Tensor x = random_ids({3, 16}, 40, rng).to(device),
                 y = random_ids({48}, 40, rng).to(device);  // one batch: the loss falls
    Trained result = train_in_graph(
        gpt, x, y,
        [&](ag::Tape& tape) {
          return ag::cross_entropy(tape, gpt.forward(tape, x, {true, 0}), y);
        },
        passes, 20);
    // The keys' bias: its gradient is zero in exact arithmetic (a softmax does not see a
    // shift of all of a row's scores), so its value is rounding noise that AdamW scales up
    // to the step size; any change of rounding moves it by that much. Not compared.
    for (std::size_t i = 0; i < gpt.parameters().size(); ++i)
      if (gpt.parameters()[i].name.ends_with("attn.c_attn.bias")) {
        std::vector<double>& v = result.params[i];
        v.erase(v.begin() + static_cast<std::ptrdiff_t>(v.size() / 3),
                v.begin() + static_cast<std::ptrdiff_t>(2 * v.size() / 3));
      }
    return result;
  };
  graph::Passes without, with;
  without.fold_gemm_epilogues = false;
  Trained a = train(without);
#if LOOM_HAVE_CUDA
  auto* cuda_device = dynamic_cast<cuda::CudaBackend*>(&device);
  const std::uint64_t lt_before = cuda_device ? cuda_device->lt_epilogue_calls() : 0;
#endif
  Trained b = train(with);
  EXPECT_EQ(a.gemm_epilogues, 0u);
  expect_within_1e5(a, b);
  EXPECT_LT(b.losses.back(), b.losses.front());  // it trained
#if LOOM_HAVE_CUDA
  if (cuda_device != nullptr) {
    // Per layer: the MLP's linear + GELU (GELU_AUX_BIAS) and both projections' bias and
    // residual add (BIAS, with the residual as C) forward, GELU's gradient (DGELU) backward;
    // each of them a cublasLtMatmul in each of the 19 replays (18, and the verifying step's).
    EXPECT_EQ(b.gemm_epilogues, 4u * 2);
    EXPECT_EQ(cuda_device->lt_epilogue_calls() - lt_before, b.gemm_epilogues * 19);
  }
#endif
}

INSTANTIATE_TEST_SUITE_P(All, FusionOnBackend, ::testing::ValuesIn(backend_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace loom::testing
