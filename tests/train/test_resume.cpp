// Exact resume: a run stopped at step k and resumed gives the same losses and the same
// final weights, bit for bit, as an uninterrupted run.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "dispatch/devices.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "train/trainer.h"

namespace loom::testing {
namespace {

train::TrainConfig small_run(const std::string& out) {
  train::TrainConfig c;
  for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{{"data", "random"},
                                                                      {"vocab", "40"},
                                                                      {"layers", "2"},
                                                                      {"width", "32"},
                                                                      {"heads", "2"},
                                                                      {"context", "16"},
                                                                      {"batch", "4"},
                                                                      {"steps", "8"},
                                                                      {"warmup", "2"},
                                                                      {"dropout", "0.1"},
                                                                      {"eval_every", "0"},
                                                                      {"final_eval", "false"},
                                                                      {"progress", "false"},
                                                                      {"json", "true"}})
    c.set(k, v, "test");
  c.out = out;
  c.finalize();
  return c;
}

std::vector<float> all_weights(const std::string& out) {
  io::SafetensorsFile f = io::SafetensorsFile::read(out + "/checkpoint/model.safetensors");
  std::vector<float> v;
  for (const auto& e : f.entries()) {
    auto w = f.load_f32(e, cpu()).to_floats();
    v.insert(v.end(), w.begin(), w.end());
  }
  return v;
}

TEST(Resume, StoppedAndResumedRunMatchesUninterruptedRun) {
  std::string whole = temp_dir("whole"), split = temp_dir("split");
  train::run_training(small_run(whole));

  train::TrainConfig first = small_run(split);
  first.stop_after = 3;
  train::run_training(first);
  train::TrainConfig second = small_run(split);
  second.resume = true;
  train::run_training(second);

  EXPECT_EQ(metric_losses(whole), metric_losses(split));
  EXPECT_EQ(metric_losses(whole).size(), 8u);
  EXPECT_EQ(all_weights(whole), all_weights(split));
}

TEST(Resume, MismatchedCheckpointFilesAreRefused) {
  std::string dir = temp_dir("mismatch");
  train::TrainConfig c = small_run(dir);
  c.stop_after = 2;
  train::run_training(c);
  // Simulate a crash between the two checkpoint writes: train_state from another step.
  std::string state = dir + "/checkpoint/train_state.safetensors";
  io::SafetensorsFile f = io::SafetensorsFile::read(state);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& e : f.entries())
    tensors.emplace_back(e.name, f.load_f32(e, cpu()));
  auto meta = f.metadata();
  meta["step"] = "5";
  io::write_safetensors(state, tensors, meta);
  train::TrainConfig again = small_run(dir);
  again.resume = true;
  try {
    train::run_training(again);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("interrupted save"), std::string::npos) << e.what();
  }
}

TEST(GraphMode, TrainsToTheEagerLossesAndWeightsAndResumesExactly) {
  // small_run has dropout, so each replay must draw that step's masks.
  std::string eager = temp_dir("eager"), graph = temp_dir("graph"), split = temp_dir("graph_split");
  EXPECT_FALSE(train::run_training(small_run(eager)).graph_nodes);
  train::TrainConfig whole = small_run(graph);
  whole.mode = "graph";
  // The run replayed a captured graph (not eager steps that happen to agree).
  const train::Summary replayed = train::run_training(whole);
  ASSERT_TRUE(replayed.graph_nodes);
  EXPECT_GT(*replayed.graph_nodes, 50);
  EXPECT_TRUE(replayed.graph_memory_bytes);
  EXPECT_EQ(metric_losses(eager), metric_losses(graph));
  EXPECT_EQ(all_weights(eager), all_weights(graph));

  train::TrainConfig first = small_run(split);
  first.mode = "graph";
  first.stop_after = 3;
  train::run_training(first);
  train::TrainConfig second = small_run(split);
  second.mode = "graph";
  second.resume = true;
  EXPECT_TRUE(train::run_training(second).graph_nodes);
  EXPECT_EQ(metric_losses(eager), metric_losses(split));
  EXPECT_EQ(all_weights(eager), all_weights(split));
}

// One instance per backend of the build (under LOOM_CUDA_EMULATOR=1 the CUDA backend's
// emulator is one, so cuda_emulated_image_graph runs it there).
class ImageModelsInGraphMode : public ::testing::TestWithParam<std::string> {};

TEST_P(ImageModelsInGraphMode, TrainToTheEagerLosses) {
  const std::string device = GetParam();
  for (std::string model : {"mlp", "cnn"}) {
    SCOPED_TRACE(device + " " + model);
    std::string eager = temp_dir("eager_" + model), graph = temp_dir("graph_" + model);
    auto run = [&](const std::string& out, const std::string& mode) {
      train::TrainConfig c;
      for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{{"model", model},
                                                                          {"steps", "5"},
                                                                          {"batch", "16"},
                                                                          {"width", "32"},
                                                                          {"mode", mode},
                                                                          {"device", device},
                                                                          {"final_eval", "false"},
                                                                          {"progress", "false"},
                                                                          {"json", "true"}})
        c.set(k, v, "test");
      c.mnist_dir = source_dir() + "/data/mnist";
      c.out = out;
      c.finalize();
      return train::run_training(c);
    };
    EXPECT_FALSE(run(eager, "eager").graph_nodes);
    train::Summary replayed = run(graph, "graph");
    EXPECT_TRUE(replayed.graph_nodes);  // replayed, not run eagerly
    // On a device with memory of its own, steps 2 to 5 took batches uploaded on the copy
    // stream during the step before; the losses stay the eager ones, bit for bit.
    if (backend_named(device).host_accessible())
      EXPECT_FALSE(replayed.prefetched_batches);
    else
      EXPECT_EQ(replayed.prefetched_batches, std::optional<std::int64_t>(4));
    EXPECT_EQ(metric_losses(eager), metric_losses(graph));
    EXPECT_EQ(metric_losses(graph).size(), 5u);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryBackend, ImageModelsInGraphMode, ::testing::ValuesIn(backend_names()),
                         [](const auto& info) { return info.param; });

// final_eval is the image models' test-set pass, as it is the text models' validation pass:
// false skips it.
TEST(ImageModelRun, FinalEvalFalseSkipsTheTestSetPass) {
  for (bool final_eval : {true, false}) {
    SCOPED_TRACE(final_eval);
    train::TrainConfig c;
    for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
             {"model", "mlp"},
             {"steps", "2"},
             {"batch", "16"},
             {"width", "32"},
             {"final_eval", final_eval ? "true" : "false"},
             {"progress", "false"}})
      c.set(k, v, "test");
    c.mnist_dir = source_dir() + "/data/mnist";
    c.out = temp_dir(final_eval ? "final_eval_true" : "final_eval_false");
    c.finalize();
    EXPECT_EQ(train::run_training(c).test_accuracy.has_value(), final_eval);
  }
}

TEST(GraphMode, ImportedOnnxModelsTrainToTheEagerLosses) {
  // Token ids and images reach the captured step as declared inputs (no host copies that
  // a replay would freeze): graph mode gives the eager losses, bit for bit.
  struct Case {
    std::string onnx;
    std::vector<std::pair<std::string, std::string>> keys;
  };
  for (const Case& c : std::vector<Case>{{"mlp_mnist.onnx", {{"batch", "16"}}},
                                         {"tiny_gpt_block.onnx",
                                          {{"data", "random"},
                                           {"vocab", "65"},
                                           {"context", "32"},
                                           {"batch", "2"},
                                           {"dropout", "0"}}}}) {
    std::vector<std::vector<double>> losses;
    for (std::string mode : {"eager", "graph"}) {
      train::TrainConfig cfg;
      cfg.set("model", "onnx", "test");
      cfg.set("onnx", source_dir() + "/tests/fixtures/onnx/" + c.onnx, "test");
      for (auto [k, v] : c.keys)
        cfg.set(k, v, "test");
      for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{{"steps", "6"},
                                                                          {"mode", mode},
                                                                          {"eval_every", "0"},
                                                                          {"final_eval", "false"},
                                                                          {"progress", "false"},
                                                                          {"json", "true"}})
        cfg.set(k, v, "test");
      cfg.mnist_dir = source_dir() + "/data/mnist";
      cfg.out = temp_dir("onnx_" + mode);
      cfg.finalize();
      EXPECT_EQ(train::run_training(cfg).graph_nodes.has_value(), mode == "graph") << c.onnx;
      losses.push_back(metric_losses(cfg.out));
    }
    EXPECT_EQ(losses[0], losses[1]) << c.onnx;
    EXPECT_EQ(losses[1].size(), 6u) << c.onnx;
  }
}

}  // namespace
}  // namespace loom::testing
