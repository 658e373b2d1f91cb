// The communicator contract without a launcher: the one-process communicator, and the
// gradient averaging (flatten, one all-reduce, unflatten; overlapped on the communication
// stream) against a stand-in second rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "dist/communicator.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "test_util.h"

namespace loom::testing {
namespace {

// Rank 0 of a pretend two-process job: the other rank's buffer is `peer`.
class PairWithPeer final : public dist::Communicator {
 public:
  explicit PairWithPeer(std::vector<float> peer) : peer_(std::move(peer)) {}
  std::string_view name() const override { return "pair"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void all_reduce_sum(std::span<float> data) override {
    ++calls;
    ASSERT_EQ(data.size(), peer_.size());
    for (std::size_t i = 0; i < data.size(); ++i)
      data[i] += peer_[i];
  }
  void broadcast(std::span<std::byte>, int) override {}  // rank 0 keeps its bytes
  void send(std::span<const float>, int) override {}
  void receive(std::span<float>, int) override {}
  void send_receive(std::span<const float>, int, std::span<float>, int) override {}
  std::unique_ptr<dist::Communicator> split(int, int) override { return dist::single_process(); }
  int calls = 0;

 private:
  std::vector<float> peer_;
};

TEST(Communicator, OneProcessLeavesDataAsItIs) {
  auto single = dist::single_process();
  EXPECT_EQ(single->size(), 1);
  EXPECT_EQ(single->rank(), 0);
  std::vector<float> v{1.0f, -2.0f};
  single->all_reduce_sum(v);
  EXPECT_EQ(v, (std::vector<float>{1.0f, -2.0f}));
  EXPECT_DOUBLE_EQ(dist::mean_over_ranks(*single, 3.5), 3.5);
  // Without a launcher's environment the job is one process.
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr && std::getenv("PMI_SIZE") == nullptr) {
    EXPECT_EQ(dist::world().size(), 1);
  }
}

TEST(Communicator, AverageGradientsIsTheMeanPerParameterInOneMessage) {
  nn::Gpt gpt({11, 8, 1, 2, 8, 0.0}, 3, cpu());
  std::vector<nn::Parameter> params = gpt.parameters();
  nn::Rng rng(5);
  std::vector<float> mine, peer;
  for (nn::Parameter& p : params) {
    Tensor g = random(p.var.value().shape(), rng);
    Tensor h = random(p.var.value().shape(), rng);
    p.var.state()->grad = g;
    for (float x : g.to_floats())
      mine.push_back(x);
    for (float x : h.to_floats())
      peer.push_back(x);
  }
  PairWithPeer comm(peer);
  dist::GradientAverager averager(comm);
  averager.average(params);
  EXPECT_EQ(comm.calls, 1);
  std::size_t at = 0;
  for (const nn::Parameter& p : params) {
    std::vector<float> got = p.var.grad().to_floats();
    for (std::size_t i = 0; i < got.size(); ++i, ++at)
      ASSERT_FLOAT_EQ(got[i], 0.5f * (mine[at] + peer[at])) << p.name << " element " << i;
  }
  EXPECT_EQ(at, mine.size());
}

// Rank 0 of a pretend two-process job whose peer holds `peer_value` everywhere. Each
// all-reduce's size is recorded in call order; call number `fail_call` throws.
class ConstantPeer final : public dist::Communicator {
 public:
  explicit ConstantPeer(float peer_value) : peer_value_(peer_value) {}
  std::string_view name() const override { return "constant peer"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void all_reduce_sum(std::span<float> data) override {
    {
      std::lock_guard lock(mutex_);
      sizes_.push_back(data.size());
      if (static_cast<int>(sizes_.size()) - 1 == fail_call)
        throw Error("all-reduce " + std::to_string(fail_call) + ": peer lost");
    }
    for (float& v : data)
      v += peer_value_;
  }
  void broadcast(std::span<std::byte>, int) override {}
  void send(std::span<const float>, int) override {}
  void receive(std::span<float>, int) override {}
  void send_receive(std::span<const float>, int, std::span<float>, int) override {}
  std::unique_ptr<dist::Communicator> split(int, int) override { return dist::single_process(); }
  std::vector<std::size_t> sizes() {
    std::lock_guard lock(mutex_);
    return sizes_;
  }
  int fail_call = -1;

 private:
  float peer_value_;
  std::mutex mutex_;
  std::vector<std::size_t> sizes_;
};

// Whether `timeline` reaches `value` within `limit`: a test that would otherwise hang fails.
bool reached_within(Timeline& timeline, std::uint64_t value, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (timeline.value() < value) {
    if (std::chrono::steady_clock::now() > deadline)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(OverlappedAverager, ABucketIsReducedWhileLaterGradientsAreStillBeingProduced) {
  ConstantPeer comm(1.0f);
  const std::vector<float> first{2, 4}, second{6, 8, 10};
  Tensor g0 = Tensor::from_floats({2}, first, cpu());
  Tensor g1 = Tensor::from_floats({3}, second, cpu());
  dist::OverlappedAverager averager(comm, 2 * sizeof(float));  // g0 alone fills a bucket
  averager.ready(g0);
  // The "backward pass" produces g1 only once bucket 0 has been reduced: an averager that
  // reduced nothing before finish() never gets there (and fails here after 30 s).
  ASSERT_TRUE(reached_within(averager.reduced(), 1, std::chrono::seconds(30)))
      << "bucket 0 was not reduced before the step's last gradient";
  EXPECT_EQ(g0.to_floats(), (std::vector<float>{1.5f, 2.5f}));  // (g + 1) / 2, in place
  averager.ready(g1);
  averager.finish();
  EXPECT_EQ(g1.to_floats(), (std::vector<float>{3.5f, 4.5f, 5.5f}));
  EXPECT_EQ(comm.sizes(), (std::vector<std::size_t>{2, 3}));  // buckets in ready() order
  EXPECT_EQ(averager.buckets_last_step(), 2u);
  EXPECT_EQ(averager.reduced().value(), 2u);
}

TEST(OverlappedAverager, AFailedAllReduceIsReportedByFinishAndTheNextStepStillRuns) {
  ConstantPeer comm(1.0f);
  comm.fail_call = 0;
  const std::vector<float> values{2, 4};
  Tensor g0 = Tensor::from_floats({2}, values, cpu()), g1 = Tensor::from_floats({2}, values, cpu());
  dist::OverlappedAverager averager(comm, 2 * sizeof(float));
  averager.ready(g0);
  averager.ready(g1);
  EXPECT_EQ(error_of([&] { averager.finish(); }), "all-reduce 0: peer lost");
  EXPECT_EQ(g1.to_floats(), (std::vector<float>{1.5f, 2.5f}));  // the later bucket still ran
  Tensor g2 = Tensor::from_floats({2}, values, cpu());
  averager.ready(g2);
  EXPECT_EQ(error_of([&] { averager.finish(); }), "");
  EXPECT_EQ(g2.to_floats(), (std::vector<float>{1.5f, 2.5f}));
  EXPECT_EQ(averager.buckets_last_step(), 1u);
  EXPECT_EQ(averager.reduced().value(), 3u);
}

TEST(OptimizerSharding, BalancesElementsAndUpdatesOnlyOwnedParameters) {
  nn::Gpt gpt({65, 16, 2, 2, 16, 0.0}, 3, cpu());
  std::vector<nn::Parameter>& params = gpt.parameters();
  PairWithPeer comm(std::vector<float>{});
  dist::OptimizerSharding sharding(comm, params);
  std::int64_t load[2] = {0, 0}, largest = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(sharding.owner(i) == 0 || sharding.owner(i) == 1);
    load[sharding.owner(i)] += params[i].var.value().numel();
    largest = std::max(largest, params[i].var.value().numel());
  }
  EXPECT_LE(std::abs(load[0] - load[1]), largest);  // greedy largest-first balance

  optim::AdamW adamw(params, {});
  adamw.keep_only(sharding.owned_here());
  nn::Rng rng(9);
  std::vector<std::vector<float>> before;
  for (nn::Parameter& p : params) {
    p.var.state()->grad = random(p.var.value().shape(), rng);
    before.push_back(p.var.value().to_floats());
  }
  adamw.step(1e-2);
  for (std::size_t i = 0; i < params.size(); ++i) {
    bool changed = params[i].var.value().to_floats() != before[i];
    bool trained = params[i].var.requires_grad();
    EXPECT_EQ(changed, trained && sharding.owner(i) == 0) << params[i].name;
    EXPECT_EQ(adamw.first_moments()[i].defined(), sharding.owner(i) == 0) << params[i].name;
  }
}

}  // namespace
}  // namespace loom::testing
