// Op conformance: every catalog op on every available backend against its reference
// kernel. LOOM_CONFORMANCE_MATRIX=1 also prints the op x backend coverage matrix.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <tuple>

#include "backends/cpu/cpu_backend.h"
#include "conformance/op_cases.h"
#include "dispatch/dispatch.h"
#include "test_util.h"
#ifdef LOOM_HAVE_OPENCL
#include "backends/opencl/opencl_backend.h"
#endif

namespace loom::testing {
namespace {

struct Param {
  Backend* backend;
  OpId op;
};

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  std::string name =
      std::string(info.param.backend->name()) + "_" + std::string(op_name(info.param.op));
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)))
      c = '_';
  return name;
}

std::vector<Param> all_params() {
  std::vector<Param> params;
  for (Backend* b : backends())
    for (std::size_t i = 0; i < kNumOps; ++i)
      params.push_back({b, static_cast<OpId>(i)});
  return params;
}

const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> all = all_op_cases();
  return all;
}

// The view `t` takes of its storage, taken of a copy of that storage on `backend`.
Tensor same_view_on(const Tensor& t, Backend& backend) {
  const Tensor storage_on_cpu = Tensor::view_of(
      t.storage(), 0, {static_cast<std::int64_t>(t.storage()->bytes() / dtype_size(t.dtype()))},
      {1}, t.dtype());
  const Tensor storage = storage_on_cpu.to(backend);
  Tensor view = Tensor::view_of(storage.storage(), t.offset(), t.shape(), t.strides(), t.dtype());
  EXPECT_FALSE(view.is_contiguous());
  return view;
}

// Calls of `copy` that dispatch has counted on `backend`, by any path.
std::uint64_t copy_calls(const Backend& backend) {
  std::uint64_t total = 0;
  for (const auto& [key, count] : dispatch::stats().counts)
    if (std::get<0>(key) == backend.name() && std::get<1>(key) == OpId::copy)
      total += count.calls;
  return total;
}

class Conformance : public ::testing::TestWithParam<Param> {};

TEST_P(Conformance, MatchesReferenceKernel) {
  const auto [backend, op] = GetParam();
  int checked = 0;
  for (const OpCase& c : cases()) {
    if (c.op != op)
      continue;
    // Under the sanitizers, the large products are left out on opencl: its kernels run in
    // the OpenCL driver, which the sanitizers do not instrument, and Loom's host code is the
    // same at every size (they took 90 s of the ASan suite there). The release suite runs
    // them on opencl; cpu's and the emulator's instrumented kernels run them here.
    if (kSanitizedBuild && (op == OpId::matmul || op == OpId::linear) &&
        std::string(backend->name()).rfind("opencl", 0) == 0 &&
        c.label.find("large") != std::string::npos)
      continue;
    SCOPED_TRACE(c.label);
    // A non-contiguous input stays non-contiguous on the backend: its whole storage goes
    // there and the same view is taken of it. The backend's copy kernel reads the strides;
    // every other op gets the input made contiguous first, by dispatch, on the device,
    // with that copy kernel (the "non_contiguous" cases test that path).
    std::vector<Tensor> inputs;
    bool strided = false;
    for (const Tensor& t : c.inputs) {
      strided = strided || !t.is_contiguous();
      inputs.push_back(t.is_contiguous() ? t.to(*backend) : same_view_on(t, *backend));
    }
    std::vector<Tensor> expected = run_reference(op, c.inputs, c.attrs);
    const std::uint64_t copies_before = copy_calls(*backend);
    std::vector<Tensor> actual = dispatch::call(op, inputs, c.attrs, backend);
    // A strided input reached the device as a view: the op itself read it (copy), or the
    // device's copy kernel made it contiguous first (every other op).
    if (strided && op != OpId::copy) {
      EXPECT_GT(copy_calls(*backend), copies_before)
          << "a non-contiguous input was not made contiguous on " << backend->name();
    }
    ASSERT_EQ(actual.size(), expected.size());
    for (std::size_t i = 0; i < actual.size(); ++i) {
      ASSERT_EQ(actual[i].shape(), expected[i].shape()) << "output " << i;
      ASSERT_EQ(actual[i].dtype(), expected[i].dtype()) << "output " << i;
      std::vector<double> a = values(actual[i]), e = values(expected[i]);
      if (c.measure == Measure::nmse) {
        EXPECT_LE(nmse(a, e), c.tolerance) << "output " << i;
      } else {
        EXPECT_LE(worst_ratio(a, e, c.tolerance, c.tolerance / 10), 1.0) << "output " << i;
      }
    }
    ++checked;
  }
  EXPECT_GT(checked, 0) << op_name(op) << " has no conformance case: every catalog op needs one";
}

INSTANTIATE_TEST_SUITE_P(AllOps, Conformance, ::testing::ValuesIn(all_params()), param_name);

// Precision bf16: matmul and linear on every backend that offers it equal the reference
// kernel run on operands rounded to bf16, and differ from the f32 product (so the
// rounding really happened).
// Runs each test under bf16 products on the backend (skipped where it has none), and
// puts f32 products back afterwards.
class MatmulBf16 : public ::testing::TestWithParam<Backend*> {
 protected:
  void SetUp() override {
    if (!GetParam()->set_matmul_precision(DType::bf16))
      GTEST_SKIP() << GetParam()->name() << " has no bf16 matmul";
  }
  void TearDown() override { GetParam()->set_matmul_precision(DType::f32); }
};

Tensor rounded_to_bf16(const Tensor& t) {
  std::vector<float> v = t.to_floats();
  for (float& x : v)
    x = bf16_to_float(float_to_bf16(x));
  return Tensor::from_floats(t.shape(), v, cpu());
}

TEST_P(MatmulBf16, EqualsTheReferenceOnRoundedOperands) {
  Backend* backend = GetParam();
  int checked = 0;
  double largest_change = 0;
  for (const OpCase& c : cases()) {
    if (c.op != OpId::matmul && c.op != OpId::linear)
      continue;
    // Under the sanitizers the large products (a minute of reference and emulated GEMM)
    // are left to the f32 conformance cases; the bf16 rounding path is the same at every size.
    if (kSanitizedBuild && c.label.find("large") != std::string::npos)
      continue;
    SCOPED_TRACE(c.label);
    std::vector<Tensor> inputs, rounded;
    for (std::size_t i = 0; i < c.inputs.size(); ++i) {
      inputs.push_back(c.inputs[i].defined() ? c.inputs[i].to(*backend) : c.inputs[i]);
      bool operand = i < 2;  // the bias of linear is added in f32
      rounded.push_back(c.inputs[i].defined() && operand ? rounded_to_bf16(c.inputs[i])
                                                         : c.inputs[i]);
    }
    std::vector<double> expected = values(run_reference(c.op, rounded, c.attrs)[0]);
    std::vector<double> unrounded = values(run_reference(c.op, c.inputs, c.attrs)[0]);
    std::vector<double> actual = values(dispatch::call(c.op, inputs, c.attrs, backend)[0]);
    EXPECT_LE(worst_ratio(actual, expected, 1e-4, 1e-5), 1.0);
    largest_change = std::max(largest_change, worst_ratio(actual, unrounded, 1e-4, 1e-5));
    ++checked;
  }
  EXPECT_GT(checked, 1);
  EXPECT_GT(largest_change, 1.0)
      << "bf16 products equal the f32 ones: the operands were not rounded";
}

INSTANTIATE_TEST_SUITE_P(AllBackends, MatmulBf16, ::testing::ValuesIn(backends()),
                         [](const auto& info) { return std::string(info.param->name()); });

// Under bf16 products, attention multiplies bf16 operands (q, k, v, and the probabilities
// and score gradients a device may write in bf16 directly): its results stay within
// bf16's rounding of the f32 reference, forward and backward.
TEST_P(MatmulBf16, AttentionStaysWithinBf16RoundingOfTheReference) {
  Backend* backend = GetParam();
  int checked = 0;
  for (const OpCase& c : cases()) {
    if (c.op != OpId::causal_attention && c.op != OpId::causal_attention_backward)
      continue;
    SCOPED_TRACE(c.label);
    std::vector<Tensor> inputs;
    for (const Tensor& t : c.inputs)
      inputs.push_back(t.defined() ? t.to(*backend) : t);
    std::vector<Tensor> expected = run_reference(c.op, c.inputs, c.attrs);
    std::vector<Tensor> actual = dispatch::call(c.op, inputs, c.attrs, backend);
    EXPECT_LE(worst_ratio(values(actual[0]), values(expected[0]), 3e-2, 3e-3), 1.0);
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

// The harness must be able to fail: a kernel that is off by one ulp-scale amount per
// element in a GEMM passes, one that is wrong does not.
TEST(ConformanceHarness, DetectsAWrongResult) {
  std::vector<double> reference{1.0, 2.0, 3.0}, wrong{1.0, 2.1, 3.0}, close{1.0, 2.0000001, 3.0};
  EXPECT_GT(worst_ratio(wrong, reference, 1e-4, 1e-5), 1.0);
  EXPECT_LE(worst_ratio(close, reference, 1e-4, 1e-5), 1.0);
  EXPECT_GT(nmse(wrong, reference), 1e-9);
}

#ifdef LOOM_HAVE_OPENCL
// The OpenCL backend has two GEMMs (CLBlast, and gemm_nt for CPU devices) and runs one by
// the device type: each, whichever the device, meets every matmul, linear and
// matmul_elementwise case's tolerance (linear's bias and matmul_elementwise's chain in the
// GEMM kernel, or run after CLBlast's product), and
// each call ran the GEMM the switch chose (their products may be bit-equal on a device, so
// the backend's per-GEMM call counts are the proof, not a difference in the results).
TEST(OpenClGemm, CLBlastAndGemmNtBothMatchTheReferenceOnEveryProductCase) {
  opencl::OpenClBackend* device = opencl::backend();
  if (device == nullptr)
    GTEST_SKIP() << "no OpenCL device";
  const opencl::OpenClBackend::Gemm chosen = device->gemm();
  int checked = 0;
  for (const OpCase& c : cases()) {
    if ((c.op != OpId::matmul && c.op != OpId::linear && c.op != OpId::matmul_elementwise) ||
        (kSanitizedBuild && c.label.find("large") != std::string::npos))
      continue;
    SCOPED_TRACE(c.label);
    std::vector<Tensor> inputs;
    for (const Tensor& t : c.inputs)
      inputs.push_back(t.to(*device));
    const std::vector<double> e = values(run_reference(c.op, c.inputs, c.attrs).front());
    std::vector<std::vector<double>> results;
    for (auto gemm : {opencl::OpenClBackend::Gemm::clblast, opencl::OpenClBackend::Gemm::gemm_nt}) {
      device->set_gemm(gemm);
      const std::uint64_t served = device->gemm_calls(gemm);
      results.push_back(values(dispatch::call(c.op, inputs, c.attrs, device).front()));
      const char* name = gemm == opencl::OpenClBackend::Gemm::clblast ? "clblast" : "gemm_nt";
      EXPECT_LE(nmse(results.back(), e), c.tolerance) << name;
      EXPECT_EQ(device->gemm_calls(gemm), served + 1) << name << " did not run the matmul";
    }
    ++checked;
  }
  device->set_gemm(chosen);
  EXPECT_GT(checked, 5);
}

// erf on OpenCL is Loom's own (elementwise.cl, loom_erf; the library's was a scalar call
// on CPU devices): within 3 ulp of the exact value (std::erf in double) on a dense grid
// over [-6, 6] and on tiny arguments. tools/fit_erf.py measures 2.3 ulp in float32.
TEST(OpenClErf, WithinThreeUlpOfTheExactValue) {
  opencl::OpenClBackend* device = opencl::backend();
  if (device == nullptr)
    GTEST_SKIP() << "no OpenCL device";
  std::vector<float> x;
  for (int i = -240000; i <= 240000; ++i)
    x.push_back(static_cast<float>(i) / 40000.0f);
  for (float tiny = 1e-30f; tiny < 1.0f; tiny *= 1.7f) {
    x.push_back(tiny);
    x.push_back(-tiny);
  }
  const Tensor in = Tensor::from_floats({static_cast<std::int64_t>(x.size())}, x, *device);
  const std::vector<double> y = values(dispatch::call(OpId::erf, {in}, {}, device).front());
  double worst = 0.0, at = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double exact = std::erf(static_cast<double>(x[i]));
    const float rounded = static_cast<float>(exact);
    const double ulp = rounded == 0.0f
                           ? std::numeric_limits<float>::denorm_min()
                           : std::nextafter(std::fabs(rounded), 2.0f) - std::fabs(rounded);
    const double error = std::fabs(y[i] - exact) / ulp;
    if (error > worst) {
      worst = error;
      at = x[i];
    }
  }
  EXPECT_LE(worst, 3.0) << "at x = " << at;
}

// Token ids out of range are named on every backend: the CPU and the partial backend
// check them at the call; OpenCL and CUDA on the device (a host check waited for the
// queue to drain, four times a training step), where an id outside its range is used for
// nothing and the next read of a result names the op, the id and the range. The check is
// then clear: the next call runs and reads as usual.
class TokenIds : public ::testing::TestWithParam<Backend*> {};

TEST_P(TokenIds, AnIdOutOfRangeIsNamedByTheNextReadOfAResult) {
  Backend* device = GetParam();
  nn::Rng rng(3);
  const Tensor table = random({5, 3}, rng).to(*device);
  const Tensor logits = random({3, 4}, rng).to(*device);
  const Tensor bad_ids = Tensor::from_ints({4}, std::vector<std::int32_t>{0, 7, 2, -1}, *device);
  const Tensor bad_targets = Tensor::from_ints({3}, std::vector<std::int32_t>{1, 9, 0}, *device);
  const Tensor good_ids = Tensor::from_ints({2}, std::vector<std::int32_t>{1, 4}, *device);
  // The call, then a read of its first result: one of the two throws, naming the op (or,
  // where the backend runs it as its decomposition, the sub-op `alias`).
  auto fails = [](const std::function<Tensor()>& call, const std::string& op,
                  const std::string& range, const std::string& alias = "") {
    const std::string what = error_of([&] { (void)values(call()); });
    EXPECT_TRUE(what.rfind(op + ": index ", 0) == 0 ||
                (!alias.empty() && what.rfind(alias + ": index ", 0) == 0))
        << "'" << what << "'";
    EXPECT_NE(what.find("outside " + range), std::string::npos) << what;
  };
  fails(
      [&] {
        return dispatch::call(OpId::embedding, {table, bad_ids}, {}, device)[0];
      },
      "embedding", "[0, 5)");
  // Cleared: a call with good ids reads the table's rows.
  const std::vector<double> rows =
      values(dispatch::call(OpId::embedding, {table, good_ids}, {}, device)[0]);
  const std::vector<double> all = values(table);
  EXPECT_EQ(std::vector<double>(rows.begin(), rows.begin() + 3),
            std::vector<double>(all.begin() + 3, all.begin() + 6));
  Attrs backward;
  backward.shape = {5, 3};
  const Tensor dy = random({4, 3}, rng).to(*device);
  fails(
      [&] {
        return dispatch::call(OpId::embedding_backward, {dy, bad_ids}, backward, device)[0];
      },
      "embedding_backward", "[0, 5)");
  fails(
      [&] {
        return dispatch::call(OpId::embedding_backward_add, {table, dy, bad_ids}, {}, device)[0];
      },
      "embedding_backward_add", "[0, 5)", "embedding_backward");
  fails(
      [&] {
        return dispatch::call(OpId::cross_entropy, {logits, bad_targets}, {}, device)[0];
      },
      "cross_entropy", "[0, 4)");
  const Tensor one = Tensor::from_floats({}, std::vector<float>{1.0f}, *device);
  const Tensor good_targets = Tensor::from_ints({3}, std::vector<std::int32_t>{1, 3, 0}, *device);
  const Tensor row_lse = dispatch::call(OpId::cross_entropy, {logits, good_targets}, {}, device)[1];
  fails(
      [&] {
        return dispatch::call(OpId::cross_entropy_backward, {one, logits, bad_targets, row_lse}, {},
                              device)[0];
      },
      "cross_entropy_backward", "[0, 4)");
  EXPECT_NO_THROW((void)values(dispatch::call(OpId::embedding, {table, good_ids}, {}, device)[0]));
}

// The embedding's gradient sums each id's rows in token order on every backend (the
// devices group the tokens by id on the device, keeping their order): the CPU's bits,
// for many tokens over few ids in a shuffled order.
TEST_P(TokenIds, EmbeddingBackwardSumsEachIdsRowsInTokenOrder) {
  Backend* device = GetParam();
  nn::Rng rng(11);
  const std::int64_t tokens = 600, vocab = 9, width = 37;
  std::vector<std::int32_t> ids(tokens);
  for (auto& id : ids)
    id = static_cast<std::int32_t>(rng.next() % 7);  // ids 7 and 8 never occur: zero rows
  const Tensor dy = random({tokens, width}, rng, -1.0f, 1.0f);
  const Tensor id_tensor = Tensor::from_ints({tokens}, ids, cpu());
  Attrs a;
  a.shape = {vocab, width};
  const std::vector<double> expected =
      values(dispatch::call(OpId::embedding_backward, {dy, id_tensor}, a, &cpu())[0]);
  const std::vector<double> actual = values(dispatch::call(
      OpId::embedding_backward, {dy.to(*device), id_tensor.to(*device)}, a, device)[0]);
  EXPECT_EQ(actual, expected);
  for (std::int64_t j = 7 * width; j < vocab * width; ++j)
    ASSERT_EQ(actual[static_cast<std::size_t>(j)], 0.0) << "element " << j;
  // Onto a gradient already there (a tied table): the scatter, then the sum, bit for bit.
  const Tensor base = random({vocab, width}, rng).to(*device);
  const Tensor scatter = dispatch::call(OpId::embedding_backward,
                                        {dy.to(*device), id_tensor.to(*device)}, a, device)[0];
  EXPECT_EQ(values(dispatch::call(OpId::embedding_backward_add,
                                  {base, dy.to(*device), id_tensor.to(*device)}, {}, device)[0]),
            values(dispatch::call(OpId::add, {base, scatter}, {}, device)[0]));
}

INSTANTIATE_TEST_SUITE_P(AllBackends, TokenIds, ::testing::ValuesIn(backends()),
                         [](const auto& info) { return std::string(info.param->name()); });

// The kernels generated for fused chains (fused_elementwise, and the GEMM epilogues of
// matmul_elementwise) index in 32 bits where a call's indices fit, and in 64 bits where
// they do not (no case here is that large): each kind meets every case's tolerance, and
// gives the other's values bit for bit (the same arithmetic).
TEST(OpenClFused, NarrowAndWideIndexKernelsBothMatchTheReferenceOnEveryFusedCase) {
  opencl::OpenClBackend* device = opencl::backend();
  if (device == nullptr)
    GTEST_SKIP() << "no OpenCL device";
  int checked = 0;
  for (const OpCase& c : cases()) {
    if (c.op != OpId::fused_elementwise && c.op != OpId::matmul_elementwise)
      continue;
    SCOPED_TRACE(c.label);
    std::vector<Tensor> inputs;
    for (const Tensor& t : c.inputs)
      inputs.push_back(t.to(*device));
    const std::vector<Tensor> expected = run_reference(c.op, c.inputs, c.attrs);
    std::vector<std::vector<Tensor>> results;
    for (bool wide : {false, true}) {
      device->set_fused_index(wide ? opencl::OpenClBackend::FusedIndex::wide
                                   : opencl::OpenClBackend::FusedIndex::narrowest);
      const std::uint64_t before = device->fused_calls(wide);
      results.push_back(dispatch::call(c.op, inputs, c.attrs, device));
      EXPECT_EQ(device->fused_calls(wide), before + 1) << (wide ? "wide" : "narrow");
      for (std::size_t i = 0; i < expected.size(); ++i)
        EXPECT_LE(worst_ratio(values(results.back()[i]), values(expected[i]), c.tolerance,
                              c.tolerance / 10),
                  1.0)
            << (wide ? "wide" : "narrow") << " output " << i;
    }
    for (std::size_t i = 0; i < expected.size(); ++i)
      EXPECT_EQ(values(results[0][i]), values(results[1][i])) << "output " << i;
    ++checked;
  }
  device->set_fused_index(opencl::OpenClBackend::FusedIndex::narrowest);
  EXPECT_GT(checked, 10);
}
#endif

// The CPU's large products with their operands laid out first (a transposed A transposed,
// B's rows padded: the default under oneDNN's AVX2 kernels) and as called (the default
// under its AVX-512 ones) both match the reference, whichever this machine defaults to.
TEST(CpuGemm, RelayoutAndAsCalledBothMatchTheReference) {
  const bool chosen = cpu::gemm_transpose();
  for (bool relayout : {true, false}) {
    SCOPED_TRACE(relayout ? "relayout" : "as called");
    cpu::set_gemm_transpose(relayout);
    int transposed = 0, padded = 0, checked = 0;
    for (const OpCase& c : cases()) {
      if (c.op != OpId::matmul || c.label.find("large") == std::string::npos)
        continue;
      SCOPED_TRACE(c.label);
      std::vector<cpu::GemmRecord> records;
      cpu::record_gemms(&records);
      const std::vector<double> a = values(dispatch::call(c.op, c.inputs, c.attrs, &cpu()).front());
      cpu::record_gemms(nullptr);
      EXPECT_LE(nmse(a, values(run_reference(c.op, c.inputs, c.attrs).front())), c.tolerance);
      for (const cpu::GemmRecord& r : records) {
        transposed += r.a_transposed;
        padded += r.b_padded;
      }
      ++checked;
    }
    EXPECT_GE(checked, 3);
    EXPECT_EQ(transposed > 0, relayout);
    EXPECT_EQ(padded > 0, relayout);
  }
  cpu::set_gemm_transpose(chosen);
}

TEST(ConformanceHarness, CoverageMatrix) {
  if (std::getenv("LOOM_CONFORMANCE_MATRIX") == nullptr)
    GTEST_SKIP() << "set LOOM_CONFORMANCE_MATRIX=1 to print";
  std::printf("%-28s", "op");
  for (Backend* b : backends())
    std::printf(" %-10s", std::string(b->name()).c_str());
  std::printf("\n");
  for (std::size_t i = 0; i < kNumOps; ++i) {
    std::printf("%-28s", std::string(op_name(static_cast<OpId>(i))).c_str());
    for (Backend* b : backends()) {
      bool native = true;
      for (const OpCase& c : cases())
        if (c.op == static_cast<OpId>(i))
          native = native && b->supports(OpCall{c.op, c.inputs, {}, c.attrs});
      std::printf(" %-10s", native ? "native" : "fallback");
    }
    std::printf("\n");
  }
}

}  // namespace
}  // namespace loom::testing
