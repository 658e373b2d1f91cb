#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/job_contract.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom::testing {
namespace {

std::string write(const std::string& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir + "/" + name) << text;
  return dir + "/" + name;
}

TEST(Config, YamlAndFlagsAreValidatedWithFileFieldAndValue) {
  std::string dir = temp_dir("cfg");
  train::TrainConfig c;
  c.load_yaml(write(dir, "ok.yaml", "layers: 2\nlr: 3e-4\nmodel: gpt\n"));
  EXPECT_EQ(c.layers, 2);
  EXPECT_DOUBLE_EQ(c.lr, 3e-4);

  std::string e = error_of([&] {
    train::TrainConfig x;
    x.load_yaml(write(dir, "unknown.yaml", "layerz: 2\n"));
  });
  EXPECT_NE(e.find("unknown.yaml: unknown field 'layerz'"), std::string::npos) << e;
  e = error_of([&] {
    train::TrainConfig x;
    x.load_yaml(write(dir, "bad.yaml", "layers: [1, 2\n"));
  });
  EXPECT_NE(e.find("bad.yaml: malformed YAML at line"), std::string::npos) << e;
  e = error_of([&] {
    train::TrainConfig x;
    x.load_yaml(write(dir, "range.yaml", "lr: -1\n"));
  });
  EXPECT_NE(e.find("range.yaml: field 'lr': value '-1' is out of range"), std::string::npos) << e;
  e = error_of([&] {
    train::TrainConfig x;
    x.load_yaml(write(dir, "type.yaml", "batch: twelve\n"));
  });
  EXPECT_NE(e.find("field 'batch': value 'twelve' is not an integer"), std::string::npos) << e;
  e = error_of([&] {
    train::TrainConfig x;
    x.set("model", "rnn", "command line --model");
  });
  EXPECT_NE(e.find("'rnn' is not one of: gpt, llama, mistral, qwen2, qwen3, mlp, cnn"), std::string::npos) << e;
  e = error_of([&] {
    train::TrainConfig x;
    x.load_yaml(dir + "/absent.yaml");
  });
  EXPECT_NE(e.find("absent.yaml: cannot open"), std::string::npos) << e;
  e = error_of([&] {
    train::TrainConfig x;
    x.set("heads", "3", "t");
    x.finalize();
  });
  EXPECT_NE(e.find("not divisible by heads = 3"), std::string::npos) << e;
  e = error_of([&] {
    train::TrainConfig x;
    x.set("mode", "lazy", "command line --mode");
  });
  EXPECT_NE(e.find("'lazy' is not one of: eager, graph"), std::string::npos) << e;
  e = error_of([&] {
    train::TrainConfig x;
    x.set("mode", "graph", "t");
    x.set("pipeline", "2", "t");
    x.finalize();
  });
  EXPECT_NE(e.find("mode = graph with pipeline = 2"), std::string::npos) << e;
  e = error_of([&] {
    train::TrainConfig x;
    x.set("overlap", "yes", "command line --overlap");
  });
  EXPECT_NE(e.find("'yes' is not one of: auto, true, false"), std::string::npos) << e;
  e = error_of([&] {
    train::TrainConfig x;
    x.set("bucket_mb", "0", "command line --bucket_mb");
  });
  EXPECT_NE(e.find("field 'bucket_mb': value '0' is out of range"), std::string::npos) << e;
  // A key that is a list, a mapping or null was a yaml-cpp exception: "internal error".
  for (const char* key : {"? [a, b]\n: 1\n", "? {a: 1}\n: 1\n", "~: 1\n"}) {
    e = error_of([&] {
      train::TrainConfig x;
      x.load_yaml(write(dir, "key.yaml", key));
    });
    EXPECT_NE(e.find("key.yaml: line 1: a key must be a field name, not a list, mapping or null"),
              std::string::npos)
        << key << ": " << e;
  }
}

// Every hostile config kept in tests/fixtures/fuzz/train_config loads and serialises (as
// every run does), or gives a loom::Error naming the file: never another exception.
// Every choice the contract lists for a fixed-choice key reads as its own typed value,
// and text assigned past set() is refused by key, value and choices: a choice added to
// core/job_contract.def without its typed form fails here.
TEST(Config, FixedChoiceSettingsReadAsTypesCoveringTheContractsChoices) {
  using Reader = std::function<int(const train::TrainConfig&)>;
  const std::vector<std::pair<std::string, Reader>> keys{
      {"mode", [](const train::TrainConfig& c) { return static_cast<int>(c.execution()); }},
      {"fusion", [](const train::TrainConfig& c) { return static_cast<int>(c.fuses()); }},
      {"overlap",
       [](const train::TrainConfig& c) { return static_cast<int>(c.overlap_setting()); }},
      {"precision",
       [](const train::TrainConfig& c) { return static_cast<int>(c.product_dtype()); }},
      {"pipeline_schedule",
       [](const train::TrainConfig& c) { return static_cast<int>(c.schedule()); }}};
  for (const auto& [key, read] : keys) {
    const contract::TrainKey* spec = contract::find_train_key(key);
    ASSERT_NE(spec, nullptr) << key;
    const std::string choices(spec->choices);
    std::set<int> seen;
    std::size_t count = 0;
    for (std::size_t at = 0; at <= choices.size(); ++count) {
      std::size_t bar = choices.find('|', at);
      if (bar == std::string::npos)
        bar = choices.size();
      train::TrainConfig c;
      c.set(key, choices.substr(at, bar - at), "test");
      seen.insert(read(c));
      at = bar + 1;
    }
    EXPECT_GE(count, 2u) << key;
    EXPECT_EQ(seen.size(), count) << key << ": two choices read as the same value";
  }
  train::TrainConfig c;
  c.mode = "lazy";  // past set(), which would refuse it
  const std::string e = error_of([&] { c.execution(); });
  EXPECT_NE(e.find("mode = 'lazy'"), std::string::npos) << e;
  EXPECT_NE(e.find("eager|graph"), std::string::npos) << e;
}

TEST(Config, FuzzFixturesGiveNamedErrors) {
  std::vector<std::string> files = fuzz_inputs("train_config");
  EXPECT_FALSE(files.empty());
  for (const std::string& path : files) {
    std::string e = error_of([&] {
      train::TrainConfig c;
      c.load_yaml(path);
      c.finalize();
      c.to_json();
    });
    // A finding on valid input (a value that is not UTF-8) loads; any error names the file.
    EXPECT_TRUE(e.empty() || e.find(path) != std::string::npos) << path << ": " << e;
  }
}

TEST(Config, MissingDataFailsBeforeAnyCheckpoint) {
  std::string dir = temp_dir("nodata");
  train::TrainConfig c;
  c.set("data", dir + "/nope.txt", "t");
  c.out = dir + "/out";
  c.finalize();
  std::string e = error_of([&] { train::run_training(c); });
  EXPECT_NE(e.find("nope.txt: cannot open the data file"), std::string::npos) << e;
  EXPECT_FALSE(std::filesystem::exists(dir + "/out/checkpoint"));
}

TEST(Config, InitWithMismatchedShapesNamesTheTensor) {
  std::string dir = temp_dir("init");
  train::TrainConfig small;
  for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{{"data", "random"},
                                                                      {"vocab", "20"},
                                                                      {"layers", "1"},
                                                                      {"width", "16"},
                                                                      {"heads", "2"},
                                                                      {"context", "8"},
                                                                      {"batch", "2"},
                                                                      {"steps", "1"},
                                                                      {"eval_every", "0"},
                                                                      {"final_eval", "false"},
                                                                      {"json", "true"}})
    small.set(k, v, "t");
  small.out = dir + "/a";
  small.finalize();
  train::run_training(small);
  train::TrainConfig wider = small;
  wider.width = 32;
  wider.init = dir + "/a/checkpoint/model.safetensors";
  wider.out = dir + "/b";
  std::string e = error_of([&] { train::run_training(wider); });
  EXPECT_NE(e.find("tensor 'transformer.wte.weight' has shape [20,16], the model expects [20,32]"),
            std::string::npos)
      << e;
  EXPECT_FALSE(std::filesystem::exists(dir + "/b/checkpoint"));
}

}  // namespace
}  // namespace loom::testing
