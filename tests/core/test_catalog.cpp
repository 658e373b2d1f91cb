#include <gtest/gtest.h>

#include <set>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/op_catalog.h"
#include "dispatch/dispatch.h"
#include "test_util.h"

namespace loom::testing {
namespace {

TEST(Catalog, EveryOpIsDeclaredOnceWithInferenceAndReference) {
  std::set<std::string_view> names;
  for (const OpInfo& info : all_ops()) {
    EXPECT_TRUE(names.insert(info.name).second) << info.name << " declared twice";
    EXPECT_NE(info.infer, nullptr) << info.name;
    EXPECT_NE(info.reference, nullptr) << info.name;
    OpId id;
    ASSERT_TRUE(find_op(info.name, id));
    EXPECT_EQ(op_name(id), info.name);
  }
}

TEST(Catalog, TrainingNeedsBackwardAndOptimizerEntries) {
  int backward = 0, optimizer = 0;
  for (const OpInfo& info : all_ops()) {
    backward += info.role == OpRole::backward;
    optimizer += info.role == OpRole::optimizer;
  }
  EXPECT_GE(backward, 10);
  EXPECT_EQ(optimizer, 1);  // adamw_step
}

TEST(Catalog, ShapeInferenceRejectsBadInputsWithTheOpName) {
  nn::Rng rng(1);
  Tensor a = random({2, 3}, rng), b = random({4, 5}, rng);
  try {
    dispatch::call1(OpId::matmul, {a, b});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2,3]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dispatch::call1(OpId::add, {a, b}), Error);
  Tensor ids = random_ids({4}, 3, rng);
  EXPECT_THROW(dispatch::call1(OpId::embedding, {a, random_ids({2}, 9, rng)}),
               Error);  // id outside [0, 2)
  (void)ids;
  // embedding_backward_add names itself and the input at fault: base, then dy against ids.
  const Tensor table = random({5, 3}, rng), dy = random({4, 3}, rng);
  EXPECT_EQ(error_of([&] {
              dispatch::call1(OpId::embedding_backward_add, {random({5}, rng), dy, ids});
            }).rfind("embedding_backward_add: input 0 is", 0),
            0u);
  EXPECT_EQ(error_of([&] {
              dispatch::call1(OpId::embedding_backward_add, {table, random({4, 2}, rng), ids});
            }),
            "embedding_backward_add: dy f32[4,2] on cpu must be [4,3]");
  EXPECT_EQ(error_of([&] {
              dispatch::call1(OpId::embedding_backward_add, {table, dy, dy});
            }).rfind("embedding_backward_add: input 2 is", 0),
            0u);
}

TEST(Dispatch, CountsEveryNativeCall) {
  dispatch::stats().reset();
  nn::Rng rng(2);
  Tensor a = random({2, 3}, rng);
  dispatch::call1(OpId::exp, {a});
  dispatch::call1(OpId::exp, {a.transpose(0, 1)});  // plus one copy to make it contiguous
  auto& counts = dispatch::stats().counts;
  EXPECT_EQ((counts[{"cpu", OpId::exp, dispatch::Path::native}].calls), 2u);
  EXPECT_EQ((counts[{"cpu", OpId::copy, dispatch::Path::native}].calls), 1u);
}

TEST(CpuBackend, CachingAllocatorReusesBlocks) {
  cpu::CpuBackend& be = cpu::backend();
  void* first;
  {
    Tensor t = Tensor::empty({1000}, DType::f32, be);
    first = t.data<float>();
  }
  Tensor again = Tensor::empty({1000}, DType::f32, be);
  EXPECT_EQ(again.data<float>(), first);
}

}  // namespace
}  // namespace loom::testing
