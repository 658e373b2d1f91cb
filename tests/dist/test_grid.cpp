// Process groups (docs/parallel.md): the grid's coordinates in Megatron's order, the groups it
// splits, the collectives tensor parallelism needs (all-gather, reduce-scatter) on the
// in-process group and on MPI, and a rank that never arrives ending its peers' waits with a
// named error. The in-process tests run each rank on a thread; the World tests run under
// `mpiexec -np 4` (ctest dist_collectives) and are skipped in a one-process run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "autograd/functions.h"
#include "core/error.h"
#include "dist/grid.h"
#include "dist/local_group.h"
#include "io/safetensors.h"
#include "nn/hf_config.h"
#include "optim/adamw.h"
#include "test_util.h"
#include "train/checkpoint.h"

namespace loom::testing {
namespace {

using namespace std::chrono_literals;

// Runs body(rank's communicator) on one thread per rank; returns each rank's error ("" if none).
template <class Body>
std::vector<std::string> run_ranks(std::vector<std::unique_ptr<dist::Communicator>>& ranks,
                                   Body body) {
  std::vector<std::string> errors(ranks.size());
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < ranks.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        body(*ranks[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (std::thread& t : threads)
    t.join();
  return errors;
}

// Small integers: every sum is exact, whatever its order.
float value(int rank, std::size_t i) {
  return static_cast<float>(rank * 100 + static_cast<int>(i));
}

// The collectives' results on rank comm.rank() of comm.size(), checked against their
// definitions (ADD_FAILURE: safe from any thread).
void check_collectives(dist::Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  const std::size_t part = 3;
  std::vector<float> mine(part);
  for (std::size_t i = 0; i < part; ++i)
    mine[i] = value(me, i);

  std::vector<float> sum = mine;
  comm.all_reduce_sum(sum);
  for (std::size_t i = 0; i < part; ++i) {
    float expected = 0;
    for (int r = 0; r < n; ++r)
      expected += value(r, i);
    if (sum[i] != expected)
      ADD_FAILURE() << "all_reduce on rank " << me << ": " << sum[i] << " != " << expected;
  }

  std::vector<float> all(part * static_cast<std::size_t>(n));
  comm.all_gather(mine, all);
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < part; ++i)
      if (all[static_cast<std::size_t>(r) * part + i] != value(r, i))
        ADD_FAILURE() << "all_gather on rank " << me << " part " << r;

  // Each rank offers n parts; rank r keeps the sum of everyone's part r.
  std::vector<float> offered(part * static_cast<std::size_t>(n)), kept(part);
  for (std::size_t k = 0; k < offered.size(); ++k)
    offered[k] = value(me, k);
  comm.reduce_scatter_sum(offered, kept);
  for (std::size_t i = 0; i < part; ++i) {
    float expected = 0;
    for (int r = 0; r < n; ++r)
      expected += value(r, static_cast<std::size_t>(me) * part + i);
    if (kept[i] != expected)
      ADD_FAILURE() << "reduce_scatter on rank " << me << ": " << kept[i] << " != " << expected;
  }

  // Blocks of their own sizes: rank r's block is r + 1 floats (the sum of the blocks before
  // it, r (r + 1) / 2, is where it starts).
  std::vector<int> counts(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    counts[static_cast<std::size_t>(r)] = r + 1;
  std::vector<float> uneven(static_cast<std::size_t>(n * (n + 1) / 2)),
      block(static_cast<std::size_t>(me + 1));
  for (std::size_t k = 0; k < uneven.size(); ++k)
    uneven[k] = value(me, k);
  comm.reduce_scatter_sum_uneven(uneven, block, counts);
  for (std::size_t i = 0; i < block.size(); ++i) {
    float expected = 0;
    for (int r = 0; r < n; ++r)
      expected += value(r, static_cast<std::size_t>(me * (me + 1) / 2) + i);
    if (block[i] != expected)
      ADD_FAILURE() << "reduce_scatter_sum_uneven on rank " << me << ": " << block[i]
                    << " != " << expected;
  }

  std::vector<float> root_data = mine;
  comm.broadcast(std::as_writable_bytes(std::span<float>(root_data)), n - 1);
  for (std::size_t i = 0; i < part; ++i)
    if (root_data[i] != value(n - 1, i))
      ADD_FAILURE() << "broadcast on rank " << me;

  if (n > 1) {  // around the ring: send to the next rank, receive from the previous
    std::vector<float> got(part);
    comm.send_receive(mine, (me + 1) % n, got, (me + n - 1) % n);
    for (std::size_t i = 0; i < part; ++i)
      if (got[i] != value((me + n - 1) % n, i))
        ADD_FAILURE() << "send_receive on rank " << me;
  }
}

// The world ranks of a group's members, in the group's rank order.
std::vector<int> members(dist::Communicator& group, int world_rank) {
  std::vector<float> all(static_cast<std::size_t>(group.size()));
  group.all_gather(std::vector<float>{static_cast<float>(world_rank)}, all);
  return std::vector<int>(all.begin(), all.end());
}

TEST(Grid, CoordinatesFollowMegatronsOrderTensorFastestPipelineSlowest) {
  const dist::GridShape shape{2, 2, 2};
  const dist::GridCoordinates five = dist::grid_coordinates(5, shape);
  EXPECT_EQ(five.tp, 1);
  EXPECT_EQ(five.dp, 0);
  EXPECT_EQ(five.pp, 1);
  for (int r = 0; r < shape.size(); ++r)
    EXPECT_EQ(dist::grid_rank(dist::grid_coordinates(r, shape), shape), r);
  EXPECT_EQ(shape.describe(), "tp 2 x dp 2 x pp 2");
}

TEST(LocalGroup, CollectivesGiveTheirDefinitionsOnEveryRank) {
  for (int n : {1, 2, 3, 4}) {
    SCOPED_TRACE(n);
    auto ranks = dist::local_group(n);
    for (const std::string& e : run_ranks(ranks, check_collectives))
      EXPECT_EQ(e, "");
  }
}

// The Communicator's own all_gather and reduce_scatter (through all-reduce), which any
// communicator without native ones uses, give what the native ones give.
class ThroughAllReduce final : public dist::Communicator {
 public:
  explicit ThroughAllReduce(dist::Communicator& inner) : inner_(inner) {}
  std::string_view name() const override { return "through-all-reduce"; }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void all_reduce_sum(std::span<float> d) override { inner_.all_reduce_sum(d); }
  void broadcast(std::span<std::byte> d, int root) override { inner_.broadcast(d, root); }
  void send(std::span<const float> d, int dest) override { inner_.send(d, dest); }
  void receive(std::span<float> d, int source) override { inner_.receive(d, source); }
  void send_receive(std::span<const float> s, int dest, std::span<float> r, int source) override {
    inner_.send_receive(s, dest, r, source);
  }
  std::unique_ptr<dist::Communicator> split(int color, int key) override {
    return inner_.split(color, key);
  }

 private:
  dist::Communicator& inner_;
};

TEST(LocalGroup, TheDefaultGatherAndScatterThroughAllReduceAgree) {
  auto ranks = dist::local_group(3);
  for (const std::string& e : run_ranks(ranks, [](dist::Communicator& c) {
         ThroughAllReduce wrapped(c);
         check_collectives(wrapped);
       }))
    EXPECT_EQ(e, "");
}

TEST(LocalGroup, AGridOfEightSplitsIntoItsThreeKindsOfGroup) {
  auto ranks = dist::local_group(8);
  std::mutex mutex;
  std::map<int, std::vector<std::vector<int>>> groups;  // world rank -> tp, dp, pp members
  auto errors = run_ranks(ranks, [&](dist::Communicator& world) {
    dist::ProcessGrid grid(world, {2, 2, 2});
    std::vector<std::vector<int>> mine{members(grid.tp(), world.rank()),
                                       members(grid.dp(), world.rank()),
                                       members(grid.pp(), world.rank())};
    check_collectives(grid.tp());
    check_collectives(grid.pp());
    std::lock_guard lock(mutex);
    groups[world.rank()] = mine;
  });
  for (const std::string& e : errors)
    EXPECT_EQ(e, "");
  ASSERT_EQ(groups.size(), 8u);
  EXPECT_EQ(groups[5][0], (std::vector<int>{4, 5}));  // tp: adjacent ranks
  EXPECT_EQ(groups[5][1], (std::vector<int>{5, 7}));  // dp: stride T
  EXPECT_EQ(groups[5][2], (std::vector<int>{1, 5}));  // pp: stride T D
  EXPECT_EQ(groups[0][0], (std::vector<int>{0, 1}));
  EXPECT_EQ(groups[0][1], (std::vector<int>{0, 2}));
  EXPECT_EQ(groups[0][2], (std::vector<int>{0, 4}));
}

TEST(LocalGroup, ALayoutThatDoesNotFillTheJobIsNamed) {
  auto ranks = dist::local_group(4);
  auto errors = run_ranks(ranks, [](dist::Communicator& world) {
    dist::ProcessGrid grid(world, {3, 1, 1});
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("layout tp 3 x dp 1 x pp 1 needs 3 processes, this job has 4"),
              std::string::npos)
        << e;
}

// A rank that never arrives: its peers' collective fails within the timeout, naming it,
// and the group stays broken (later calls fail at once instead of waiting again).
TEST(LocalGroup, ARankThatNeverArrivesEndsItsPeersWaitsWithANamedError) {
  auto ranks = dist::local_group(3, 200ms);
  std::vector<std::string> later(3);
  auto errors = run_ranks(ranks, [&](dist::Communicator& c) {
    if (c.rank() == 2)
      return;  // dead
    std::vector<float> v{1.0f};
    try {
      c.all_reduce_sum(v);
    } catch (const Error&) {
      try {
        c.all_reduce_sum(v);
      } catch (const Error& again) {
        later[static_cast<std::size_t>(c.rank())] = again.what();
      }
      throw;
    }
  });
  for (int r : {0, 1}) {
    EXPECT_NE(errors[r].find("all_reduce: 1 of 3 ranks did not arrive within 200 ms"),
              std::string::npos)
        << errors[r];
    EXPECT_NE(later[r].find("the group is broken"), std::string::npos) << later[r];
  }
  EXPECT_EQ(errors[2], "");
}

TEST(LocalGroup, AMessageThatNeverComesIsNamed) {
  auto ranks = dist::local_group(2, 200ms);
  auto errors = run_ranks(ranks, [](dist::Communicator& c) {
    if (c.rank() == 1) {
      std::vector<float> v(4);
      c.receive(v, 0);
    }
  });
  EXPECT_NE(errors[1].find("receive on rank 1: nothing came from rank 0 within 200 ms"),
            std::string::npos)
      << errors[1];
}

// Under `mpiexec -np 4`: MPI's collectives and the grid's groups on real processes.
TEST(World, CollectivesAndGridGroupsOnMpiProcesses) {
  dist::Communicator& world = dist::world();
  if (world.size() == 1)
    GTEST_SKIP() << "one process (ctest dist_collectives runs this under mpiexec -np 4)";
  check_collectives(world);
  ASSERT_EQ(world.size() % 2, 0);
  dist::ProcessGrid grid(world, {2, world.size() / 2, 1});
  const int base = world.rank() - world.rank() % 2;
  EXPECT_EQ(members(grid.tp(), world.rank()), (std::vector<int>{base, base + 1}));
  check_collectives(grid.tp());
  check_collectives(grid.dp());
}

// Tensor parallelism of the decoder fixtures (tests/fixtures/decoders) over the tp groups of
// a tp 2 x dp N grid (each replica computes the same): 20 AdamW steps give one process's
// losses within 1e-6 relative, and after the first backward every gradient, gathered to its
// whole shape, is one process's within 1e-5 (max |a-b| over max |b|).
std::vector<float> gathered(dist::Communicator& group, const nn::Parameter& p) {
  const autograd::Placement& placement = p.var.placement();
  if (placement.shard < 0)
    return p.var.grad().to_floats();
  return dist::whole_of(group, p.var.grad(), placement.shard, placement.parts).to_floats();
}

double max_relative(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return a.size() == b.size() ? diff / scale : 1e30;
}

std::unique_ptr<nn::Decoder> fixture_decoder(const std::string& family) {
  const std::string dir = source_dir() + "/tests/fixtures/decoders/" + family;
  auto model = std::make_unique<nn::Decoder>(nn::read_hf_config(dir + "/config.json"), 0, cpu());
  train::load_weights(dir + "/model.safetensors", *model);
  return model;
}

// Counts the all-reduces the rules make.
class CountingGroup final : public autograd::TensorGroup {
 public:
  explicit CountingGroup(autograd::TensorGroup& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void all_reduce_sum(std::span<float> data) override {
    ++calls;
    inner_.all_reduce_sum(data);
  }
  void all_gather(std::span<const float> local, std::span<float> all) override {
    ++gathers;
    inner_.all_gather(local, all);
  }
  void reduce_scatter_sum(std::span<const float> all, std::span<float> local) override {
    ++scatters;
    inner_.reduce_scatter_sum(all, local);
  }
  bool sequence_parallel() const override { return inner_.sequence_parallel(); }
  int calls = 0, gathers = 0, scatters = 0;

 private:
  autograd::TensorGroup& inner_;
};

TEST(World, TensorParallelDecodersTrainAsOneProcessDoes) {
  dist::Communicator& world = dist::world();
  if (world.size() == 1)
    GTEST_SKIP() << "one process (ctest dist_collectives runs this under mpiexec -np 4)";
  ASSERT_EQ(world.size() % 2, 0);
  dist::ProcessGrid grid(world, {2, world.size() / 2, 1});
  for (const bool sp : {false, true})
    for (const std::string family : {"llama", "qwen2", "qwen3", "mistral"}) {
      SCOPED_TRACE(family + (sp ? ", sequence parallel" : ""));
      dist::TensorGroupOf tp_group(grid.tp(), sp);
      CountingGroup tensor_group(tp_group);
      autograd::TensorGroupScope scope(tensor_group);
      auto one = fixture_decoder(family), split = fixture_decoder(family);
      split->shard_tensor_parallel(grid.at().tp, 2);
      io::SafetensorsFile ref = io::SafetensorsFile::read(
          source_dir() + "/tests/fixtures/decoders/" + family + "/reference.safetensors");
      auto ids = [&](const char* name) {
        std::vector<float> f = ref.load_f32(*ref.find(name), cpu()).to_floats();
        return Tensor::from_ints({2, 24}, std::vector<std::int32_t>(f.begin(), f.end()), cpu());
      };
      const Tensor x = ids("batch.x"), y = ids("batch.y").reshape({-1});
      optim::AdamW opt_one(one->parameters(), {0.9, 0.95, 1e-8, 0.1}),
          opt_split(split->parameters(), {0.9, 0.95, 1e-8, 0.1});
      double worst_loss = 0, worst_grad = 0;
      for (int step = 0; step < 20; ++step) {
        autograd::Tape t1, t2;
        autograd::Var l1 = autograd::cross_entropy(t1, one->forward(t1, x, {}), y);
        tensor_group.calls = tensor_group.gathers = tensor_group.scatters = 0;
        autograd::Var l2 = autograd::cross_entropy(t2, split->forward(t2, x, {}), y);
        const double a = l1.value().item(), b = l2.value().item();
        EXPECT_LE(std::abs(a - b) / std::abs(a), 1e-6) << "step " << step;
        worst_loss = std::max(worst_loss, std::abs(a - b) / std::abs(a));
        t1.backward(l1);
        t2.backward(l2);
        // Per block: forward the attention's and the MLP's row-parallel sums; backward one
        // reduction of each block input's gradient however many slices used it (q, k, v; gate,
        // up), and qwen3's q and k norm weights once each at the end. Vocab-parallel ends: the
        // embedding's partial rows, the loss's two reductions (log-sum-exps, target logits), and
        // the head input's gradient.
        const int layers = static_cast<int>(one->config().layers);
        const int qk_norms = family == "qwen3" ? 2 * layers : 0;
        // mistral's one key/value head is held by both ranks: each k and v weight's (and
        // bias's) gradient summed over its holders once.
        const int kv_holders =
            one->config().kv_heads < 2 ? (one->config().qkv_bias ? 4 : 2) * layers : 0;
        if (!sp) {
          EXPECT_EQ(tensor_group.calls, 4 * layers + 4 + qk_norms + kv_holders);
          EXPECT_EQ(tensor_group.gathers + tensor_group.scatters, 0);
        } else {
          // Sequence parallel: the blocks' reductions are reduce-scatters (forward after o and
          // down, backward of each gathered norm output) and all-gathers. All-reduces remain:
          // the embedding's partial rows, the loss's two, block 0's input gradient (its input
          // is the whole embedding), the norm weights run on row shards (every norm but block
          // 0's first: 2 L), the o and down biases added to row shards, qwen3's q/k norms.
          const int row_biases =
              (one->config().o_bias ? layers : 0) + (one->config().mlp_bias ? layers : 0);
          EXPECT_EQ(tensor_group.calls, 4 + 2 * layers + row_biases + qk_norms + kv_holders);
          EXPECT_EQ(tensor_group.scatters, 2 * layers + (2 * layers - 1 + 1));
          EXPECT_EQ(tensor_group.gathers, (2 * layers - 1 + 1) + 2 * layers + 1);
        }
        if (step == 0) {
          for (std::size_t i = 0; i < one->parameters().size(); ++i) {
            const nn::Parameter& p = split->parameters()[i];
            SCOPED_TRACE(p.name);
            const double d =
                max_relative(gathered(grid.tp(), p), one->parameters()[i].var.grad().to_floats());
            EXPECT_LE(d, 1e-5);
            worst_grad = std::max(worst_grad, d);
          }
        }
        opt_one.step(1e-3);
        opt_split.step(1e-3);
        opt_one.zero_grad();
        opt_split.zero_grad();
      }
      if (world.rank() == 0)
        std::printf(
            "%s tp 2%s: worst relative loss difference over 20 steps %.2e, worst gradient "
            "difference after step 1 %.2e\n",
            family.c_str(), sp ? " + sp" : "", worst_loss, worst_grad);
    }
  // 3 key/value heads on 2 ranks: neither count divides the other.
  nn::DecoderConfig three = fixture_decoder("llama")->config();
  three.heads = 6;
  three.kv_heads = 3;
  nn::Decoder odd(three, 0, cpu());
  std::string e = error_of([&] { odd.shard_tensor_parallel(grid.at().tp, 2); });
  EXPECT_NE(e.find("num_key_value_heads = 3 does not divide among the ranks"), std::string::npos)
      << e;
}

}  // namespace
}  // namespace loom::testing
