// Shared chips and the Alibaba PAI 2023 trace: jobs that ask for a share of a GPU fit
// together on one chip and never over-commit it (worked out by hand); the bundled trace
// loads with every pod counted; no job lands on a GPU type its constraints exclude, under
// every policy, checked against the pod list read independently here; bad rows are
// refused by file, line, field and value.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "cluster/sched/alibaba.h"
#include "cluster/sched/pool_state.h"
#include "cluster/sched/simulator.h"
#include "core/error.h"
#include "test_util.h"

namespace loom::testing {
namespace {

using namespace loom::cluster;

Job share(std::int64_t id, double arrival, std::int64_t milli, double seconds) {
  Job j;
  j.id = id;
  j.name = "j" + std::to_string(id);
  j.arrival_s = arrival;
  j.chips = 1;
  j.milli = milli;
  j.seconds_on = {{"g", seconds}};
  return j;
}

TEST(SharedChips, SharesGoToTheFullestChipThatFitsAndAChipIsWholeAgainWhenTheyLeave) {
  PoolState pool(Pool{"g", 1, 2});         // one node of two chips
  const Holding a = pool.hold(1, 600, 0);  // chip 1 shared: 400 left
  const Holding b = pool.hold(1, 300, 1);  // best fit: chip 1 again (400 >= 300): 100 left
  EXPECT_EQ(a.shared_chip, b.shared_chip);
  const Holding c = pool.hold(1, 500, 2);  // no shared chip has 500: chip 2 becomes shared
  EXPECT_NE(c.shared_chip, a.shared_chip);
  EXPECT_FALSE(pool.fits(1));  // both chips shared: no whole chip free
  EXPECT_TRUE(pool.fits_share(100));
  EXPECT_TRUE(pool.fits_share(500));  // chip 2 has 500 left
  EXPECT_FALSE(pool.fits_share(501));
  pool.release(a, 0);
  EXPECT_FALSE(pool.fits(1));  // chip 1 still holds job 1's 300
  pool.release(b, 1);
  EXPECT_TRUE(pool.fits(1));  // chip 1 whole and free again
  EXPECT_FALSE(pool.fits(2));
  pool.release(c, 2);
  EXPECT_TRUE(pool.fits(2));
  EXPECT_TRUE(pool.jobs_on(0).empty());
}

TEST(SharedChips, JobsSharingAChipRunTogetherAndAWholeChipJobWaitsForAllOfThem) {
  // One chip. Shares of 400 and 500 start at 0 (900 of 1,000); 300 does not fit beside
  // them and starts when the first ends (10 s); the whole-chip job waits for every share
  // to leave: the 300 ends at 20 s, so it runs 20-30 s. Chip-seconds held: 0.4 x 10 +
  // 0.5 x 10 + 0.3 x 10 + 1 x 10 = 22 of 30: utilization 22/30.
  Job whole = share(3, 0, 0, 10);
  const std::vector<Job> jobs{share(0, 0, 400, 10), share(1, 0, 500, 10), share(2, 0, 300, 10),
                              whole};
  const SimReport r = simulate(parse_fleet("g:1"), jobs, Policy::backfill);
  ASSERT_EQ(r.finished, 4);
  EXPECT_EQ(r.placements[0].start_s, 0);
  EXPECT_EQ(r.placements[1].start_s, 0);
  EXPECT_EQ(r.placements[2].start_s, 10);
  EXPECT_EQ(r.placements[3].start_s, 20);
  EXPECT_NEAR(r.pools[0].utilization, 22.0 / 30.0, 1e-12);
}

TEST(SharedChips, LasRefusesJobsThatShareAChip) {
  try {
    simulate(parse_fleet("g:1"), {share(0, 0, 500, 10)}, Policy::las);
    FAIL() << "las ran a job sharing a chip";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("share of a chip"), std::string::npos) << e.what();
  }
}

// The pod list as plain rows (name -> gpu_spec, num_gpu, gpu_milli), read here without
// the loader.
struct PodRow {
  std::string spec;
  std::int64_t gpus = 0, milli = 0;
};
std::map<std::string, PodRow> read_pods(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...
  std::map<std::string, PodRow> rows;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string field; std::getline(ss, field, ',');)
      f.push_back(field);
    if (f.size() >= 6)
      rows[f[0]] = {f[5], std::stoll(f[3]), std::stoll(f[4])};
  }
  return rows;
}

const std::string kTrace = "/data/traces/alibaba-pai-gpu-v2023/";

TEST(Alibaba, TheBundledTraceLoadsWithEveryPodCounted) {
  const AlibabaTrace t = load_alibaba_trace(source_dir() + kTrace + "openb_pod_list_gpuspec33.csv",
                                            source_dir() + kTrace + "openb_node_list_gpu_node.csv");
  EXPECT_EQ(t.pods, 8152);
  EXPECT_EQ(
      t.cpu_only + t.never_scheduled + t.no_run_time + static_cast<std::int64_t>(t.jobs.size()),
      t.pods);
  EXPECT_EQ(t.cpu_only, 1088);  // num_gpu 0, counted by grep in the pod list
  EXPECT_GT(t.shared, 1000);
  EXPECT_GT(t.constrained, 1000);
  // The fleet holds every GPU of the node list.
  std::ifstream nodes(source_dir() + kTrace + "openb_node_list_gpu_node.csv");
  std::string line;
  std::getline(nodes, line);
  std::int64_t gpus = 0;
  while (std::getline(nodes, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string field; std::getline(ss, field, ',');)
      f.push_back(field);
    gpus += std::stoll(f.at(3));
  }
  EXPECT_EQ(t.fleet.chips(), gpus);
  // Shares as the pod list states them.
  const auto rows = read_pods(source_dir() + kTrace + "openb_pod_list_gpuspec33.csv");
  for (const Job& j : t.jobs) {
    const PodRow& row = rows.at(j.name);
    EXPECT_EQ(j.milli, row.milli < 1000 ? row.milli : 0) << j.name;
    EXPECT_EQ(j.chips, row.gpus) << j.name;
  }
}

TEST(Alibaba, NoJobLandsOnAGpuTypeItsConstraintsExclude) {
  const std::string pods = source_dir() + kTrace + "openb_pod_list_gpuspec33.csv";
  const AlibabaTrace t =
      load_alibaba_trace(pods, source_dir() + kTrace + "openb_node_list_gpu_node.csv");
  const auto rows = read_pods(pods);
  // A smaller fleet than the trace's (a tenth of each pool, at least a node), so that
  // jobs queue and the policies' choices matter.
  Fleet small = t.fleet;
  for (Pool& p : small.pools)
    p.nodes = std::max<std::int64_t>(1, p.nodes / 10);
  for (Policy policy : {Policy::fifo, Policy::backfill, Policy::sjf, Policy::fastest,
                        Policy::cheapest, Policy::loom}) {
    SCOPED_TRACE(policy_name(policy));
    const SimReport r = simulate(small, t.jobs, policy, {}, {}, 3);
    std::int64_t checked = 0, constrained = 0;
    for (std::size_t j = 0; j < t.jobs.size(); ++j) {
      const Placement& p = r.placements[j];
      if (p.pool < 0)
        continue;
      const std::string& chip = small.pools[static_cast<std::size_t>(p.pool)].chip;
      const std::string& spec = rows.at(t.jobs[j].name).spec;
      ++checked;
      if (spec.empty())
        continue;
      ++constrained;
      std::set<std::string> allowed;
      std::stringstream ss(spec);
      for (std::string model; std::getline(ss, model, '|');)
        allowed.insert(model);
      EXPECT_TRUE(allowed.contains(chip)) << t.jobs[j].name << " (" << spec << ") ran on " << chip;
    }
    EXPECT_EQ(checked + static_cast<std::int64_t>(r.rejected.size()),
              static_cast<std::int64_t>(t.jobs.size()));
    EXPECT_GT(constrained, 1000);
  }
}

TEST(Alibaba, BadRowsAreRefusedByFileLineFieldAndValue) {
  const std::string dir = temp_dir("alibaba_bad");
  std::ofstream(dir + "/nodes.csv") << "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,8,T4\n";
  const std::string header =
      "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
      "deletion_time,scheduled_time\n";
  auto refused = [&](const std::string& row, const std::string& expected) {
    std::ofstream(dir + "/pods.csv") << header << row << "\n";
    try {
      load_alibaba_trace(dir + "/pods.csv", dir + "/nodes.csv");
      ADD_FAILURE() << "accepted: " << row;
    } catch (const loom::Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  refused("p,1,1,x,1000,,LS,Running,0,10,0", "pods.csv line 2: num_gpu 'x'");
  refused("p,1,1,1,1500,,LS,Running,0,10,0", "gpu_milli '1500'");
  refused("p,1,1,2,500,,LS,Running,0,10,0", "only a one-GPU pod shares its GPU");
  refused("p,1,1,1,500,T4||A10,LS,Running,0,10,0", "gpu_spec 'T4||A10'");
  refused("p,1,1,1,500,,LS,Running,-5,10,0", "creation_time '-5'");
  refused("p,1,1,1,500,,LS", "7 fields, expected 11");
  // Pods that cannot be replayed are counted.
  std::ofstream(dir + "/pods.csv") << header << "a,1,1,0,0,,LS,Running,0,10,0\n"
                                   << "b,1,1,1,500,,LS,Pending,0,10,\n"
                                   << "c,1,1,1,500,,LS,Failed,0,10,10\n"
                                   << "d,1,1,1,500,T4,LS,Running,0,10,2\n";
  const AlibabaTrace t = load_alibaba_trace(dir + "/pods.csv", dir + "/nodes.csv");
  EXPECT_EQ(t.cpu_only, 1);
  EXPECT_EQ(t.never_scheduled, 1);
  EXPECT_EQ(t.no_run_time, 1);
  ASSERT_EQ(t.jobs.size(), 1u);
  EXPECT_EQ(t.jobs[0].seconds_on.at("T4"), 8);
  EXPECT_EQ(t.jobs[0].milli, 500);
}

// Every hostile pod list kept in tests/fixtures/fuzz/alibaba (NAME-pods.csv, with
// NAME-nodes.csv or else the bundled node list) is refused with an error naming its file.
TEST(Alibaba, FuzzFixturesGiveNamedErrors) {
  const std::vector<std::string> inputs = fuzz_inputs("alibaba");
  std::size_t pod_lists = 0;
  for (const std::string& path : inputs) {
    if (!path.ends_with("-pods.csv"))
      continue;
    ++pod_lists;
    std::string nodes = path.substr(0, path.size() - 9) + "-nodes.csv";
    if (!std::filesystem::exists(nodes))
      nodes = source_dir() + kTrace + "openb_node_list_gpu_node.csv";
    try {
      load_alibaba_trace(path, nodes);
      ADD_FAILURE() << path << " loaded";
    } catch (const loom::Error& e) {
      const std::string what = e.what();  // names the pod list, or the node list at fault
      EXPECT_TRUE(what.find(path) != std::string::npos || what.find(nodes) != std::string::npos)
          << what;
    }
  }
  EXPECT_GE(pod_lists, 3u);
}

}  // namespace
}  // namespace loom::testing
