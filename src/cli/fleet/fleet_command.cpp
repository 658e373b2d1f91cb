#include "cli/fleet/fleet_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cluster/catalog/catalog.h"
#include "cluster/sched/experiment.h"
#include "cluster/sched/mean_interval.h"
#include "cluster/sched/simulator.h"
#include "core/error.h"

namespace loom::cli {

using namespace loom::cluster;

CLI::App* add_fleet_command(CLI::App& app, FleetOptions& o) {
  CLI::App* fleet = app.add_subcommand("fleet", "schedule jobs on a fleet of chips");
  fleet->require_subcommand(1);
  CLI::App* sim = fleet->add_subcommand(
      "simulate", "simulate a job list on a fleet under scheduling policies (discrete events)");
  sim->add_option("--fleet", o.fleet,
                  "pools CHIP:NODESxCHIPS[,...] (e.g. v100:36x8,k80:36x8), or a YAML file "
                  "(required but with --alibaba, whose node list is the fleet)");
  sim->add_option("--gavel", o.gavel, "jobs: a Gavel trace (TSV)");
  sim->add_option(
      "--alibaba", o.alibaba,
      "jobs and fleet: an Alibaba PAI 2023 pod list (CSV; GPU sharing and GPU type "
      "constraints), e.g. data/traces/alibaba-pai-gpu-v2023/openb_pod_list_gpuspec33.csv");
  sim->add_option("--alibaba-nodes", o.alibaba_nodes,
                  "the Alibaba node list (default: openb_node_list_gpu_node.csv beside the pods)");
  sim->add_option(
      "--throughputs", o.throughputs,
      "the Gavel throughput table (default: ../simulation_throughputs.json beside the trace)");
  sim->add_option("--jobs", o.jobs,
                  "jobs: a YAML list of training jobs {model, tokens, chips, arrival_h}");
  sim->add_option("--synthetic", o.synthetic, "jobs: this many synthetic jobs")
      ->check(CLI::Range(1, 100000000));
  sim->add_option("--load", o.load,
                  "synthetic: offered load, the work the arrivals bring per second over the "
                  "fleet's chips (at the first pool's speed)")
      ->check(CLI::Range(0.01, 10.0));
  sim->add_option("--seed", o.seed,
                  "random seed of the synthetic jobs, of the failures, and of each job's order "
                  "of the pools a policy finds alike (the live service's order is seed 0's)");
  sim->add_option("--policy", o.policy,
                  "fifo | backfill | sjf | fastest | las | cheapest | loom | all")
      ->check(
          CLI::IsMember({"fifo", "backfill", "sjf", "fastest", "las", "cheapest", "loom", "all"}));
  sim->add_option("--catalog", o.catalog, "catalog folder (default: the repository's catalog/)");
  sim->add_flag("--json", o.json, "one JSON object per policy");
  sim->add_option("--placements", o.placements,
                  "write each job's pool, start and end per policy (CSV)");
  sim->add_option(
         "--node-mtbf-hours", o.node_mtbf_hours,
         "node failures: mean hours between failures of one node (0: none; Llama 3 405B saw one "
         "per 6334 node-hours)")
      ->check(CLI::Range(0.0, 1e9));
  sim->add_option("--repair-hours", o.repair_hours, "hours a failed node is down")
      ->check(CLI::Range(0.0, 1e6));
  sim->add_option(
         "--checkpoint-minutes", o.checkpoint_minutes,
         "a job's checkpoint interval: an interruption loses the work since the last one (0: all)")
      ->check(CLI::Range(0.0, 1e6));
  sim->add_option("--quantum-minutes", o.quantum_minutes,
                  "las: how often it reconsiders who runs, and the least a run lasts before it can "
                  "be preempted")
      ->check(CLI::Range(0.01, 1e6));
  sim->add_option("--seeds", o.seeds,
                  "run every seed (as --seed) and give each policy's mean JCT over them with a "
                  "95% confidence interval; the table is the first seed's")
      ->expected(1, 1000);
  sim->add_flag("--strict-throughputs", o.strict_throughputs,
                "--gavel: refuse jobs whose run times would be extrapolated (scale factors the "
                "throughput table lacks) instead of scaling them linearly");
  sim->add_flag("--sensitivity", o.sensitivity,
                "also the mean JCT with every throughput +20% and -20%, and with the "
                "extrapolated jobs left out");
  sim->add_option("--restart-minutes", o.restart_minutes,
                  "time a job takes to restart from its checkpoint")
      ->check(CLI::Range(0.0, 1e6));
  return fleet;
}

namespace {
int util_width(const Fleet& fleet, std::size_t pool) {
  return std::max(10, static_cast<int>(fleet.label(pool).size()) + 5);
}

// One CSV row per job and policy: where and when it ran (pool empty: it never ran).
void write_placements(const std::string& path, const Fleet& fleet, const std::vector<Job>& jobs,
                      const std::vector<SimReport>& reports) {
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp);
    check(out.good(), path + ": cannot write the placements");
    out << "policy,job,name,chips,milli,arrival_s,pool,start_s,end_s,interruptions\n";
    for (const SimReport& r : reports)
      for (std::size_t j = 0; j < jobs.size(); ++j) {
        const Placement& pl = r.placements[j];
        out << policy_name(r.policy) << ',' << jobs[j].id << ",\"" << jobs[j].name << "\","
            << jobs[j].chips << ',' << jobs[j].milli << ',' << jobs[j].arrival_s << ','
            << (pl.pool < 0 ? "" : fleet.label(static_cast<std::size_t>(pl.pool))) << ','
            << pl.start_s << ',' << pl.end_s << ',' << pl.interruptions << '\n';
      }
    check(out.good(), path + ": writing the placements failed");
  }
  std::filesystem::rename(temp, path);
}
// The mean JCT again with every throughput 20% higher and 20% lower, and with the jobs
// whose run times were extrapolated left out: how much the result rests on the
// throughputs being right.
void print_sensitivity(const Fleet& fleet, const std::vector<Job>& jobs,
                       const std::vector<Policy>& policies, const std::vector<SimReport>& reports,
                       const Failures& failures, const Preemption& preemption, std::uint64_t seed,
                       bool json) {
  const std::vector<Job> faster = with_speed(jobs, 1.2), slower = with_speed(jobs, 0.8);
  const std::vector<Job> measured = without_extrapolated(jobs);
  const bool any_extrapolated = measured.size() != jobs.size();
  if (!json) {
    std::printf("\nsensitivity (mean JCT):\n%-9s %10s %16s %16s %20s\n", "policy", "as given",
                "throughputs +20%", "throughputs -20%", "extrapolated out");
  }
  for (std::size_t i = 0; i < policies.size(); ++i) {
    const Policy policy = policies[i];
    auto mean_h = [&](const std::vector<Job>& list) {
      return simulate(fleet, list, policy, failures, preemption, seed).mean_jct_s / 3600;
    };
    const double up = mean_h(faster), down = mean_h(slower);
    const double kept = any_extrapolated ? mean_h(measured) : reports[i].mean_jct_s / 3600;
    if (json) {
      nlohmann::ordered_json j{{"policy", policy_name(policy)},
                               {"sensitivity",
                                {{"mean_jct_h", reports[i].mean_jct_s / 3600},
                                 {"throughputs_plus_20_mean_jct_h", up},
                                 {"throughputs_minus_20_mean_jct_h", down},
                                 {"extrapolated_left_out_mean_jct_h", kept},
                                 {"extrapolated_left_out_jobs", jobs.size() - measured.size()}}}};
      std::printf("%s\n", j.dump().c_str());
      continue;
    }
    char left_out[32];
    std::snprintf(left_out, sizeof left_out, "%.2fh", kept);
    std::printf("%-9s %9.2fh %9.2fh %+4.0f%% %9.2fh %+4.0f%% %20s\n", policy_name(policy),
                reports[i].mean_jct_s / 3600, up, 100 * (up / (reports[i].mean_jct_s / 3600) - 1),
                down, 100 * (down / (reports[i].mean_jct_s / 3600) - 1),
                any_extrapolated ? left_out : "none extrapolated");
  }
  if (!json && any_extrapolated)
    std::printf("(extrapolated out: %zu of %zu jobs left out)\n", jobs.size() - measured.size(),
                jobs.size());
}

void print_heading(const Workload& w, const std::string& left_out, bool failing) {
  std::printf("fleet: %s\njobs: %zu, %s\nrun times: %s\n", w.fleet.describe().c_str(),
              w.jobs.size(), w.source.c_str(), w.basis.c_str());
  std::printf("%s\n", left_out.empty() ? "" : (left_out + "\n").c_str());
  std::printf("%-9s %9s %10s %10s %10s %10s %10s", "policy", "finished", "mean JCT", "median JCT",
              "p99 JCT", "mean wait", "makespan");
  for (std::size_t p = 0; p < w.fleet.pools.size(); ++p)
    std::printf(" %*s", util_width(w.fleet, p), ("util " + w.fleet.label(p)).c_str());
  if (failing)
    std::printf(" %13s %11s %8s", "interruptions", "lost chip-h", "goodput");
  std::printf(" %9s\n", "sim time");
}

void print_report_json(const Workload& w, Policy policy, const SimReport& r, double wall) {
  nlohmann::ordered_json run_times;
  for (const auto& [basis, count] : w.run_times)
    run_times[basis] = count;
  nlohmann::ordered_json j{{"policy", policy_name(policy)},
                           {"fleet", w.fleet.describe()},
                           {"jobs", r.jobs},
                           {"run_times", run_times},
                           {"finished", r.finished},
                           {"rejected", r.rejected.size()},
                           {"abandoned", r.abandoned.size()},
                           {"mean_jct_h", r.mean_jct_s / 3600},
                           {"median_jct_h", r.median_jct_s / 3600},
                           {"p99_jct_h", r.p99_jct_s / 3600},
                           {"mean_wait_h", r.mean_wait_s / 3600},
                           {"makespan_h", r.makespan_s / 3600},
                           {"events", r.events},
                           {"interruptions", r.interruptions},
                           {"preemptions", r.preemptions},
                           {"node_failures", r.node_failures},
                           {"lost_chip_hours", r.lost_chip_hours},
                           {"goodput", r.goodput},
                           {"wall_s", wall}};
  for (const PoolUse& u : r.pools)
    j["pools"][u.chip] = {{"chips", u.chips}, {"jobs", u.jobs}, {"utilization", u.utilization}};
  std::printf("%s\n", j.dump().c_str());
}

void print_report_row(const Workload& w, Policy policy, const SimReport& r, double wall,
                      bool failing, bool last) {
  std::printf("%-9s %9lld %9.2fh %9.2fh %9.2fh %9.2fh %9.1fh", policy_name(policy),
              static_cast<long long>(r.finished), r.mean_jct_s / 3600, r.median_jct_s / 3600,
              r.p99_jct_s / 3600, r.mean_wait_s / 3600, r.makespan_s / 3600);
  for (std::size_t p = 0; p < r.pools.size(); ++p)
    std::printf(" %*.1f%%", util_width(w.fleet, p) - 1, 100 * r.pools[p].utilization);
  if (failing)
    std::printf(" %13lld %11.0f %7.1f%%", static_cast<long long>(r.interruptions),
                r.lost_chip_hours, 100 * r.goodput);
  std::printf(" %8.2fs\n", wall);
  if (r.preemptions > 0)
    std::printf("  %s: %lld preemptions, %.0f chip-hours spent restarting\n", policy_name(policy),
                static_cast<long long>(r.preemptions), r.lost_chip_hours);
  if (!r.abandoned.empty())
    std::printf("  %zu jobs abandoned, e.g. %s\n", r.abandoned.size(), r.abandoned.front().c_str());
  if (last && !r.rejected.empty())
    std::printf("\n%zu jobs can never run on this fleet, e.g. %s\n", r.rejected.size(),
                r.rejected.front().c_str());
}

// --seeds: each policy's mean JCT over the seeds, with a 95% interval.
void print_over_seeds(const Workload& w, const WorkloadSource& source,
                      const std::vector<Policy>& policies, const Failures& failures,
                      const FleetOptions& o) {
  if (!o.json)
    std::printf("\nover %zu seeds (mean JCT, 95%% confidence interval):\n", o.seeds.size());
  for (Policy policy : policies) {
    const std::vector<double> means =
        mean_jct_h_per_seed(w, source, policy, failures, Preemption{o.quantum_minutes}, o.seeds);
    const MeanInterval m = mean_interval(means);
    if (o.json) {
      nlohmann::ordered_json j{{"policy", policy_name(policy)},
                               {"seeds", o.seeds},
                               {"mean_jct_h_per_seed", means},
                               {"mean_jct_h", m.mean},
                               {"ci95_h", m.half}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%-9s %9.2fh +/- %.2f h\n", policy_name(policy), m.mean, m.half);
    }
  }
}

}  // namespace

int run_fleet(const FleetOptions& o) {
  // The table is the first seed's.
  const std::uint64_t seed = o.seeds.empty() ? o.seed : o.seeds.front();
  const WorkloadSource source{o.fleet,     o.gavel,         o.throughputs, o.strict_throughputs,
                              o.alibaba,   o.alibaba_nodes, o.jobs,        o.catalog,
                              o.synthetic, o.load,          seed};
  const Workload w = load_workload(source);
  const PolicyChoice choice = choose_policies(o.policy, w.jobs);
  Failures failures;
  failures.node_mtbf_h = o.node_mtbf_hours;
  failures.repair_h = o.repair_hours;
  failures.checkpoint_min = o.checkpoint_minutes;
  failures.restart_min = o.restart_minutes;
  failures.seed = seed;
  const bool failing = failures.node_mtbf_h > 0;
  if (!o.json)
    print_heading(w, choice.left_out, failing);
  std::vector<SimReport> reports;
  for (Policy policy : choice.policies) {
    auto start = std::chrono::steady_clock::now();
    reports.push_back(
        simulate(w.fleet, w.jobs, policy, failures, Preemption{o.quantum_minutes}, seed));
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (o.json)
      print_report_json(w, policy, reports.back(), wall);
    else
      print_report_row(w, policy, reports.back(), wall, failing, policy == choice.policies.back());
  }
  if (!o.placements.empty())
    write_placements(o.placements, w.fleet, w.jobs, reports);
  if (o.sensitivity)
    print_sensitivity(w.fleet, w.jobs, choice.policies, reports, failures,
                      Preemption{o.quantum_minutes}, seed, o.json);
  if (o.seeds.size() > 1)
    print_over_seeds(w, source, choice.policies, failures, o);
  return 0;
}

}  // namespace loom::cli
