// Round-based scheduling (cluster/sched/rounds.h) and what it stands on: the linear-program
// wrapper over GLPK and the max-min allocations, on cases worked out by hand; CPython's
// random numbers and Gavel's continuous workload, against values CPython computed; and the
// round mechanics Gavel's simulator has (allocation resets at most every 1,920 s).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "cluster/sched/gavel.h"
#include "cluster/sched/linear_program.h"
#include "cluster/sched/rounds.h"
#include "core/error.h"
#include "test_util.h"

namespace loom::cluster {
namespace {

TEST(LinearProgram, FindsTheVertexWorkedOutByHand) {
  // max x + y  s.t.  x + 2y <= 4,  3x + y <= 6,  x, y >= 0.
  // The two rows meet at x = 8/5, y = 6/5 (subtract 3 x the first from... : 5y = 6):
  // objective 14/5, above the axis vertices (2, 0) -> 2 and (0, 2) -> 2.
  LinearProgram lp;
  const std::size_t x = lp.add_variable(0, LinearProgram::kInf, 1);
  const std::size_t y = lp.add_variable(0, LinearProgram::kInf, 1);
  lp.add_row({{x, 1}, {y, 2}}, -LinearProgram::kInf, 4);
  lp.add_row({{x, 3}, {y, 1}}, -LinearProgram::kInf, 6);
  const auto solution = lp.maximize();
  ASSERT_TRUE(solution);
  EXPECT_NEAR((*solution)[x], 1.6, 1e-9);
  EXPECT_NEAR((*solution)[y], 1.2, 1e-9);
}

TEST(LinearProgram, AMaxMinObjectiveIsAVariableBelowEveryTerm) {
  // max z  s.t.  z <= 2a,  z <= b,  a + b <= 3  ->  a = 1, b = 2, z = 2.
  LinearProgram lp;
  const std::size_t a = lp.add_variable(0, LinearProgram::kInf, 0);
  const std::size_t b = lp.add_variable(0, LinearProgram::kInf, 0);
  const std::size_t z = lp.add_variable(-LinearProgram::kInf, LinearProgram::kInf, 1);
  lp.add_row({{z, 1}, {a, -2}}, -LinearProgram::kInf, 0);
  lp.add_row({{z, 1}, {b, -1}}, -LinearProgram::kInf, 0);
  lp.add_row({{a, 1}, {b, 1}}, -LinearProgram::kInf, 3);
  const auto solution = lp.maximize();
  ASSERT_TRUE(solution);
  EXPECT_NEAR((*solution)[z], 2, 1e-9);
  EXPECT_NEAR((*solution)[a], 1, 1e-9);
  EXPECT_NEAR((*solution)[b], 2, 1e-9);
}

TEST(LinearProgram, TheInteriorPointMethodEndsInsideTheSetOfOptima) {
  // max z  s.t.  z <= 2a,  z <= b,  a, b in [0, 1]: z = 1 at b = 1 and any a in [0.5, 1].
  // The simplex ends at a vertex (a = 0.5 or 1); the interior-point method inside.
  LinearProgram lp;
  const std::size_t z = lp.add_variable(0, LinearProgram::kInf, 1);
  const std::size_t a = lp.add_variable(0, 1, 0);
  const std::size_t b = lp.add_variable(0, 1, 0);
  lp.add_row({{a, 2}, {z, -1}}, 0, LinearProgram::kInf);
  lp.add_row({{b, 1}, {z, -1}}, 0, LinearProgram::kInf);
  const auto inside = lp.maximize_interior();
  ASSERT_TRUE(inside);
  EXPECT_NEAR((*inside)[z], 1, 1e-6);
  EXPECT_GT((*inside)[a], 0.55);
  EXPECT_LT((*inside)[a], 0.95);
  const auto vertex = lp.maximize();
  ASSERT_TRUE(vertex);
  EXPECT_TRUE(std::abs((*vertex)[a] - 0.5) < 1e-9 || std::abs((*vertex)[a] - 1) < 1e-9);
}

TEST(LinearProgram, InfeasibleAndUnboundedProgramsHaveNoSolution) {
  LinearProgram infeasible;
  const std::size_t x = infeasible.add_variable(0, 1, 1);
  infeasible.add_row({{x, 1}}, 2, LinearProgram::kInf);
  EXPECT_FALSE(infeasible.maximize());
  LinearProgram unbounded;
  unbounded.add_variable(0, LinearProgram::kInf, 1);
  EXPECT_FALSE(unbounded.maximize());
}

TEST(LinearProgram, ARowNamingNoVariableIsRefused) {
  LinearProgram lp;
  lp.add_variable(0, 1, 1);
  EXPECT_THROW(lp.add_row({{3, 1.0}}, 0, 1), loom::Error);
  EXPECT_THROW(lp.add_variable(2, 1, 0), loom::Error);
}

// CPython 3: random.Random(0).getrandbits(32) x 3; Random(2): random() twice,
// getrandbits(32), randrange(26), uniform(1.5, 3); Random(5).shuffle(["v100", "p100",
// "k80"]); Random(7).randrange(26) x 8.
TEST(PythonRandom, DrawsWhatCPythonDraws) {
  PythonRandom zero(0);
  EXPECT_EQ(zero.next_u32(), 3626764237u);
  EXPECT_EQ(zero.next_u32(), 1654615998u);
  EXPECT_EQ(zero.next_u32(), 3255389356u);
  PythonRandom two(2);
  EXPECT_EQ(two.random(), 0.9560342718892494);
  EXPECT_EQ(two.random(), 0.9478274870593494);
  EXPECT_EQ(two.next_u32(), 242886303u);
  EXPECT_EQ(two.randbelow(26), 2u);
  EXPECT_EQ(two.uniform(1.5, 3), 1.6273079927383824);
  PythonRandom five(5);
  std::vector<std::string> types{"v100", "p100", "k80"};
  five.shuffle(types);
  EXPECT_EQ(types, (std::vector<std::string>{"v100", "p100", "k80"}));
  PythonRandom seven(7);
  std::vector<std::uint32_t> drawn;
  for (int i = 0; i < 8; ++i)
    drawn.push_back(seven.randbelow(26));
  EXPECT_EQ(drawn, (std::vector<std::uint32_t>{10, 4, 12, 20, 1, 2, 17, 3}));
}

GavelThroughputs gavel_table() {
  return GavelThroughputs::load(testing::source_dir() +
                                "/data/traces/gavel/simulation_throughputs.json");
}

// The first jobs of seed 0 at 2.6 jobs/h, as Gavel's generate_job and arrival process
// draw them (computed in CPython with the same generators and order of draws).
TEST(GavelContinuousJobs, TheFirstJobsAreGavelsOwn) {
  const GavelThroughputs table = gavel_table();
  GavelContinuousJobs stream(table, {2.6, true, 0, "v100"});
  struct Expected {
    double arrival_s;
    std::int64_t chips;
    double v100_seconds;
    const char* type;
  };
  const Expected expected[] = {
      {0, 8, 68344.35010595087, "ResNet-18 (batch size 64)"},
      {376.28626601584847, 1, 31016.60914593223, "Transformer (batch size 16)"},
      {1464.268965429378, 1, 2146.6088374387864, "Recommendation (batch size 2048)"},
      {2103.911839471365, 1, 7386.674819745945, "Recommendation (batch size 8192)"}};
  for (const Expected& e : expected) {
    const Job job = stream.next();
    EXPECT_DOUBLE_EQ(job.arrival_s, e.arrival_s);
    EXPECT_EQ(job.chips, e.chips);
    EXPECT_EQ(job.name, e.type);
    EXPECT_NEAR(job.seconds_on.at("v100"), e.v100_seconds, 1e-9 * e.v100_seconds);
    EXPECT_EQ(job.seconds_on.size(), 3u);  // v100, p100, k80
  }
}

TEST(GavelContinuousJobs, TheMixIsGavelsPublishedOne) {
  const GavelThroughputs table = gavel_table();
  GavelContinuousJobs stream(table, {1.0, true, 1, "v100"});
  const int n = 40000;
  std::map<std::int64_t, int> scale;
  int long_jobs = 0;
  double last = 0;
  for (int i = 0; i < n; ++i) {
    const Job job = stream.next();
    ++scale[job.chips];
    const double minutes = job.seconds_on.at("v100") / 60;
    ASSERT_GE(minutes, std::pow(10.0, 1.5) * (1 - 1e-9));
    ASSERT_LE(minutes, 1e4 * (1 + 1e-9));
    long_jobs += minutes > 1000;
    if (job.chips > 1) {  // only the distributed types run on several GPUs
      ASSERT_TRUE(job.name.rfind("Recommendation", 0) != 0 && job.name != "A3C" &&
                  job.name != "CycleGAN")
          << job.name;
    }
    last = job.arrival_s;
  }
  // 70 / 10 / 15 / 5 % (binomial standard deviations are under 0.25 points here).
  EXPECT_NEAR(scale[1] / double(n), 0.70, 0.01);
  EXPECT_NEAR(scale[2] / double(n), 0.10, 0.01);
  EXPECT_NEAR(scale[4] / double(n), 0.15, 0.01);
  EXPECT_NEAR(scale[8] / double(n), 0.05, 0.01);
  EXPECT_NEAR(long_jobs / double(n), 0.20, 0.01);  // 10^U(3,4) minutes w.p. 0.2
  EXPECT_NEAR(last / 3600 / n, 1.0, 0.02);         // one job an hour on average
}

// Max-min allocations worked out by hand (rounds.h).
TEST(RoundAllocation, OneChipIsSharedEvenlyOrByWeight) {
  auto x = round_allocation(RoundPolicy::max_min_fairness, {{1}, {1}}, {1, 1}, {1, 1}, {1});
  EXPECT_NEAR(x[0][0], 0.5, 1e-9);
  EXPECT_NEAR(x[1][0], 0.5, 1e-9);
  // Weight 2 halves job 0's coefficient (share = X / w): X0 / 2 = X1 and X0 + X1 = 1.
  x = round_allocation(RoundPolicy::max_min_fairness, {{1}, {1}}, {1, 1}, {2, 1}, {1});
  EXPECT_NEAR(x[0][0], 2.0 / 3, 1e-9);
  EXPECT_NEAR(x[1][0], 1.0 / 3, 1e-9);
}

TEST(RoundAllocation, WaterFillingGivesWhatTheBottleneckedJobsCannotUse) {
  // Four chips; job 0 on 4 chips, jobs 1 and 2 on one each (type-agnostic: share =
  // chips x X). Jobs 1 and 2 can have at most all their time (share 1), so the least share
  // is 1; job 0 then takes what is left: 4 X0 <= 4 - 1 - 1, X0 = 1/2, share 2.
  const auto x =
      round_allocation(RoundPolicy::max_min_fairness, {{1}, {1}, {1}}, {4, 1, 1}, {1, 1, 1}, {4});
  EXPECT_NEAR(x[0][0], 0.5, 1e-9);
  EXPECT_NEAR(x[1][0], 1.0, 1e-9);
  EXPECT_NEAR(x[2][0], 1.0, 1e-9);
}

TEST(RoundAllocation, TheHeterogeneityAwarePolicyGivesEachJobTheTypeItGainsMostOn) {
  // One fast and one slow chip. Job 0 runs 2 steps/s fast, 1 slow; job 1 runs 1 step/s on
  // both. Equal-share throughputs: P0 = (2 + 1) / 2 = 1.5, P1 = 1, so the normalised
  // shares are (4/3 F0 + 2/3 S0) and (F1 + S1). Job 1's share is at most 1 (all its time);
  // the least share is 1, and job 0 reaches 4/3 only with the whole fast chip: F0 = 1,
  // S1 = 1.
  const auto x = round_allocation(RoundPolicy::max_min_fairness_perf, {{2, 1}, {1, 1}}, {1, 1},
                                  {1, 1}, {1, 1});
  EXPECT_NEAR(x[0][0], 1, 1e-9);
  EXPECT_NEAR(x[0][1], 0, 1e-9);
  EXPECT_NEAR(x[1][0], 0, 1e-9);
  EXPECT_NEAR(x[1][1], 1, 1e-9);
  // Type-agnostic, each job just gets all of its time somewhere.
  const auto blind =
      round_allocation(RoundPolicy::max_min_fairness, {{2, 1}, {1, 1}}, {1, 1}, {1, 1}, {1, 1});
  for (const auto& job : blind)
    EXPECT_NEAR(job[0] + job[1], 1, 1e-9);
}

TEST(RoundAllocation, WaterFillingGivesTheRestMoreWhereGavelsProgramStopsAtTheLeast) {
  // Two types of one chip; job 0 (weight 1) and job 1 (weight 0.5: twice the share per
  // unit of time) run on both. Job 0's share is at most 1, its whole time; the least
  // share is therefore 1, and job 1 needs only half its time for it. Water-filling then
  // gives job 1 all the time left: share 2. Gavel's one program stops at the least
  // share, and its interior-point solution leaves job 1 between 1 and 2.
  const std::vector<std::vector<double>> rate{{1, 1}, {1, 1}};
  const auto filled = round_allocation(RoundPolicy::max_min_fairness, rate, {1, 1}, {1, 0.5},
                                       {1, 1}, nullptr, MaxMinSolver::water_filling);
  const auto inside = round_allocation(RoundPolicy::max_min_fairness, rate, {1, 1}, {1, 0.5},
                                       {1, 1}, nullptr, MaxMinSolver::interior_point);
  auto share = [](const std::vector<std::vector<double>>& x, std::size_t j, double weight) {
    return (x[j][0] + x[j][1]) / weight;
  };
  EXPECT_NEAR(share(filled, 0, 1), 1, 1e-6);
  EXPECT_NEAR(share(filled, 1, 0.5), 2, 1e-6);
  EXPECT_NEAR(share(inside, 0, 1), 1, 1e-6);
  EXPECT_GT(share(inside, 1, 0.5), 1.05);
  EXPECT_LT(share(inside, 1, 0.5), 1.95);
  for (const auto* x : {&filled, &inside})  // never more than a chip of either type
    for (std::size_t t = 0; t < 2; ++t)
      EXPECT_LE((*x)[0][t] + (*x)[1][t], 1 + 1e-6);
}

TEST(RoundAllocation, JobsAlikeUpToRoundingAreOneClass) {
  // Four jobs of two kinds on one fast and one slow chip; the second of each kind has a
  // throughput one ulp off (as one recovered from run time = steps / throughput is).
  // They must make two classes, not four: as many programs as exact copies take, the
  // same allocation, and alike jobs alike.
  const double off = std::nextafter(2.0, 3.0), off1 = std::nextafter(1.0, 2.0);
  std::int64_t exact_programs = 0, rounded_programs = 0;
  const auto exact =
      round_allocation(RoundPolicy::max_min_fairness_perf, {{2, 1}, {2, 1}, {1, 1}, {1, 1}},
                       {1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1}, &exact_programs);
  const auto rounded =
      round_allocation(RoundPolicy::max_min_fairness_perf, {{2, 1}, {off, 1}, {1, 1}, {off1, 1}},
                       {1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1}, &rounded_programs);
  EXPECT_EQ(rounded_programs, exact_programs);
  for (std::size_t j = 0; j < 4; ++j)
    for (std::size_t t = 0; t < 2; ++t)
      EXPECT_NEAR(rounded[j][t], exact[j][t], 1e-9) << j << " " << t;
  EXPECT_NEAR(rounded[0][0], rounded[1][0], 1e-12);  // alike jobs, alike allocations
  EXPECT_NEAR(rounded[2][1], rounded[3][1], 1e-12);
}

Job job_of(std::int64_t id, double arrival_s, double steps, std::map<std::string, double> rate) {
  Job j;
  j.id = id;
  j.name = "job" + std::to_string(id);
  j.arrival_s = arrival_s;
  j.steps = steps;
  for (const auto& [type, r] : rate)
    j.seconds_on[type] = steps / r;
  return j;
}

JobSource source_of(std::vector<Job> jobs) {
  auto list = std::make_shared<std::vector<Job>>(std::move(jobs));
  auto next = std::make_shared<std::size_t>(0);
  return [list, next]() -> std::optional<Job> {
    if (*next == list->size())
      return std::nullopt;
    return (*list)[(*next)++];
  };
}

TEST(SimulateRounds, ALoneJobRunsOnItsFastestTypeUnderTheAwarePolicy) {
  const Fleet fleet = parse_fleet("fast:1,slow:1");
  const RoundReport r =
      simulate_rounds(fleet, source_of({job_of(0, 0, 3600, {{"fast", 1.0}, {"slow", 0.5}})}),
                      RoundPolicy::max_min_fairness_perf);
  ASSERT_EQ(r.finished, 1);
  EXPECT_DOUBLE_EQ(r.jct_s[0], 3600);  // ten rounds of 360 steps at 1 step/s
  EXPECT_DOUBLE_EQ(r.mean_jct_s, 3600);
}

TEST(SimulateRounds, AJobThatArrivesWaitsForTheNextAllocation) {
  // Two chips. Job 0 runs long; job 1 arrives at 100 s. Rounds end at 360, 720, ...;
  // job 1 joins at the round that ends at 360 s, but the allocation may be recomputed only
  // 1,920 s after the last (at 0), so at the first round boundary from 1,920 s: 2,160 s.
  // It then runs its 360 steps in one round: done at 2,520 s, a JCT of 2,420 s.
  const Fleet fleet = parse_fleet("gpu:2");
  const RoundReport r = simulate_rounds(
      fleet, source_of({job_of(0, 0, 36000, {{"gpu", 1.0}}), job_of(1, 100, 360, {{"gpu", 1.0}})}),
      RoundPolicy::max_min_fairness);
  ASSERT_EQ(r.finished, 2);
  EXPECT_DOUBLE_EQ(r.jct_s[1], 2420);
  EXPECT_DOUBLE_EQ(r.jct_s[0], 36000);  // never slowed: a chip each
  EXPECT_EQ(r.allocations, 3);          // at 0, at 2,160 (arrival), at 2,520 (completion)
}

TEST(SimulateRounds, AJobNoTypeCanRunIsRejectedByName) {
  const Fleet fleet = parse_fleet("gpu:1");
  const RoundReport r = simulate_rounds(
      fleet, source_of({job_of(0, 0, 10, {{"tpu", 1.0}}), job_of(1, 0, 10, {{"gpu", 1.0}})}),
      RoundPolicy::max_min_fairness);
  ASSERT_EQ(r.rejected.size(), 1u);
  EXPECT_NE(r.rejected[0].find("job 0"), std::string::npos);
  EXPECT_EQ(r.finished, 1);
}

// Gavel's FIFO allocations (FifoAllocator), worked out by hand.
TEST(FifoAllocator, TheAwareFifoGivesEachJobInTurnItsFastestTypeWithRoom) {
  // Types a and b, one chip each. Job 0 is fastest on b, job 1 on a; job 2 comes third,
  // when both are taken: b, a, nothing.
  FifoAllocator fifo(/*performance_aware=*/true, 0);
  const auto x = fifo.allocate({0, 1, 2}, {{1, 2}, {3, 1}, {1, 1}}, {1, 1, 1}, {"a", "b"}, {1, 1});
  EXPECT_EQ(x[0], (std::vector<double>{0, 1}));
  EXPECT_EQ(x[1], (std::vector<double>{1, 0}));
  EXPECT_EQ(x[2], (std::vector<double>{0, 0}));
}

TEST(FifoAllocator, NoLaterJobJumpsAheadOfOneThatDoesNotFit) {
  // Two chips of one type. Job 0 takes one; job 1 needs two and waits; job 2 would fit
  // on the free chip but is behind job 1 in the queue.
  FifoAllocator fifo(/*performance_aware=*/true, 0);
  const auto x = fifo.allocate({0, 1, 2}, {{1}, {1}, {1}}, {1, 2, 1}, {"gpu"}, {2});
  EXPECT_EQ(x[0][0], 1);
  EXPECT_EQ(x[1][0], 0);
  EXPECT_EQ(x[2][0], 0);
}

TEST(FifoAllocator, TheAwareFifoReallocatesAfreshButTheAgnosticOneKeepsItsJobsWhereTheyAre) {
  // One chip each of a and b; a is the faster for every job. Job 1 is first given b (job 0
  // holds a); when job 0 finishes, the aware FIFO moves job 1 to a, the agnostic one
  // leaves it on b and gives the chip job 0 held (a) to the queue's head, job 2.
  const std::vector<std::string> names{"a", "b"};
  FifoAllocator aware(true, 0);
  aware.allocate({0, 1}, {{2, 1}, {2, 1}}, {1, 1}, names, {1, 1});
  const auto moved = aware.allocate({1, 2}, {{2, 1}, {2, 1}}, {1, 1}, names, {1, 1});
  EXPECT_EQ(moved[0], (std::vector<double>{1, 0}));  // job 1 now on a
  EXPECT_EQ(moved[1], (std::vector<double>{0, 1}));  // job 2 on b
  // The agnostic FIFO: both types have room at first, job 0 goes to the last open type by
  // name (b) and the random draw only decides which type leaves the list when b fills.
  PythonRandom draws(7);
  const std::uint32_t first_draw = draws.randbelow(2);
  FifoAllocator agnostic(false, 7);
  const auto first = agnostic.allocate({0, 1}, {{2, 1}, {2, 1}}, {1, 1}, names, {1, 1});
  EXPECT_EQ(first[0], (std::vector<double>{0, 1}));  // job 0 on b
  if (first_draw == 1) {
    // b left the list; job 1 takes a.
    EXPECT_EQ(first[1], (std::vector<double>{1, 0}));
    const auto kept = agnostic.allocate({1, 2}, {{2, 1}, {2, 1}}, {1, 1}, names, {1, 1});
    EXPECT_EQ(kept[0], (std::vector<double>{1, 0}));  // job 1 stays on a
    EXPECT_EQ(kept[1], (std::vector<double>{0, 1}));  // job 2 gets job 0's chip, on b
  } else {
    // a left the list though it has room, and b is full: job 1 waits.
    EXPECT_EQ(first[1], (std::vector<double>{0, 0}));
    const auto kept = agnostic.allocate({1, 2}, {{2, 1}, {2, 1}}, {1, 1}, names, {1, 1});
    EXPECT_EQ(kept[0], (std::vector<double>{0, 1}));  // job 1, the head, gets job 0's b
  }
}

TEST(SimulateRounds, UnderFifoAJobWithoutAnAllocationLeavesIdleChipsIdle) {
  // Two "gpu" chips and one "old". Job 0 (one chip, gpu only, 3,600 steps at 1 step/s)
  // takes a gpu; job 1 (two chips, gpu only) does not fit beside it and waits; job 2 (one
  // chip, old only) is behind job 1 in the queue, so FIFO gives it nothing (X = 0) and it
  // does not run on the idle old chip (Gavel: invalid_allocation_zero). Job 0 ends at
  // 3,600 s; the allocation then (3,600 s is 1,920 s past the last, at 0) gives job 1 the
  // gpus and job 2 the old chip: both run 360 steps, done at 3,960 s. Under max-min
  // fairness job 2 runs at once on the idle old chip: done at 360 s.
  const Fleet fleet = parse_fleet("gpu:2,old:1");
  Job wide = job_of(1, 0, 360, {{"gpu", 1.0}});
  wide.chips = 2;
  const std::vector<Job> jobs{job_of(0, 0, 3600, {{"gpu", 1.0}}), wide,
                              job_of(2, 0, 360, {{"old", 1.0}})};
  const RoundReport fifo = simulate_rounds(fleet, source_of(jobs), RoundPolicy::fifo_perf);
  ASSERT_EQ(fifo.finished, 3);
  EXPECT_DOUBLE_EQ(fifo.jct_s[0], 3600);
  EXPECT_DOUBLE_EQ(fifo.jct_s[1], 3960);
  EXPECT_DOUBLE_EQ(fifo.jct_s[2], 3960);
  const RoundReport fair = simulate_rounds(fleet, source_of(jobs), RoundPolicy::max_min_fairness);
  EXPECT_DOUBLE_EQ(fair.jct_s[2], 360);
}

}  // namespace
}  // namespace loom::cluster
