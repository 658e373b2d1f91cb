// Loom's reference kernels against PyTorch. For cast, expand, concat, sqrt, erf, max,
// max_backward, avg_pool2d and avg_pool2d_backward the CPU backend runs the reference kernel
// itself, so the conformance suite compares the oracle with itself for them. The fixtures in
// tests/fixtures/reference/<op>.json (tools/make_reference_fixtures.py, run with the pinned
// environment of scripts/python-env) hold PyTorch's results on edge cases; here each case
// runs through op_info(op).reference on CPU tensors and must match them.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/op_catalog.h"
#include "test_util.h"

namespace loom::testing {
namespace {

using nlohmann::json;

// How Loom's result must match PyTorch's.
// exact: the same bits (any NaN matches any NaN). ulp: at most max_ulp float32 ulps apart,
// zeros of the same sign. scaled: |loom - torch| <= rtol |torch| + atol_per_input * the
// largest |finite input| of the case (a sum that cancels loses ulps but not that).
struct Tolerance {
  enum Kind { exact, ulp, scaled } kind = exact;
  std::int64_t max_ulp = 0;
  double rtol = 0.0, atol_per_input = 0.0;
};

Tolerance tolerance_of(const std::string& op) {
  if (op == "sqrt")  // IEEE sqrt is correctly rounded; the expected values are too
    return {Tolerance::ulp, 1};
  if (op == "erf")  // the libm's erff against float64 erf rounded to float32
    return {Tolerance::ulp, 2};
  if (op == "avg_pool2d" || op == "avg_pool2d_backward")
    return {Tolerance::scaled, 0, 2e-7, 2e-7};
  return {};  // cast, expand, concat, max, max_backward, top_k, top_k_backward: bit for bit,
              // any NaN matches any NaN
}

// Float32 values ordered as integers, so that adjacent floats differ by one.
std::int64_t ordered(float value) {
  auto bits = std::bit_cast<std::int32_t>(value);
  return bits >= 0 ? bits : -static_cast<std::int64_t>(bits & 0x7fffffff);
}

bool floats_match(float loom, float torch, const Tolerance& tol, double input_scale) {
  if (std::isnan(loom) || std::isnan(torch))
    return std::isnan(loom) && std::isnan(torch);
  if (tol.kind == Tolerance::exact || std::isinf(loom) || std::isinf(torch))
    return std::bit_cast<std::uint32_t>(loom) == std::bit_cast<std::uint32_t>(torch);
  if (tol.kind == Tolerance::ulp) {
    if (loom == 0.0f && torch == 0.0f)
      return std::signbit(loom) == std::signbit(torch);
    return std::abs(ordered(loom) - ordered(torch)) <= tol.max_ulp;
  }
  double a = loom, b = torch;
  return std::abs(a - b) <= tol.rtol * std::abs(b) + tol.atol_per_input * input_scale;
}

float half_to_float(std::uint16_t bits, DType dtype) {
  return dtype == DType::bf16 ? bf16_to_float(bits) : f16_to_float(bits);
}

// ---- reading the fixtures -------------------------------------------------------------------

DType dtype_of(const std::string& name) {
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i32})
    if (dtype_name(d) == name)
      return d;
  throw Error("reference fixture: unknown dtype '" + name + "'");
}

float f32_of(const json& value) {
  if (value.is_string()) {
    std::string text = value.get<std::string>();
    if (text == "nan")
      return std::numeric_limits<float>::quiet_NaN();
    if (text == "inf")
      return std::numeric_limits<float>::infinity();
    if (text == "-inf")
      return -std::numeric_limits<float>::infinity();
    throw Error("reference fixture: '" + text + "' is not a number");
  }
  return static_cast<float>(value.get<double>());  // the shortest decimal of a float32
}

// {"dtype", "shape", "data"}: f32 as numbers (or "nan", "inf", "-inf"), i32 as integers,
// bf16 and f16 as their uint16 bit patterns; row-major.
Tensor tensor_of(const json& j) {
  DType dtype = dtype_of(j.at("dtype").get<std::string>());
  Shape shape = j.at("shape").get<Shape>();
  const json& data = j.at("data");
  check(static_cast<std::int64_t>(data.size()) == shape_numel(shape),
        "reference fixture: " + std::to_string(data.size()) + " values for shape " +
            shape_str(shape));
  switch (dtype) {
    case DType::f32: {
      std::vector<float> v;
      for (const json& x : data)
        v.push_back(f32_of(x));
      return Tensor::from_floats(shape, v, cpu());
    }
    case DType::i32: {
      std::vector<std::int32_t> v;
      for (const json& x : data)
        v.push_back(x.get<std::int32_t>());
      return Tensor::from_ints(shape, v, cpu());
    }
    default: {
      std::vector<std::uint16_t> v;
      for (const json& x : data)
        v.push_back(x.get<std::uint16_t>());
      return Tensor::from_host(shape, dtype, v.data(), cpu());
    }
  }
}

Attrs attrs_of(const json& j) {
  Attrs a;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key == "axis")
      a.axis = it->get<std::int64_t>();
    else if (key == "keepdim")
      a.keepdim = it->get<bool>();
    else if (key == "shape")
      a.shape = it->get<Shape>();
    else if (key == "dtype")
      a.dtype = dtype_of(it->get<std::string>());
    else if (key == "kernel")
      a.kernel = it->get<std::int64_t>();
    else if (key == "stride")
      a.stride = it->get<std::int64_t>();
    else if (key == "k")
      a.k = it->get<std::int64_t>();
    else
      throw Error("reference fixture: unknown attribute '" + key + "'");
  }
  return a;
}

json load_fixture(const std::string& op) {
  std::string path = source_dir() + "/tests/fixtures/reference/" + op + ".json";
  std::ifstream in(path);
  check(in.good(), "cannot open " + path + " (made by tools/make_reference_fixtures.py)");
  return json::parse(in);
}

// ---- running and comparing ---------------------------------------------------------------

// The reference kernel itself (not the CPU backend's kernel), on outputs filled with a
// value no case expects, so an element the kernel does not write shows.
std::vector<Tensor> run_reference_kernel(OpId op, const std::vector<Tensor>& inputs,
                                         const Attrs& attrs) {
  std::vector<TensorSpec> specs = op_info(op).infer(inputs, attrs);
  std::vector<Tensor> outputs;
  for (const TensorSpec& s : specs) {
    outputs.push_back(Tensor::empty(s.shape, s.dtype, cpu()));
    if (outputs.back().nbytes() > 0)
      std::memset(outputs.back().data<std::byte>(), 0x7b, outputs.back().nbytes());
  }
  op_info(op).reference(OpCall{op, inputs, outputs, attrs});
  return outputs;
}

double input_scale(const std::vector<Tensor>& inputs) {
  double scale = 0.0;
  for (const Tensor& t : inputs)
    if (t.dtype() == DType::f32)
      for (std::int64_t i = 0; i < t.numel(); ++i)
        if (std::isfinite(t.data<float>()[i]))
          scale = std::max(scale, std::abs(static_cast<double>(t.data<float>()[i])));
  return scale;
}

std::string show(const Tensor& t, std::int64_t i) {
  std::ostringstream s;
  s << std::setprecision(9);
  switch (t.dtype()) {
    case DType::i32:
      s << t.data<std::int32_t>()[i];
      break;
    case DType::f32: {
      float v = t.data<float>()[i];
      s << v << " (0x" << std::hex << std::bit_cast<std::uint32_t>(v) << ")";
      break;
    }
    default: {
      std::uint16_t bits = t.data<std::uint16_t>()[i];
      s << half_to_float(bits, t.dtype()) << " (0x" << std::hex << bits << ")";
    }
  }
  return s.str();
}

bool element_matches(const Tensor& loom, const Tensor& torch, std::int64_t i, const Tolerance& tol,
                     double scale) {
  switch (torch.dtype()) {
    case DType::f32:
      return floats_match(loom.data<float>()[i], torch.data<float>()[i], tol, scale);
    case DType::i32:
      return loom.data<std::int32_t>()[i] == torch.data<std::int32_t>()[i];
    case DType::bf16:
    case DType::f16: {
      std::uint16_t a = loom.data<std::uint16_t>()[i], b = torch.data<std::uint16_t>()[i];
      return a == b || (std::isnan(half_to_float(a, torch.dtype())) &&
                        std::isnan(half_to_float(b, torch.dtype())));
    }
    default:
      return false;
  }
}

struct Mismatches {
  std::int64_t count = 0;
  std::string text;  // the first few, one a line
};

void compare(const Tensor& loom, const Tensor& torch, const Tolerance& tol, double scale,
             const std::string& label, Mismatches& m) {
  if (loom.shape() != torch.shape() || loom.dtype() != torch.dtype()) {
    ++m.count;
    m.text += label + ": Loom gives " + loom.describe() + ", PyTorch " + torch.describe() + "\n";
    return;
  }
  for (std::int64_t i = 0; i < loom.numel(); ++i) {
    if (element_matches(loom, torch, i, tol, scale))
      continue;
    if (++m.count <= 6)
      m.text += label + " " + shape_str(loom.shape()) + " element " + std::to_string(i) +
                ": Loom " + show(loom, i) + ", PyTorch " + show(torch, i) + "\n";
  }
}

// ---- the tests ---------------------------------------------------------------------------

class ReferenceFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceFixture, MatchesPyTorch) {
  const std::string op_text = GetParam();
  json fixture = load_fixture(op_text);
  OpId op;
  ASSERT_TRUE(find_op(op_text, op)) << op_text;
  ASSERT_EQ(fixture.at("op").get<std::string>(), op_text);
  const std::string torch_version = fixture.at("torch").get<std::string>();
  const json& cases = fixture.at("cases");
  ASSERT_GE(cases.size(), 5u) << "too few cases in " << op_text << ".json";
  const Tolerance tol = tolerance_of(op_text);
  for (const json& c : cases) {
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE(op_text + "/" + name + " (PyTorch " + torch_version + ")");
    Mismatches m;
    try {
      std::vector<Tensor> inputs;
      for (const json& t : c.at("inputs"))
        inputs.push_back(tensor_of(t));
      std::vector<Tensor> loom = run_reference_kernel(op, inputs, attrs_of(c.at("attrs")));
      const json& expected = c.at("outputs");
      if (loom.size() != expected.size()) {
        ++m.count;
        m.text += std::to_string(loom.size()) + " outputs, PyTorch " +
                  std::to_string(expected.size()) + "\n";
      }
      double scale = input_scale(inputs);
      for (std::size_t k = 0; k < loom.size() && k < expected.size(); ++k)
        compare(loom[k], tensor_of(expected[k]), tol, scale, "output " + std::to_string(k), m);
    } catch (const std::exception& e) {
      ++m.count;
      m.text += std::string("threw: ") + e.what() + "\n";
    }
    if (c.contains("known_issue")) {  // a disagreement already reported: kept visible
      const std::string issue = c.at("known_issue").get<std::string>();
      if (m.count == 0)
        ADD_FAILURE() << op_text << "/" << name << " now agrees with PyTorch: remove its "
                      << "known_issue in tools/make_reference_fixtures.py and regenerate (" << issue
                      << ")";
      else
        std::cout << "[  KNOWN   ] " << op_text << "/" << name << ": " << issue << "\n" << m.text;
      continue;
    }
    EXPECT_EQ(m.count, 0) << m.count << " element(s) differ from PyTorch:\n" << m.text;
  }
}

INSTANTIATE_TEST_SUITE_P(PyTorch, ReferenceFixture,
                         ::testing::Values("cast", "expand", "concat", "sqrt", "erf", "max",
                                           "max_backward", "avg_pool2d", "avg_pool2d_backward",
                                           "top_k", "top_k_backward"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(ReferenceFixtureTolerance, RejectsWhatItShould) {
  const float one = 1.0f, up1 = std::nextafter(one, 2.0f);
  const float up3 = std::nextafter(std::nextafter(up1, 2.0f), 2.0f);
  const float big = std::numeric_limits<float>::max(), inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tolerance exact = tolerance_of("max"), ulp2 = tolerance_of("erf"),
            pool = tolerance_of("avg_pool2d");
  EXPECT_TRUE(floats_match(one, one, exact, 1.0));
  EXPECT_FALSE(floats_match(up1, one, exact, 1.0));
  EXPECT_FALSE(floats_match(-0.0f, 0.0f, exact, 1.0));
  EXPECT_TRUE(floats_match(nan, nan, exact, 1.0));
  EXPECT_FALSE(floats_match(nan, one, exact, 1.0));
  EXPECT_TRUE(floats_match(up1, one, ulp2, 1.0));
  EXPECT_FALSE(floats_match(up3, one, ulp2, 1.0));
  EXPECT_FALSE(floats_match(-0.0f, 0.0f, ulp2, 1.0));
  EXPECT_FALSE(floats_match(inf, big, ulp2, 1.0));
  EXPECT_FALSE(floats_match(one, nan, ulp2, 1.0));
  EXPECT_FALSE(floats_match(-1.0f, 1.0f, ulp2, 1.0));
  EXPECT_TRUE(floats_match(1e-7f, 0.0f, pool, 1.0));
  EXPECT_FALSE(floats_match(1e-6f, 0.0f, pool, 1.0));
  EXPECT_FALSE(floats_match(1.001f, 1.0f, pool, 1.0));
  EXPECT_FALSE(floats_match(-inf, inf, pool, 1.0));
}

}  // namespace
}  // namespace loom::testing
