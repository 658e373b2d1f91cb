// The comparisons every suite relies on: a mismatch must never pass as within tolerance.
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"

namespace loom::testing {
namespace {

TEST(TestUtil, WorstRatioFailsEveryMismatchWithAnInfinityOrNaN) {
  // |a-b| / (atol + rtol |b|) is inf/inf = NaN when b is infinite; NaN must not be taken
  // for "within tolerance".
  EXPECT_GT(worst_ratio({1.0}, {INFINITY}, 1e-4, 1e-5), 1.0);
  EXPECT_GT(worst_ratio({-INFINITY}, {INFINITY}, 1e-4, 1e-5), 1.0);
  EXPECT_GT(worst_ratio({INFINITY}, {-INFINITY}, 1e-4, 1e-5), 1.0);
  EXPECT_GT(worst_ratio({INFINITY}, {1.0}, 1e-4, 1e-5), 1.0);
  EXPECT_GT(worst_ratio({1.0, 2.0}, {1.0, -INFINITY}, 1e-4, 1e-5), 1.0);
  EXPECT_GT(worst_ratio({NAN}, {1.0}, 1e-4, 1e-5), 1.0);
  EXPECT_GT(worst_ratio({1.0}, {NAN}, 1e-4, 1e-5), 1.0);
  // Only the same infinity, or NaN against NaN, matches.
  EXPECT_LE(worst_ratio({INFINITY, -INFINITY, NAN}, {INFINITY, -INFINITY, NAN}, 1e-4, 1e-5), 1.0);
  EXPECT_LE(worst_ratio({1.0, 2.00001}, {1.0, 2.0}, 1e-4, 1e-5), 1.0);
  EXPECT_GT(worst_ratio({1.0, 2.1}, {1.0, 2.0}, 1e-4, 1e-5), 1.0);
  EXPECT_GT(worst_ratio({1.0}, {1.0, 2.0}, 1e-4, 1e-5), 1.0);
}

}  // namespace
}  // namespace loom::testing
