// The porting story on a backend with ten native ops: the default GPT trains to the
// CPU's losses through decompositions and counted fallbacks; LOOM_STRICT names the
// first op that would fall back; the counters agree with the native set.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "autograd/functions.h"
#include "backends/partial/partial_backend.h"
#include "core/error.h"
#include "dispatch/devices.h"
#include "dispatch/dispatch.h"
#include "nn/gpt.h"
#include "test_util.h"
#include "train/trainer.h"

namespace loom::testing {
namespace {

std::vector<double> losses_on(const std::string& device, int steps) {
  std::string out = temp_dir("dev-" + device);
  train::TrainConfig c;
  c.set("data", source_dir() + "/data/tinyshakespeare/input.txt", "test");
  c.set("device", device, "test");
  c.set("steps", std::to_string(steps), "test");
  for (auto key : {"final_eval", "save", "progress"})
    c.set(key, "false", "test");
  c.set("eval_every", "0", "test");
  c.set("json", "true", "test");
  c.out = out;
  c.finalize();
  train::run_training(c);
  return metric_losses(out);
}

TEST(PartialBackend, TrainsTheDefaultGptToTheCpuLosses) {
  const int steps = steps_for_build(50, 12);
  std::vector<double> cpu = losses_on("cpu", steps), partial = losses_on("partial", steps);
  ASSERT_EQ(cpu.size(), static_cast<std::size_t>(steps));
  ASSERT_EQ(partial.size(), static_cast<std::size_t>(steps));
  for (std::size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(partial[i], cpu[i], 1e-3 * cpu[i]) << "step " << i + 1;
  EXPECT_LT(partial.back(), partial.front() - (steps >= 50 ? 0.5 : 0.2));
}

// Every full device backend trains the default GPT with zero fallbacks (LOOM_STRICT),
// to the CPU's losses. A backend absent from this machine is skipped, named. Fifty steps,
// or twelve where each step is slow: under the sanitizers, and on the CUDA emulator (about
// two seconds a step on one core; a real GPU takes the fifty).
class DeviceBackend : public ::testing::TestWithParam<std::string> {};

TEST_P(DeviceBackend, TrainsTheDefaultGptToTheCpuLossesWithZeroFallbacks) {
  const std::string device = GetParam();
  std::vector<std::string> names = dispatch::device_names();
  if (std::find(names.begin(), names.end(), device) == names.end())
    GTEST_SKIP() << "no " << device << " device";
  const int steps = cuda_emulated(device) ? 12 : steps_for_build(50, 12);
  std::vector<double> cpu = losses_on("cpu", steps);
  ::setenv("LOOM_STRICT", "1", 1);  // any CPU fallback would throw
  dispatch::stats().reset();
  std::vector<double> losses;
  EXPECT_NO_THROW(losses = losses_on(device, steps));
  ::unsetenv("LOOM_STRICT");
  ASSERT_EQ(losses.size(), static_cast<std::size_t>(steps));
  for (std::size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(losses[i], cpu[i], 1e-3 * cpu[i]) << "step " << i + 1;
  for (const auto& [key, count] : dispatch::stats().counts) {
    if (std::get<0>(key) == device) {
      EXPECT_NE(std::get<2>(key), dispatch::Path::fallback) << op_name(std::get<1>(key));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, DeviceBackend, ::testing::Values("opencl", "cuda"),
                         [](const auto& info) { return info.param; });

TEST(PartialBackend, PathsAgreeWithTheNativeSetAndTheDecompositions) {
  Backend& dev = dispatch::device("partial");
  nn::Gpt gpt({65, 16, 1, 2, 16, 0.0}, 1, dev);
  nn::Rng rng(3);
  std::vector<std::int32_t> ids(32);
  for (auto& i : ids)
    i = static_cast<std::int32_t>(rng.next() % 65);
  dispatch::stats().reset();
  autograd::Tape tape;
  Tensor x = Tensor::from_ints({2, 16}, ids, dev), y = Tensor::from_ints({32}, ids, dev);
  tape.backward(autograd::cross_entropy(tape, gpt.forward(tape, x, {}), y));
  const auto& native = partial::backend().native_ops();
  int fallbacks = 0, decomposed = 0;
  for (const auto& [key, count] : dispatch::stats().counts) {
    const auto& [backend, op, path] = key;
    if (backend != "partial")
      continue;
    SCOPED_TRACE(std::string(op_name(op)));
    EXPECT_GT(count.calls, 0u);
    switch (path) {
      case dispatch::Path::native:
        EXPECT_TRUE(native.count(op));
        break;
      case dispatch::Path::decomposed:
        EXPECT_FALSE(native.count(op));
        EXPECT_NE(decomposition(op), nullptr);
        ++decomposed;
        break;
      case dispatch::Path::fallback:
        EXPECT_FALSE(native.count(op));
        EXPECT_EQ(decomposition(op), nullptr);
        EXPECT_GT(count.bytes_moved, 0u);
        ++fallbacks;
        break;
    }
  }
  EXPECT_GT(decomposed, 0);
  EXPECT_GT(fallbacks, 0);
  // The totals per path are the per-op counts summed over every backend and op.
  dispatch::PathCount sums[3];
  for (const auto& [key, count] : dispatch::stats().counts) {
    sums[static_cast<int>(std::get<2>(key))].calls += count.calls;
    sums[static_cast<int>(std::get<2>(key))].bytes_moved += count.bytes_moved;
  }
  for (int p = 0; p < 3; ++p) {
    SCOPED_TRACE(dispatch::path_name(static_cast<dispatch::Path>(p)));
    EXPECT_GT(sums[p].calls, 0u);
    EXPECT_EQ(dispatch::stats().totals[p].calls, sums[p].calls);
    EXPECT_EQ(dispatch::stats().totals[p].bytes_moved, sums[p].bytes_moved);
  }
}

TEST(PartialBackend, StrictModeNamesTheOpThatWouldFallBack) {
  Backend& dev = dispatch::device("partial");
  nn::Rng rng(4);
  std::vector<float> w(20 * 4);
  for (auto& v : w)
    v = static_cast<float>(rng.uniform());
  Tensor weight = Tensor::from_floats({20, 4}, w, dev);
  Tensor ids = Tensor::from_ints({3}, std::vector<std::int32_t>{1, 2, 3}, dev);
  ::setenv("LOOM_STRICT", "1", 1);
  std::string message;
  try {
    dispatch::call1(OpId::embedding, {weight, ids});
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NO_THROW(dispatch::call1(OpId::add, {weight, weight}));  // native: allowed
  EXPECT_NO_THROW(dispatch::call1(OpId::gelu, {weight}));         // decomposed: allowed
  Tensor on_cpu = weight.to(cpu());
  EXPECT_NO_THROW(dispatch::call1(OpId::embedding, {on_cpu, ids.to(cpu())}));  // the CPU has it
  ::unsetenv("LOOM_STRICT");
  EXPECT_NE(message.find("LOOM_STRICT: embedding on partial would fall back"), std::string::npos)
      << message;
  EXPECT_NE(message.find("f32[20,4] on partial"), std::string::npos) << message;
}

}  // namespace
}  // namespace loom::testing
