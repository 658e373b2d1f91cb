// The decoder families in `loom train`: trained from the run's keys, resumed exactly, replayed
// as a graph, started from a Hugging Face folder (single file or shards) and exported back.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/tokenizer.h"
#include "io/safetensors.h"
#include "nn/decoder.h"
#include "nn/hf_config.h"
#include "test_util.h"
#include "train/hf_folder.h"
#include "train/trainer.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& family) {
  return source_dir() + "/tests/fixtures/decoders/" + family;
}

train::TrainConfig decoder_run(const std::string& family, const std::string& out) {
  train::TrainConfig c;
  for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{{"model", family},
                                                                      {"data", "random"},
                                                                      {"vocab", "40"},
                                                                      {"layers", "2"},
                                                                      {"width", "32"},
                                                                      {"heads", "4"},
                                                                      {"kv_heads", "2"},
                                                                      {"context", "16"},
                                                                      {"batch", "4"},
                                                                      {"steps", "8"},
                                                                      {"warmup", "2"},
                                                                      {"lr", "0.01"},
                                                                      {"dropout", "0"},
                                                                      {"eval_every", "0"},
                                                                      {"final_eval", "false"},
                                                                      {"progress", "false"},
                                                                      {"json", "true"}})
    c.set(k, v, "test");
  c.out = out;
  c.finalize();
  return c;
}

std::vector<float> weights_of(const std::string& file) {
  io::SafetensorsFile f = io::SafetensorsFile::read(file);
  std::vector<float> v;
  for (const auto& e : f.entries()) {
    auto w = f.load_f32(e, cpu()).to_floats();
    v.insert(v.end(), w.begin(), w.end());
  }
  return v;
}

class DecoderRun : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderRun, ResumesExactlyAndReplaysAsAGraph) {
  const std::string family = GetParam();
  std::string whole = temp_dir(family + "_whole"), split = temp_dir(family + "_split"),
              graph = temp_dir(family + "_graph");
  train::run_training(decoder_run(family, whole));
  const std::vector<double> losses = metric_losses(whole);
  ASSERT_EQ(losses.size(), 8u);  // random tokens: nothing to learn, only to match

  train::TrainConfig first = decoder_run(family, split);
  first.stop_after = 3;
  train::run_training(first);
  train::TrainConfig second = decoder_run(family, split);
  second.resume = true;
  train::run_training(second);
  EXPECT_EQ(metric_losses(split), losses);
  EXPECT_EQ(weights_of(split + "/checkpoint/model.safetensors"),
            weights_of(whole + "/checkpoint/model.safetensors"));

  train::TrainConfig replayed = decoder_run(family, graph);
  replayed.mode = "graph";
  ASSERT_TRUE(train::run_training(replayed).graph_nodes);
  EXPECT_EQ(metric_losses(graph), losses);
}

INSTANTIATE_TEST_SUITE_P(Families, DecoderRun,
                         ::testing::Values("llama", "mistral", "qwen2", "qwen3"));

// Starting from a folder changes nothing in its weights (learning rate 0), and the exported
// folder holds them unchanged with a config.json that reads back to the same model.
TEST(HfFolder, InitFromAFolderAndExportBackKeepEveryWeight) {
  for (const std::string family : {"llama", "qwen2", "gpt2"}) {
    SCOPED_TRACE(family);
    std::string out = temp_dir("init_" + family), hf = out + "/hf";
    train::TrainConfig c;
    for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{{"init", fixture(family)},
                                                                        {"data", "random"},
                                                                        {"vocab", "64"},
                                                                        {"context", "24"},
                                                                        {"batch", "2"},
                                                                        {"steps", "1"},
                                                                        {"lr", "0"},
                                                                        {"min_lr", "0"},
                                                                        {"warmup", "0"},
                                                                        {"eval_every", "0"},
                                                                        {"final_eval", "false"},
                                                                        {"progress", "false"}})
      c.set(k, v, "test");
    c.out = out;
    c.finalize();
    EXPECT_EQ(c.model, family == "gpt2" ? "gpt" : family);  // the folder's config.json decided it
    train::run_training(c);
    train::export_checkpoint_hf(out + "/checkpoint", hf);
    EXPECT_EQ(weights_of(hf + "/model.safetensors"),
              weights_of(fixture(family) + "/model.safetensors"));
    nn::DecoderConfig exported = nn::read_hf_config(hf + "/config.json"),
                      original = nn::read_hf_config(fixture(family) + "/config.json");
    if (family == "gpt2")  // a gpt checkpoint records the sizes, not the initializer's range
      exported.init_std = original.init_std;
    EXPECT_EQ(nn::hf_config_json(exported), nn::hf_config_json(original));
  }
}

// A sharded copy of the llama fixture: two files and the index naming them.
std::string sharded_llama(const std::string& dir, bool drop_norm, bool misshape_embedding) {
  io::SafetensorsFile f = io::SafetensorsFile::read(fixture("llama") + "/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> shards[2];
  nlohmann::json index{{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  const auto& entries = f.entries();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (drop_norm && entries[i].name == "model.norm.weight")
      continue;
    Tensor t = f.load_f32(entries[i], cpu());
    if (misshape_embedding && entries[i].name == "model.embed_tokens.weight")
      t = t.reshape({-1});
    const int shard = i < entries.size() / 2 ? 0 : 1;
    shards[shard].emplace_back(entries[i].name, t);
    index["weight_map"][entries[i].name] =
        "model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors";
  }
  fs::create_directories(dir);
  fs::copy_file(fixture("llama") + "/config.json", dir + "/config.json");
  for (int s = 0; s < 2; ++s)
    io::write_safetensors(dir + "/model-0000" + std::to_string(s + 1) + "-of-00002.safetensors",
                          shards[s], {{"format", "pt"}});
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump(2);
  return dir;
}

TEST(HfFolder, ShardedWeightsLoadAsOneFileDoes) {
  std::string dir = sharded_llama(temp_dir("sharded") + "/llama", false, false);
  nn::Decoder single(nn::read_hf_config(fixture("llama") + "/config.json"), 1, cpu());
  nn::Decoder sharded(nn::read_hf_config(dir + "/config.json"), 2, cpu());
  train::load_hf_weights(fixture("llama"), single);
  train::load_hf_weights(dir, sharded);
  for (std::size_t i = 0; i < single.parameters().size(); ++i)
    EXPECT_EQ(single.parameters()[i].var.value().to_floats(),
              sharded.parameters()[i].var.value().to_floats())
        << single.parameters()[i].name;
}

TEST(HfFolder, AMissingOrMisshapenTensorIsNamedBeforeAnyTraining) {
  std::string missing = sharded_llama(temp_dir("missing") + "/llama", true, false);
  std::string misshapen = sharded_llama(temp_dir("misshapen") + "/llama", false, true);
  nn::Decoder model(nn::read_hf_config(missing + "/config.json"), 1, cpu());
  std::string e = error_of([&] { train::load_hf_weights(missing, model); });
  EXPECT_NE(e.find("tensor 'model.norm.weight' is missing"), std::string::npos) << e;
  e = error_of([&] { train::load_hf_weights(misshapen, model); });
  EXPECT_NE(
      e.find("tensor 'model.embed_tokens.weight' has shape [2048], the model expects [64,32]"),
      std::string::npos)
      << e;
  std::string out = temp_dir("refused");
  train::TrainConfig c;
  c.set("init", misshapen, "test");
  c.set("data", "random", "test");
  c.set("vocab", "64", "test");
  c.set("context", "24", "test");
  c.out = out + "/run";
  c.finalize();
  e = error_of([&] { train::run_training(c); });
  EXPECT_NE(e.find("has shape [2048]"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(out + "/run/checkpoint"));
}

// A corpus prepared with a tokenizer trains a decoder whose checkpoint keeps the tokenizer,
// so sampling decodes subword text, evaluation reports bits per byte and export carries it:
// with a byte-level BPE tokenizer.json and with a SentencePiece tokenizer.model.
class CorpusRun : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(CorpusRun, TrainsFromAPreparedCorpusAndSamplesThroughItsTokenizer) {
  const auto& [kind, file] = GetParam();
  const std::string dir = temp_dir("corpus_run_" + kind), tok = fixture("../tokenizers/" + kind);
  {
    std::ifstream text(source_dir() + "/data/multilingual/fortunes-ru-de.txt");
    std::string head(60000, '\0');
    text.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<std::size_t>(text.gcount()));
    head.resize(head.rfind('\n') + 1);  // whole lines: whole UTF-8 characters
    std::ofstream(dir + "/part.txt") << head;
  }
  data::prepare_corpus(tok, {dir + "/part.txt"}, "text", true, dir + "/corpus");
  train::TrainConfig c;
  for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{{"model", "llama"},
                                                                      {"data", dir + "/corpus"},
                                                                      {"tokenizer", tok},
                                                                      {"layers", "1"},
                                                                      {"width", "32"},
                                                                      {"heads", "2"},
                                                                      {"context", "32"},
                                                                      {"batch", "4"},
                                                                      {"steps", "4"},
                                                                      {"eval_every", "0"},
                                                                      {"final_eval", "false"},
                                                                      {"progress", "false"}})
    c.set(k, v, "test");
  c.out = dir + "/run";
  c.finalize();
  train::run_training(c);
  ASSERT_TRUE(fs::exists(dir + "/run/checkpoint/" + file));
  train::SampleOptions greedy;
  greedy.tokens = 8;
  greedy.temperature = 0.0;
  const std::string text = train::sample_text(dir + "/run/checkpoint", "Кащеев", greedy);
  EXPECT_FALSE(text.empty());
  const train::CheckpointScore score =
      train::evaluate_checkpoint(dir + "/run/checkpoint", dir + "/corpus", 8);
  ASSERT_TRUE(score.loss && score.bits_per_byte);
  EXPECT_GT(*score.bits_per_byte, 0.0);
  train::export_checkpoint_hf(dir + "/run/checkpoint", dir + "/hf");
  EXPECT_TRUE(fs::exists(dir + "/hf/" + file));
}

INSTANTIATE_TEST_SUITE_P(
    Tokenizers, CorpusRun,
    ::testing::Values(std::pair<std::string, std::string>{"llama3", "tokenizer.json"},
                      std::pair<std::string, std::string>{"llama2", "tokenizer.model"}),
    [](const auto& info) { return info.param.first; });

// The corpus megatron-core's IndexedDatasetBuilder wrote (tests/fixtures/corpora) trains too.
TEST(MegatronCorpus, TrainsInLoom) {
  const std::string dir = temp_dir("megatron_run");
  train::TrainConfig c;
  for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"model", "qwen2"},
           {"data", source_dir() + "/tests/fixtures/corpora/megatron"},
           {"tokenizer", fixture("../tokenizers/llama3")},
           {"layers", "1"},
           {"width", "32"},
           {"heads", "2"},
           {"context", "16"},
           {"batch", "2"},
           {"steps", "3"},
           {"eval_every", "0"},
           {"progress", "false"}})
    c.set(k, v, "test");
  c.out = dir + "/run";
  c.finalize();
  train::run_training(c);
  EXPECT_EQ(metric_losses(dir + "/run").size(), 3u);
  EXPECT_TRUE(fs::exists(dir + "/run/checkpoint/tokenizer.json"));
}

TEST(HfFolder, AModelNamedAgainstTheFolderIsAConflict) {
  train::TrainConfig c;
  c.set("init", fixture("qwen3"), "test");
  c.set("model", "llama", "test");
  std::string e = error_of([&] { c.finalize(); });
  EXPECT_NE(e.find("holds a qwen3 model, but model = llama"), std::string::npos) << e;
}

}  // namespace
}  // namespace loom::testing
