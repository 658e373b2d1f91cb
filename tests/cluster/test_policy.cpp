// The placement decision shared by the simulator and the fleet service (policy.h): each
// rule of the default policy, cheapest, the tie-breaks, and preemption by priority.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "cluster/sched/policy.h"

namespace loom::cluster {
namespace {

// Pools with a number of free chips each.
class FreeChips : public Room {
 public:
  explicit FreeChips(std::vector<std::int64_t> free) : free_(std::move(free)) {}
  bool fits(int pool, std::int64_t chips) const override {
    return free_[static_cast<std::size_t>(pool)] >= chips;
  }
  std::int64_t free_chips(int pool) const override { return free_[static_cast<std::size_t>(pool)]; }

 private:
  std::vector<std::int64_t> free_;
};

const std::vector<PoolTerms> kPools{{"a", 1.0}, {"b", 4.0}, {"c", 1.0}};

WaitingJob job(std::vector<PoolOption> options, double deadline = kNoDeadline) {
  WaitingJob w;
  w.options = std::move(options);
  w.deadline_s = deadline;
  return w;
}

int pool_of(Policy policy, const WaitingJob& w, const Room& room, double now = 0) {
  auto choice = choose_pool(policy, w, kPools, room, now, true);
  return choice ? choice->pool : -1;
}

TEST(Policy, LoomNeverUsesAPoolTheJobMayNotRunOn) {
  // Pool b is the fastest and has room, but coverage excluded it from the job's options.
  FreeChips room({4, 4, 4});
  EXPECT_EQ(pool_of(Policy::loom, job({{0, 100}, {2, 200}}), room), 0);
  EXPECT_EQ(pool_of(Policy::loom, job({}), room), -1);
}

TEST(Policy, LoomPrefersAPoolThatMeetsTheDeadlineOverOneOfUnknownSpeed) {
  FreeChips room({4, 4, 4});
  EXPECT_EQ(pool_of(Policy::loom, job({{0, kUnknown}, {2, 500}}, 1000), room), 2);
}

TEST(Policy, LoomThenTakesTheEarliestPredictedFinish) {
  FreeChips room({4, 4, 4});
  EXPECT_EQ(pool_of(Policy::loom, job({{0, 300}, {1, 100}, {2, 200}}), room), 1);
  // Without room the faster pool is out.
  EXPECT_EQ(pool_of(Policy::loom, job({{0, 300}, {1, 100}, {2, 200}}), FreeChips({4, 0, 4})), 2);
}

TEST(Policy, LoomThenTheLowerCost) {
  FreeChips room({4, 4, 4});
  EXPECT_EQ(pool_of(Policy::loom, job({{1, 100}, {0, 100}}), room), 0);  // b costs 4x a
}

TEST(Policy, LoomThenTheJobsOwnOrder) {
  FreeChips room({4, 4, 4});
  EXPECT_EQ(pool_of(Policy::loom, job({{2, 100}, {0, 100}}), room), 2);
  EXPECT_EQ(pool_of(Policy::loom, job({{0, 100}, {2, 100}}), room), 0);
}

TEST(Policy, CheapestMeetsTheDeadlineAtTheLowestCostAndSaysWhy) {
  FreeChips room({4, 4, 4});
  // a: 5 h at price 1; b: 1 h at price 4 (4 vs 5 chip-hour units: b is cheaper!).
  WaitingJob w = job({{0, 5 * 3600.0}, {1, 3600.0}}, 6 * 3600.0);
  auto choice = choose_pool(Policy::cheapest, w, kPools, room, 0, true);
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->pool, 1);
  // a: 2 h at price 1 (2 units) vs b: 1 h at price 4 (4 units): a meets the deadline cheaper.
  w = job({{0, 2 * 3600.0}, {1, 3600.0}}, 6 * 3600.0);
  choice = choose_pool(Policy::cheapest, w, kPools, room, 0, true);
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->pool, 0);
  EXPECT_EQ(choice->reason,
            "a: cheapest that meets the 6.0 h deadline; b 2.0x faster but 2.0x the price");
  // Neither meets a 30-minute deadline: the earliest finish, said in the reason.
  w = job({{0, 2 * 3600.0}, {1, 3600.0}}, 1800);
  choice = choose_pool(Policy::cheapest, w, kPools, room, 0, true);
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->pool, 1);
  EXPECT_NE(choice->reason.find("no pool with room meets the 30 min deadline"), std::string::npos)
      << choice->reason;
}

TEST(Policy, FifoBlocksBehindItsFirstJobAndBackfillLetsLaterOnesStart) {
  FreeChips room({2, 0, 0});
  WaitingJob big = job({{0, 100}}), small = job({{0, 100}});
  big.job = 0, big.chips = 4, big.key = 0;
  small.job = 1, small.chips = 1, small.key = 1;
  std::vector<const WaitingJob*> waiting{&small, &big};
  EXPECT_FALSE(choose_start(Policy::fifo, waiting, kPools, room, 0, false));
  auto choice = choose_start(Policy::backfill, waiting, kPools, room, 0, false);
  ASSERT_TRUE(choice);
  EXPECT_EQ(waiting[choice->candidate]->job, 1u);
}

TEST(Policy, KeysOrderByPriorityThenArrivalAndTiesByJobIndex) {
  EXPECT_LT(order_key(Policy::backfill, 1, 1000, 0), order_key(Policy::backfill, 0, 1, 0));
  EXPECT_LT(order_key(Policy::sjf, 0, 9, 10), order_key(Policy::sjf, 0, 1, 20));
  FreeChips room({4, 4, 4});
  WaitingJob first = job({{0, 1}}), second = job({{0, 1}});
  first.job = 3, second.job = 7;  // equal keys: the lower index starts first
  std::vector<const WaitingJob*> waiting{&second, &first};
  auto choice = choose_start(Policy::backfill, waiting, kPools, room, 0, false);
  ASSERT_TRUE(choice);
  EXPECT_EQ(waiting[choice->candidate]->job, 3u);
}

TEST(Policy, PreemptionTakesTheLowestPriorityLatestStartedJobsFirst) {
  FreeChips room({0, 0, 0});
  WaitingJob urgent = job({{0, 100}, {2, 100}});
  urgent.chips = 2;
  urgent.priority = 5;
  std::vector<RunningJob> running{
      {10, 0, 1, 1, 0.0},   // pool a, priority 1, started first
      {11, 0, 1, 1, 50.0},  // pool a, priority 1, started later
      {12, 0, 1, 0, 10.0},  // pool a, priority 0
      {13, 2, 2, 9, 0.0},   // pool c, higher priority: never a victim
  };
  auto choice = choose_preemption(Policy::loom, urgent, running, kPools, room, 0);
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->pool, 0);
  EXPECT_EQ(choice->victims, (std::vector<std::size_t>{2, 1}));
  // Nothing of lower priority to take: no preemption.
  urgent.priority = 0;
  EXPECT_FALSE(choose_preemption(Policy::loom, urgent, running, kPools, room, 0));
}

}  // namespace
}  // namespace loom::cluster
