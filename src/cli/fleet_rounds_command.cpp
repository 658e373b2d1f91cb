#include "cli/fleet_rounds_command.h"

#include "cli/mean_interval.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cluster/catalog/catalog.h"
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

std::pair<std::int64_t, std::int64_t> parse_window(const std::string& text) {
  const std::size_t colon = text.find(':');
  auto number = [&](const std::string& part) {
    check(!part.empty() && part.size() < 12 &&
              part.find_first_not_of("0123456789") == std::string::npos,
          "--window '" + text + "': expected FIRST:END, two job ids");
    return std::stoll(part);
  };
  check(colon != std::string::npos, "--window '" + text + "': expected FIRST:END");
  const std::int64_t first = number(text.substr(0, colon)), end = number(text.substr(colon + 1));
  check(end > first, "--window '" + text + "': END must be above FIRST");
  return {first, end};
}

}  // namespace

int run_fleet_rounds(const FleetRoundsOptions& o) {
  check((o.jobs_per_hour > 0) + !o.gavel.empty() == 1,
        "loom fleet rounds needs exactly one of --gavel-continuous RATE and --gavel TRACE");
  const Fleet fleet = fleet_from(o.fleet);
  std::string table_path = o.throughputs;
  if (table_path.empty())
    table_path = !o.gavel.empty() ? (std::filesystem::path(o.gavel).parent_path().parent_path() /
                                     "simulation_throughputs.json")
                                        .string()
                                  : (std::filesystem::path(default_catalog_dir()).parent_path() /
                                     "data" / "traces" / "gavel" / "simulation_throughputs.json")
                                        .string();
  const GavelThroughputs table = GavelThroughputs::load(table_path);
  RoundOptions options;
  options.max_active_jobs = o.max_active_jobs;
  options.solver =
      o.solver == "interior_point" ? MaxMinSolver::interior_point : MaxMinSolver::water_filling;
  if (!o.window.empty()) {
    std::tie(options.window_begin, options.window_end) = parse_window(o.window);
  } else if (o.jobs_per_hour > 0) {
    options.window_begin = 4000;
    options.window_end = 5000;
  }
  check(o.jobs_per_hour > 0 || !o.gavel.empty() || options.window_end > 0,
        "loom fleet rounds: a continuous workload needs a window");
  std::vector<Job> trace;
  std::int64_t extrapolated = 0;
  if (!o.gavel.empty())
    trace = load_gavel_trace(o.gavel, table_path, &extrapolated, o.strict_throughputs);
  std::vector<RoundPolicy> policies;
  if (o.policy == "all")
    policies = {RoundPolicy::max_min_fairness, RoundPolicy::max_min_fairness_perf,
                RoundPolicy::fifo, RoundPolicy::fifo_perf};
  else
    policies = {*parse_round_policy(o.policy)};
  const std::string workload =
      o.jobs_per_hour > 0
          ? std::string("Gavel continuous-") + (o.single_gpu ? "single" : "multiple") + " at " +
                std::to_string(o.jobs_per_hour).substr(0, 5) + " jobs/h"
          : "Gavel trace " + o.gavel + " (" + std::to_string(trace.size()) + " jobs)";
  // What the run times rest on: Gavel's measured throughputs, scaled linearly for a trace's
  // jobs above the table's scale factors (the continuous workload draws measured ones only).
  const std::string basis =
      o.jobs_per_hour > 0
          ? "every job from measured throughputs (the workload draws measured scale factors "
            "only)"
          : std::to_string(static_cast<std::int64_t>(trace.size()) - extrapolated) +
                " from measured throughputs, " + std::to_string(extrapolated) +
                " extrapolated (scale factors above the table's, scaled linearly)";
  if (!o.json) {
    std::printf("fleet: %s\njobs: %s; window: %s\nrun times: %s\n\n", fleet.describe().c_str(),
                workload.c_str(),
                options.window_end < 0 ? "every job"
                                       : ("ids " + std::to_string(options.window_begin) + "-" +
                                          std::to_string(options.window_end - 1))
                                             .c_str(),
                basis.c_str());
    std::printf("%-22s %5s %12s %9s %9s %9s %8s\n", "policy", "seed", "mean JCT", "jobs", "rounds",
                "allocs", "wall");
  }
  // One seed's run: the jobs with every throughput times `speed`, without the extrapolated
  // ones when `measured_only`.
  auto run = [&](RoundPolicy policy, std::uint32_t seed, double speed, bool measured_only) {
    options.seed = seed;
    JobSource inner;
    std::unique_ptr<GavelContinuousJobs> stream;
    std::size_t next = 0;
    if (o.jobs_per_hour > 0) {
      stream = std::make_unique<GavelContinuousJobs>(
          table, GavelContinuousOptions{o.jobs_per_hour, !o.single_gpu, seed, "v100"});
      inner = [&]() -> std::optional<Job> {
        if (o.stop_after > 0 && next == static_cast<std::size_t>(o.stop_after))
          return std::nullopt;
        ++next;
        return stream->next();
      };
    } else {
      inner = [&]() -> std::optional<Job> {
        if (next == trace.size())
          return std::nullopt;
        return trace[next++];
      };
    }
    JobSource source = [&]() -> std::optional<Job> {
      std::optional<Job> job = inner();
      while (job && measured_only && job->extrapolated)
        job = inner();
      if (job && speed != 1)
        for (auto& [type, seconds] : job->seconds_on)
          seconds /= speed;
      return job;
    };
    return simulate_rounds(fleet, source, policy, options);
  };
  // Over the seeds: the mean and a 95% confidence interval (Student's t); nullopt when a
  // seed saturated.
  struct Summary {
    std::optional<double> mean;
    double half = 0;
  };
  auto summarize = [&](const std::vector<double>& means, bool saturated) {
    Summary s;
    if (saturated || means.empty())
      return s;
    const MeanInterval m = mean_interval(means);
    s.mean = m.mean;
    s.half = m.half;
    return s;
  };
  auto over_seeds = [&](RoundPolicy policy, double speed, bool measured_only) {
    std::vector<double> means;
    bool saturated = false;
    for (std::uint32_t seed : o.seeds) {
      const RoundReport r = run(policy, seed, speed, measured_only);
      saturated = saturated || r.saturated;
      if (!r.saturated)
        means.push_back(r.mean_jct_s / 3600);
    }
    return summarize(means, saturated);
  };
  auto json_of = [](const Summary& s) {
    return s.mean ? nlohmann::ordered_json(*s.mean) : nlohmann::ordered_json();
  };
  auto text_of = [&](const Summary& s) {
    char text[64];
    if (!s.mean)
      return std::string("saturated");
    if (o.seeds.size() > 1)
      std::snprintf(text, sizeof text, "%.2fh +/- %.2f", *s.mean, s.half);
    else
      std::snprintf(text, sizeof text, "%.2fh", *s.mean);
    return std::string(text);
  };
  for (RoundPolicy policy : policies) {
    std::vector<double> means;
    bool saturated = false;
    for (std::uint32_t seed : o.seeds) {
      const auto start = std::chrono::steady_clock::now();
      const RoundReport r = run(policy, seed, 1.0, false);
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      saturated = saturated || r.saturated;
      if (!r.saturated)
        means.push_back(r.mean_jct_s / 3600);
      if (o.json) {
        nlohmann::ordered_json j{
            {"policy", round_policy_name(policy)},
            {"seed", seed},
            {"fleet", fleet.describe()},
            {"workload", workload},
            {"run_times",
             {{"measured", o.jobs_per_hour > 0 ? r.jobs : r.jobs - extrapolated},
              {"extrapolated", o.jobs_per_hour > 0 ? 0 : extrapolated}}},
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
      } else {
        std::printf("%-22s %5u %11s %9lld %9lld %9lld %7.1fs\n", round_policy_name(policy), seed,
                    r.saturated ? "saturated"
                                : (std::to_string(r.mean_jct_s / 3600).substr(0, 6) + "h").c_str(),
                    static_cast<long long>(r.jobs), static_cast<long long>(r.rounds),
                    static_cast<long long>(r.allocations), wall);
      }
    }
    const Summary all = summarize(means, saturated);
    nlohmann::ordered_json summary{{"policy", round_policy_name(policy)},
                                   {"seeds", o.seeds.size()},
                                   {"saturated", saturated},
                                   {"mean_jct_h", json_of(all)},
                                   {"ci95_h", all.half}};
    if (o.sensitivity) {
      const Summary up = over_seeds(policy, 1.2, false), down = over_seeds(policy, 0.8, false);
      const bool any = o.jobs_per_hour <= 0 && extrapolated > 0;
      const Summary kept = any ? over_seeds(policy, 1.0, true) : all;
      summary["sensitivity"] = {{"throughputs_plus_20_mean_jct_h", json_of(up)},
                                {"throughputs_plus_20_ci95_h", up.half},
                                {"throughputs_minus_20_mean_jct_h", json_of(down)},
                                {"throughputs_minus_20_ci95_h", down.half},
                                {"extrapolated_left_out_mean_jct_h", json_of(kept)},
                                {"extrapolated_left_out_jobs", any ? extrapolated : 0}};
      if (!o.json)
        std::printf(
            "%-22s %5s   throughputs +20%%: %s; -20%%: %s; extrapolated left out: %s\n",
            round_policy_name(policy), "sens", text_of(up).c_str(), text_of(down).c_str(),
            any ? (text_of(kept) + " (" + std::to_string(extrapolated) + " jobs out)").c_str()
                : "none extrapolated");
    }
    if (o.json) {
      std::printf("%s\n", summary.dump().c_str());
    } else if (o.seeds.size() > 1) {
      if (saturated)
        std::printf("%-22s %5s   saturated at some seed\n", round_policy_name(policy), "all");
      else
        std::printf("%-22s %5s %10.2fh  +/- %.2f h (95%% CI over %zu seeds)\n",
                    round_policy_name(policy), "all", *all.mean, all.half, means.size());
    }
  }
  return 0;
}

}  // namespace loom::cli
