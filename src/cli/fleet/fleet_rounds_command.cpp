#include "cli/fleet/fleet_rounds_command.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cluster/catalog/catalog.h"
#include "cluster/sched/experiment.h"
#include "cluster/sched/fleet.h"
#include "cluster/sched/gavel.h"
#include "cluster/sched/rounds.h"
#include "core/error.h"

namespace loom::cli {

using namespace loom::cluster;

void add_fleet_rounds_command(CLI::App& fleet, FleetRoundsOptions& o) {
  CLI::App* c = fleet.add_subcommand(
      "rounds", "simulate round-based, time-sliced scheduling (Gavel's policies) on a fleet");
  o.command = c;
  c->add_option("--fleet", o.fleet, "chip types CHIP:N[,...] (e.g. v100:36,p100:36,k80:36)")
      ->required();
  c->add_option("--gavel-continuous", o.jobs_per_hour,
                "jobs: Gavel's continuous workload at this input rate (jobs/hour)")
      ->check(CLI::Range(1e-6, 1e6));
  c->add_flag("--single-gpu", o.single_gpu,
              "continuous-single: every job on one GPU (default: continuous-multiple)");
  c->add_option("--gavel", o.gavel, "jobs: a Gavel trace (TSV, 6, 7, 9 or 10 fields)");
  c->add_option(
      "--throughputs", o.throughputs,
      "Gavel's throughput table (default: data/traces/gavel/simulation_throughputs.json)");
  c->add_option("--policy", o.policy,
                "max_min_fairness | max_min_fairness_perf | fifo | fifo_perf | all")
      ->check(
          CLI::IsMember({"max_min_fairness", "max_min_fairness_perf", "fifo", "fifo_perf", "all"}));
  c->add_option("--seeds", o.seeds, "seeds of the workload and the type order (e.g. 0 1 2)")
      ->expected(1, 100);
  c->add_option("--window", o.window,
                "FIRST:END: mean JCT over job ids [FIRST, END) (default: 4000:5000 for the "
                "continuous workload, as Gavel measures; every job for a trace)");
  c->add_option("--stop-after", o.stop_after,
                "continuous workload: no arrivals after this many jobs (a finite run, for "
                "scale measurements; Gavel's figures keep the stream going)")
      ->check(CLI::Range(1, 1000000000));
  c->add_option("--max-active-jobs", o.max_active_jobs,
                "stop a run as saturated when more jobs than this wait at once")
      ->check(CLI::Range(1, 100000000));
  c->add_flag("--json", o.json, "one JSON object per policy and seed, then one per policy");
  c->add_option("--solver", o.solver,
                "max-min policies: water_filling (the lexicographic max-min fair allocation) "
                "or interior_point (Gavel's one program per allocation, ended inside its optima)")
      ->check(CLI::IsMember({"water_filling", "interior_point"}));
  c->add_flag("--strict-throughputs", o.strict_throughputs,
              "--gavel: refuse jobs whose run times would be extrapolated (scale factors the "
              "throughput table lacks)");
  c->add_flag("--sensitivity", o.sensitivity,
              "also the mean JCT over the seeds with every throughput +20% and -20%, and with "
              "the extrapolated jobs left out");
}

namespace {

std::string text_of(const SeedSummary& s, std::size_t seeds) {
  char text[64];
  if (!s.mean_h)
    return "saturated";
  if (seeds > 1)
    std::snprintf(text, sizeof text, "%.2fh +/- %.2f", *s.mean_h, s.ci95_h);
  else
    std::snprintf(text, sizeof text, "%.2fh", *s.mean_h);
  return text;
}

nlohmann::ordered_json json_of(const SeedSummary& s) {
  return s.mean_h ? nlohmann::ordered_json(*s.mean_h) : nlohmann::ordered_json();
}

void print_heading(const RoundsExperiment& e) {
  const RoundOptions& options = e.options();
  std::printf("fleet: %s\njobs: %s; window: %s\nrun times: %s\n\n", e.fleet().describe().c_str(),
              e.workload().c_str(),
              options.window_end < 0 ? "every job"
                                     : ("ids " + std::to_string(options.window_begin) + "-" +
                                        std::to_string(options.window_end - 1))
                                           .c_str(),
              e.basis().c_str());
  std::printf("%-22s %5s %12s %9s %9s %9s %8s\n", "policy", "seed", "mean JCT", "jobs", "rounds",
              "allocs", "wall");
}

void print_run(const RoundsExperiment& e, RoundPolicy policy, std::uint32_t seed,
               const RoundReport& r, double wall, bool json) {
  if (!json) {
    std::printf("%-22s %5u %11s %9lld %9lld %9lld %7.1fs\n", round_policy_name(policy), seed,
                r.saturated ? "saturated"
                            : (std::to_string(r.mean_jct_s / 3600).substr(0, 6) + "h").c_str(),
                static_cast<long long>(r.jobs), static_cast<long long>(r.rounds),
                static_cast<long long>(r.allocations), wall);
    return;
  }
  const std::int64_t extrapolated = e.continuous() ? 0 : e.extrapolated();
  nlohmann::ordered_json j{
      {"policy", round_policy_name(policy)},
      {"seed", seed},
      {"fleet", e.fleet().describe()},
      {"workload", e.workload()},
      {"run_times", {{"measured", r.jobs - extrapolated}, {"extrapolated", extrapolated}}},
      {"jobs", r.jobs},
      {"finished", r.finished},
      {"window_jobs", r.window_jobs},
      {"mean_jct_h",
       r.saturated ? nlohmann::ordered_json() : nlohmann::ordered_json(r.mean_jct_s / 3600)},
      {"saturated", r.saturated},
      {"rounds", r.rounds},
      {"allocations", r.allocations},
      {"programs", r.programs},
      {"end_h", r.end_s / 3600},
      {"wall_s", wall}};
  for (std::size_t t = 0; t < r.types.size(); ++t)
    j["utilization"][r.types[t]] = r.utilization[t];
  std::printf("%s\n", j.dump().c_str());
}

// --sensitivity: the mean JCT over the seeds with every throughput 20% higher and lower,
// and with the extrapolated jobs left out.
void add_sensitivity(const RoundsExperiment& e, const FleetRoundsOptions& o, RoundPolicy policy,
                     const SeedSummary& all, nlohmann::ordered_json& summary) {
  const SeedSummary up = e.over_seeds(policy, o.seeds, 1.2, false);
  const SeedSummary down = e.over_seeds(policy, o.seeds, 0.8, false);
  const bool any = !e.continuous() && e.extrapolated() > 0;
  const SeedSummary kept = any ? e.over_seeds(policy, o.seeds, 1.0, true) : all;
  summary["sensitivity"] = {{"throughputs_plus_20_mean_jct_h", json_of(up)},
                            {"throughputs_plus_20_ci95_h", up.ci95_h},
                            {"throughputs_minus_20_mean_jct_h", json_of(down)},
                            {"throughputs_minus_20_ci95_h", down.ci95_h},
                            {"extrapolated_left_out_mean_jct_h", json_of(kept)},
                            {"extrapolated_left_out_jobs", any ? e.extrapolated() : 0}};
  if (!o.json)
    std::printf("%-22s %5s   throughputs +20%%: %s; -20%%: %s; extrapolated left out: %s\n",
                round_policy_name(policy), "sens", text_of(up, o.seeds.size()).c_str(),
                text_of(down, o.seeds.size()).c_str(),
                any ? (text_of(kept, o.seeds.size()) + " (" + std::to_string(e.extrapolated()) +
                       " jobs out)")
                          .c_str()
                    : "none extrapolated");
}

}  // namespace

int run_fleet_rounds(const FleetRoundsOptions& o) {
  RoundOptions options;
  options.max_active_jobs = o.max_active_jobs;
  options.solver =
      o.solver == "interior_point" ? MaxMinSolver::interior_point : MaxMinSolver::water_filling;
  const RoundsExperiment e(
      RoundsWorkloadSource{o.fleet, o.gavel, o.jobs_per_hour, o.single_gpu, o.stop_after,
                           o.throughputs, o.strict_throughputs, o.window},
      options);
  if (!o.json)
    print_heading(e);
  for (RoundPolicy policy : choose_round_policies(o.policy)) {
    std::vector<double> means;
    bool saturated = false;
    for (std::uint32_t seed : o.seeds) {
      const auto start = std::chrono::steady_clock::now();
      const RoundReport r = e.run(policy, seed);
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      saturated = saturated || r.saturated;
      if (!r.saturated)
        means.push_back(r.mean_jct_s / 3600);
      print_run(e, policy, seed, r, wall, o.json);
    }
    const SeedSummary all = summarize(means, saturated);
    nlohmann::ordered_json summary{{"policy", round_policy_name(policy)},
                                   {"seeds", o.seeds.size()},
                                   {"saturated", saturated},
                                   {"mean_jct_h", json_of(all)},
                                   {"ci95_h", all.ci95_h}};
    if (o.sensitivity)
      add_sensitivity(e, o, policy, all, summary);
    if (o.json)
      std::printf("%s\n", summary.dump().c_str());
    else if (o.seeds.size() > 1 && saturated)
      std::printf("%-22s %5s   saturated at some seed\n", round_policy_name(policy), "all");
    else if (o.seeds.size() > 1)
      std::printf("%-22s %5s %10.2fh  +/- %.2f h (95%% CI over %zu seeds)\n",
                  round_policy_name(policy), "all", *all.mean_h, all.ci95_h, means.size());
  }
  return 0;
}

}  // namespace loom::cli
