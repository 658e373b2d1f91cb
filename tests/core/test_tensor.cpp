#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/checked.h"
#include "core/error.h"
#include "core/tensor.h"
#include "test_util.h"

namespace loom::testing {
namespace {

TEST(Tensor, ViewsShareStorage) {
  std::vector<float> v{0, 1, 2, 3, 4, 5};
  Tensor t = Tensor::from_floats({2, 3}, v, cpu());
  Tensor tr = t.transpose(0, 1);
  EXPECT_EQ(tr.shape(), (Shape{3, 2}));
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ(tr.storage(), t.storage());
  EXPECT_EQ(tr.to_floats(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor s = t.slice(1, 1, 3);
  EXPECT_EQ(s.to_floats(), (std::vector<float>{1, 2, 4, 5}));
  EXPECT_EQ(t.select(0, 1).to_floats(), (std::vector<float>{3, 4, 5}));
  t.data<float>()[0] = 42;  // a write through one handle is seen by every view
  EXPECT_EQ(tr.to_floats()[0], 42);
}

// A check given a callable builds its message only when it fails, and throws that message.
TEST(Check, BuildsALazyMessageOnlyOnFailure) {
  int built = 0;
  auto message = [&] {
    ++built;
    return std::string("the message");
  };
  check(true, message);
  EXPECT_EQ(built, 0);
  try {
    check(false, message);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "the message");
  }
  EXPECT_EQ(built, 1);
}

// The tensor's checks, built lazily, still name the tensor and the value.
TEST(Tensor, ErrorsNameTheTensorAndTheValue) {
  Tensor t = Tensor::empty({4, 6}, DType::f32, cpu());
  auto expect_error = [](auto&& call, const std::string& needle) {
    std::string message = "no error";
    try {
      call();
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  };
  expect_error([&] { (void)t.dim(2); }, "axis 2 out of range for f32[4,6]");
  expect_error([&] { (void)t.reshape({4, 5}); }, "shape [4,5] needs 20");
  expect_error([&] { (void)t.slice(1, 2, 7); }, "range [2,7) outside");
}

TEST(Tensor, ReshapeInfersAndChecks) {
  Tensor t = Tensor::empty({4, 6}, DType::f32, cpu());
  EXPECT_EQ(t.reshape({-1, 3}).shape(), (Shape{8, 3}));
  EXPECT_THROW(t.reshape({5, -1}), Error);
  EXPECT_THROW(t.reshape({4, 5}), Error);
  EXPECT_THROW(t.transpose(0, 1).reshape({24}), Error);  // not contiguous
}

TEST(Tensor, OutOfRangeViewsAreErrors) {
  Tensor t = Tensor::empty({4, 6}, DType::f32, cpu());
  EXPECT_THROW(t.slice(1, 2, 7), Error);
  EXPECT_THROW(t.slice(2, 0, 1), Error);
  EXPECT_THROW(t.permute({0, 0}), Error);
  EXPECT_THROW(t.dim(3), Error);
}

TEST(Tensor, ShapeProductsThatOverflowAreErrors) {
  const std::int64_t big = std::int64_t{1} << 32;
  // 2^64 elements wrapped to 0 before, and a tensor of that shape got 0 bytes.
  EXPECT_NE(error_of([&] { shape_numel({big, big}); }).find("overflows int64"), std::string::npos);
  // A zero dimension does not hide the overflow of the others (their strides overflow).
  EXPECT_NE(error_of([&] {
              contiguous_strides({0, big, big});
            }).find("overflows"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              Tensor::empty({big, big}, DType::f32, cpu());
            }).find("overflows"),
            std::string::npos);
  EXPECT_EQ(shape_numel({0, big}), 0);
  EXPECT_EQ(shape_numel({big, 2}), 2 * big);
  EXPECT_EQ(contiguous_strides({2, 0, 3}), (Strides{0, 3, 1}));
}

TEST(Checked, ArithmeticOnFileNumbersNamesWhereValueAndExpectation) {
  constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t min = std::numeric_limits<std::int64_t>::min();
  EXPECT_EQ(checked_add(2, 3, "x"), 5);
  EXPECT_EQ(checked_mul(-4, 3, "x"), -12);
  std::string e = error_of([&] { checked_add(max, 1, "f.bin: offset"); });
  EXPECT_NE(e.find("f.bin: offset: 9223372036854775807 + 1 overflows int64"), std::string::npos)
      << e;
  e = error_of([&] { checked_mul(min, -1, "f.bin: size"); });
  EXPECT_NE(e.find("f.bin: size: -9223372036854775808 x -1 overflows int64"), std::string::npos)
      << e;

  EXPECT_EQ(checked_numel({2, 3, 4}, "t"), 24);
  EXPECT_EQ(checked_numel({}, "t"), 1);
  EXPECT_EQ(checked_numel({5, 0, 7}, "t"), 0);
  e = error_of([&] { checked_numel({2, -3}, "f.onnx: tensor 'w'"); });
  EXPECT_NE(e.find("f.onnx: tensor 'w': shape [2,-3] has dimension -3 at axis 1, expected >= 0"),
            std::string::npos)
      << e;
  e = error_of([&] { checked_numel({std::int64_t{1} << 32, std::int64_t{1} << 32}, "f"); });
  EXPECT_NE(e.find("f: the element count of shape [4294967296,4294967296] overflows int64"),
            std::string::npos)
      << e;
  e = error_of([&] { checked_numel({std::int64_t{1} << 40, 1024}, "f"); });
  EXPECT_NE(e.find("more than 281474976710656 elements"), std::string::npos) << e;
  e = error_of([&] { checked_numel({0, std::int64_t{1} << 40, std::int64_t{1} << 40}, "f"); });
  EXPECT_NE(e.find("overflows int64"), std::string::npos) << e;

  EXPECT_EQ(whole_number(12.0, 1, 100, "x"), 12);
  EXPECT_EQ(whole_number(-0.0, 0, 1, "x"), 0);
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {1e30, -1e30, 2.5, 0.0, 101.0, std::nan(""), inf, -inf}) {
    e = error_of([&] { whole_number(bad, 1, 100, "jobs.yaml: jobs[0]: field 'chips'"); });
    EXPECT_NE(e.find("jobs.yaml: jobs[0]: field 'chips' is " + number_text(bad) +
                     ", expected a whole number in 1..100"),
              std::string::npos)
        << e;
  }
  EXPECT_EQ(number_text(1e30), "1e+30");
  EXPECT_EQ(number_text(2.5), "2.5");
  // Bounds beyond 2^53 are clamped, so 2^63 (which no int64 holds) is refused, not cast.
  e = error_of([&] { whole_number(9223372036854775808.0, 0, max, "f"); });
  EXPECT_NE(e.find("expected a whole number in 0..9007199254740992"), std::string::npos) << e;
}

// The narrow float formats as their definitions (and ml_dtypes, the ONNX reference) give
// them: every code decodes to a value that rounds back to itself; the largest values, the
// NaN codes, saturation and the overflow each format has.
TEST(DType, NarrowFloatsDecodeAndRoundAsTheFormatsDefine) {
  const float inf = std::numeric_limits<float>::infinity();
  for (NarrowFloat f : {NarrowFloat::e4m3fn, NarrowFloat::e4m3fnuz, NarrowFloat::e5m2,
                        NarrowFloat::e5m2fnuz, NarrowFloat::e2m1fn}) {
    const int codes = f == NarrowFloat::e2m1fn ? 16 : 256;
    float largest = 0;
    for (int b = 0; b < codes; ++b) {
      const float v = narrow_float_decode(static_cast<std::uint8_t>(b), f);
      if (std::isnan(v))
        continue;
      EXPECT_EQ(narrow_float_round(v, f, false), v) << b;
      if (std::isinf(v))
        continue;  // e5m2's infinities
      largest = std::max(largest, std::fabs(v));
    }
    EXPECT_EQ(largest, narrow_float_max(f));
    EXPECT_EQ(narrow_float_round(inf, f, true), narrow_float_max(f));
    EXPECT_EQ(narrow_float_round(-1e9f, f, true), -narrow_float_max(f));
  }
  EXPECT_EQ(narrow_float_decode(0x7E, NarrowFloat::e4m3fn), 448.0f);
  EXPECT_TRUE(std::isnan(narrow_float_decode(0x7F, NarrowFloat::e4m3fn)));
  EXPECT_TRUE(std::isnan(narrow_float_decode(0x80, NarrowFloat::e4m3fnuz)));
  EXPECT_EQ(narrow_float_decode(0x01, NarrowFloat::e4m3fn), std::ldexp(1.0f, -9));  // subnormal
  EXPECT_EQ(narrow_float_round(460.0f, NarrowFloat::e4m3fn, false), 448.0f);        // below the tie
  EXPECT_TRUE(std::isnan(narrow_float_round(470.0f, NarrowFloat::e4m3fn, false)));
  EXPECT_EQ(narrow_float_round(1e9f, NarrowFloat::e5m2, false), inf);  // e5m2 has infinities
  EXPECT_TRUE(std::isnan(narrow_float_round(1e9f, NarrowFloat::e5m2fnuz, false)));
  EXPECT_FALSE(std::signbit(narrow_float_round(-0.0f, NarrowFloat::e4m3fnuz, false)));  // no -0
  EXPECT_EQ(narrow_float_round(5.0f, NarrowFloat::e2m1fn, false), 4.0f);   // tie to even
  EXPECT_EQ(narrow_float_round(0.25f, NarrowFloat::e2m1fn, false), 0.0f);  // tie to even
  EXPECT_EQ(narrow_float_round(7.0f, NarrowFloat::e2m1fn, false), 6.0f);   // FP4 saturates
  EXPECT_EQ(narrow_float_round(0.3f, NarrowFloat::e4m3fn, false), 0.3125f);
}

TEST(DType, HalfPrecisionRoundTrips) {
  for (float x : {0.0f, 1.0f, -2.5f, 3.14159f, 65504.0f, 1e-5f, -1e-7f}) {
    EXPECT_NEAR(f16_to_float(float_to_f16(x)), x, std::abs(x) * 1e-3 + 6e-8) << x;
    EXPECT_NEAR(bf16_to_float(float_to_bf16(x)), x, std::abs(x) * 8e-3) << x;
  }
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_TRUE(std::isinf(f16_to_float(float_to_f16(1e6f))));
}

}  // namespace
}  // namespace loom::testing
