#include <gtest/gtest.h>

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
