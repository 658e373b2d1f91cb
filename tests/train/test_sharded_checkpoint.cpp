// Sharded checkpoints (train/sharded_checkpoint.h): pieces written by several ranks assemble
// into their whole tensors; a one-process run saved sharded resumes exactly; every kind of bad
// checkpoint is refused by name before anything is loaded.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "test_util.h"
#include "train/sharded_checkpoint.h"
#include "train/trainer.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;

std::vector<float> iota(std::size_t n, float from) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = from + static_cast<float>(i);
  return v;
}

std::string refusal(const std::string& dir) {
  try {
    train::ShardedCheckpoint::open(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(opened)";
}

nlohmann::json index_of(const std::string& dir) {
  return nlohmann::json::parse(io::read_whole_file(dir + "/index.json"));
}

void write_index_json(const std::string& dir, const nlohmann::json& j) {
  io::write_file_atomically(dir + "/index.json", j.dump(1));
}

TEST(ShardedCheckpoint, PiecesFromSeveralRanksAssembleTheWholeTensors) {
  // Two pieces of one tensor cannot share a name in one rank's file: refused by name.
  const std::string dir = temp_dir("sharded_pieces");
  auto piece = [](std::int64_t r0) {
    return train::ShardPiece{"w", {4, 2}, {r0, 0}, Tensor::from_floats({2, 2}, iota(4, 0), cpu())};
  };
  EXPECT_THROW(train::write_shard(dir, 0, {piece(0), piece(2)}), Error);

  const std::string ok = temp_dir("sharded_ok");
  const std::vector<float> w = iota(24, 0.0f);
  auto rows = [&](std::int64_t r0, std::int64_t n) {
    return train::ShardPiece{
        "w",
        {4, 6},
        {r0, 0},
        Tensor::from_floats(
            {n, 6}, std::vector<float>(w.begin() + r0 * 6, w.begin() + (r0 + n) * 6), cpu())};
  };
  auto cols = [&](std::int64_t c0) {  // a column block of "v" [3, 4]: 2 columns
    std::vector<float> v;
    for (std::int64_t r = 0; r < 3; ++r)
      for (std::int64_t c = c0; c < c0 + 2; ++c)
        v.push_back(static_cast<float>(r * 4 + c));
    return train::ShardPiece{"v", {3, 4}, {0, c0}, Tensor::from_floats({3, 2}, v, cpu())};
  };
  train::write_shard(ok, 0, {rows(0, 1), cols(2)});
  train::write_shard(ok, 1, {rows(1, 3), cols(0)});
  train::write_shard(ok, 2, {});
  train::write_index(ok, 3, {{"step", "7"}});
  const train::ShardedCheckpoint c = train::ShardedCheckpoint::open(ok);
  EXPECT_EQ(c.metadata().at("step"), "7");
  EXPECT_EQ(c.load("w", cpu()).to_floats(), w);
  EXPECT_EQ(c.load("v", cpu()).to_floats(), iota(12, 0));
  EXPECT_EQ(c.shape("v"), (Shape{3, 4}));
  EXPECT_FALSE(fs::exists(ok + "/shard-00000.json"));  // the index holds the manifests
}

// "w" [4, 2] in two row blocks over ranks 0 and 1, and "b" [3] whole on rank 1.
std::string sample(const std::string& name) {
  const std::string dir = temp_dir(name);
  train::write_shard(
      dir, 0,
      {train::ShardPiece{"w", {4, 2}, {0, 0}, Tensor::from_floats({2, 2}, iota(4, 0), cpu())}});
  train::write_shard(
      dir, 1,
      {train::ShardPiece{"w", {4, 2}, {2, 0}, Tensor::from_floats({2, 2}, iota(4, 4), cpu())},
       train::ShardPiece{"b", {3}, {0}, Tensor::from_floats({3}, iota(3, 100), cpu())}});
  train::write_index(dir, 2, {{"step", "7"}});
  return dir;
}

TEST(ShardedCheckpoint, BadCheckpointsAreRefusedByName) {
  {
    const std::string dir = sample("sharded_bad_missing");
    fs::remove(dir + "/shard-00001.safetensors");
    const std::string e = refusal(dir);
    EXPECT_NE(e.find("shard-00001.safetensors: missing"), std::string::npos) << e;
  }
  {
    const std::string dir = sample("sharded_bad_crc");
    std::fstream f(dir + "/shard-00000.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');  // the last byte of the data: same size, other bits
    f.close();
    const std::string e = refusal(dir);
    EXPECT_NE(e.find("shard-00000.safetensors: CRC-32"), std::string::npos) << e;
    EXPECT_NE(e.find("the file changed or is damaged"), std::string::npos) << e;
  }
  {
    const std::string dir = sample("sharded_bad_size");
    nlohmann::json j = index_of(dir);
    j["files"][1]["bytes"] = 12;
    write_index_json(dir, j);
    const std::string e = refusal(dir);
    EXPECT_NE(e.find("shard-00001.safetensors:"), std::string::npos) << e;
    EXPECT_NE(e.find("says 12"), std::string::npos) << e;
  }
  {
    const std::string dir = sample("sharded_bad_shape");
    nlohmann::json j = index_of(dir);
    j["tensors"]["w"]["shape"] = {4, 3};  // the pieces hold 8 of 12 elements
    write_index_json(dir, j);
    const std::string e = refusal(dir);
    EXPECT_NE(e.find("tensor 'w': its pieces hold 8 of its 12 elements"), std::string::npos) << e;
  }
  {
    const std::string dir = sample("sharded_bad_reach");
    nlohmann::json j = index_of(dir);
    j["tensors"]["w"]["pieces"][1]["start"] = {3, 0};  // rows 3 and 4 of 4
    write_index_json(dir, j);
    const std::string e = refusal(dir);
    EXPECT_NE(e.find("at [3,0] reaches past the index's shape [4,2]"), std::string::npos) << e;
  }
  {
    const std::string dir = sample("sharded_bad_overlap");
    nlohmann::json j = index_of(dir);
    j["tensors"]["w"]["pieces"][1]["start"] = {1, 0};
    write_index_json(dir, j);
    const std::string e = refusal(dir);
    EXPECT_NE(e.find("overlap"), std::string::npos) << e;
  }
  {
    const std::string dir = sample("sharded_bad_dtype");
    nlohmann::json j = index_of(dir);
    j["tensors"]["b"]["dtype"] = "BF16";
    write_index_json(dir, j);
    const std::string e = refusal(dir);
    EXPECT_NE(e.find("tensor 'b': dtype \"BF16\", expected \"F32\""), std::string::npos) << e;
  }
  {
    const std::string dir = sample("sharded_bad_unlisted");
    nlohmann::json j = index_of(dir);
    j["tensors"].erase("b");  // shard 1 still holds it
    write_index_json(dir, j);
    const std::string e = refusal(dir);
    EXPECT_NE(e.find("tensor 'b' is not in the index"), std::string::npos) << e;
    EXPECT_NE(e.find("the index and its files disagree"), std::string::npos) << e;
  }
  {
    const std::string dir = sample("sharded_bad_elsewhere");
    nlohmann::json j = index_of(dir);
    j["tensors"]["b"]["pieces"][0]["file"] = 0;  // the index places b in shard 0
    write_index_json(dir, j);
    const std::string e = refusal(dir);
    EXPECT_NE(e.find("shard-00000.safetensors: tensor 'b' is missing"), std::string::npos) << e;
  }
  {
    const std::string dir = sample("sharded_bad_twice");
    nlohmann::json j = index_of(dir);
    j["tensors"]["w"]["pieces"][1]["file"] = 0;  // shard 0's rows 0-1 read again for rows 2-3
    write_index_json(dir, j);
    const std::string e = refusal(dir);
    EXPECT_NE(e.find("tensor 'w' piece 1: the index places a second piece of it in"),
              std::string::npos)
        << e;
  }
  {
    const std::string dir = sample("sharded_bad_version");
    nlohmann::json j = index_of(dir);
    j["version"] = train::kShardedFormatVersion + 1;
    write_index_json(dir, j);
    const std::string e = refusal(dir);
    EXPECT_NE(e.find("was written by a newer Loom; this one reads versions up to"),
              std::string::npos)
        << e;
  }
  {
    const std::string dir = sample("sharded_bad_json");
    io::write_file_atomically(dir + "/index.json", "{\"format\": ");
    const std::string e = refusal(dir);
    EXPECT_NE(e.find("index.json: not a JSON object"), std::string::npos) << e;
  }
}

TEST(ShardedCheckpoint, AOneProcessRunSavedShardedResumesExactly) {
  auto run = [](const std::string& out, std::int64_t stop_after, bool resume) {
    train::TrainConfig c;
    for (auto [k, v] :
         std::vector<std::pair<std::string, std::string>>{{"model", "llama"},
                                                          {"data", "random"},
                                                          {"vocab", "40"},
                                                          {"layers", "2"},
                                                          {"width", "32"},
                                                          {"heads", "2"},
                                                          {"context", "16"},
                                                          {"batch", "4"},
                                                          {"steps", "6"},
                                                          {"eval_every", "0"},
                                                          {"final_eval", "false"},
                                                          {"progress", "false"},
                                                          {"checkpoint_format", "sharded"}})
      c.set(k, v, "test");
    c.out = out;
    c.stop_after = stop_after;
    c.resume = resume;
    c.finalize();
    train::run_training(c);
  };
  const std::string whole = temp_dir("sharded_run_whole"), split = temp_dir("sharded_run_split");
  run(whole, 0, false);
  run(split, 3, false);
  EXPECT_TRUE(train::is_sharded_checkpoint(split + "/checkpoint"));
  run(split, 0, true);
  EXPECT_EQ(metric_losses(whole), metric_losses(split));
  const train::ShardedCheckpoint a = train::ShardedCheckpoint::open(whole + "/checkpoint"),
                                 b = train::ShardedCheckpoint::open(split + "/checkpoint");
  ASSERT_EQ(a.names(), b.names());
  for (const std::string& name : a.names())
    EXPECT_EQ(a.load(name, cpu()).to_floats(), b.load(name, cpu()).to_floats()) << name;
  EXPECT_EQ(a.metadata().at("step"), "6");
  // Loaded onto every backend of this machine: the same values.
  for (const std::string& backend : backend_names())
    for (const std::string& name : a.names())
      EXPECT_EQ(a.load(name, backend_named(backend)).to_floats(), a.load(name, cpu()).to_floats())
          << name << " on " << backend;
}

}  // namespace
}  // namespace loom::testing
