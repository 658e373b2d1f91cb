#include "cluster/sched/experiment.h"

#include <algorithm>
#include <filesystem>

#include "cluster/catalog/catalog.h"
#include "cluster/sched/alibaba.h"
#include "cluster/sched/mean_interval.h"
#include "core/error.h"

namespace loom::cluster {

namespace {

// A Gavel trace's throughput table: ../simulation_throughputs.json beside the trace's folder.
std::string table_beside(const std::string& trace) {
  return (std::filesystem::path(trace).parent_path().parent_path() / "simulation_throughputs.json")
      .string();
}

std::string extrapolation_basis(std::int64_t jobs, std::int64_t extrapolated) {
  return std::to_string(jobs - extrapolated) + " from measured throughputs, " +
         std::to_string(extrapolated) +
         " extrapolated (scale factors above the table's, scaled linearly)";
}

Workload alibaba_workload(const WorkloadSource& s) {
  const std::string nodes =
      !s.alibaba_nodes.empty()
          ? s.alibaba_nodes
          : (std::filesystem::path(s.alibaba).parent_path() / "openb_node_list_gpu_node.csv")
                .string();
  AlibabaTrace trace = load_alibaba_trace(s.alibaba, nodes);
  Workload w;
  w.fleet = std::move(trace.fleet);
  w.jobs = std::move(trace.jobs);
  const auto n = static_cast<std::int64_t>(w.jobs.size());
  w.source = "Alibaba PAI 2023 " + s.alibaba + ": " + std::to_string(trace.pods) + " pods; " +
             std::to_string(n) + " GPU pods replayed (" + std::to_string(trace.shared) +
             " sharing a GPU, " + std::to_string(trace.constrained) +
             " with a GPU type constraint); not replayed: " + std::to_string(trace.cpu_only) +
             " CPU-only, " + std::to_string(trace.never_scheduled) + " never scheduled, " +
             std::to_string(trace.no_run_time) + " deleted before scheduled";
  w.basis = std::to_string(n) +
            " measured (deletion - scheduled), the same on every GPU model a pod may use: the "
            "trace discloses no speeds";
  w.run_times = {{"measured", n}, {"extrapolated", 0}};
  return w;
}

}  // namespace

Workload load_workload(const WorkloadSource& s) {
  const int sources = !s.gavel.empty() + !s.jobs.empty() + (s.synthetic > 0) + !s.alibaba.empty();
  check(sources == 1,
        "loom fleet simulate needs exactly one of --gavel, --jobs, --synthetic and --alibaba");
  check(s.alibaba.empty() == !s.fleet.empty(),
        s.alibaba.empty()
            ? "loom fleet simulate needs --fleet"
            : "loom fleet simulate --alibaba: the node list is the fleet; drop --fleet");
  if (!s.alibaba.empty())
    return alibaba_workload(s);
  Workload w;
  w.fleet = fleet_from(s.fleet);
  if (!s.gavel.empty()) {
    std::int64_t extrapolated = 0;
    w.jobs =
        load_gavel_trace(s.gavel, s.throughputs.empty() ? table_beside(s.gavel) : s.throughputs,
                         &extrapolated, s.strict_throughputs);
    const auto n = static_cast<std::int64_t>(w.jobs.size());
    w.source = "Gavel trace " + s.gavel;
    w.basis = extrapolation_basis(n, extrapolated);
    w.run_times = {{"measured", n - extrapolated}, {"extrapolated", extrapolated}};
  } else if (!s.jobs.empty()) {
    const Catalog catalog = Catalog::load(s.catalog.empty() ? default_catalog_dir() : s.catalog);
    w.jobs = load_training_jobs(s.jobs, catalog, w.fleet);
    const auto n = static_cast<std::int64_t>(w.jobs.size());
    w.source = "training jobs " + s.jobs;
    w.basis = std::to_string(n) + " from the performance model, none measured";
    w.run_times = {{"modelled", n}, {"measured", 0}, {"extrapolated", 0}};
  } else {
    w.jobs = synthetic_jobs(s.synthetic, w.fleet, s.load, s.seed);
    const auto n = static_cast<std::int64_t>(w.jobs.size());
    w.source = "synthetic (load " + std::to_string(s.load).substr(0, 4) + ", seed " +
               std::to_string(s.seed) + ")";
    w.basis = std::to_string(n) + " synthetic";
    w.run_times = {{"synthetic", n}, {"measured", 0}, {"extrapolated", 0}};
  }
  return w;
}

PolicyChoice choose_policies(const std::string& name, const std::vector<Job>& jobs) {
  PolicyChoice choice;
  choice.policies = name == "all" ? all_policies() : std::vector<Policy>{parse_policy(name)};
  const auto sharing =
      std::count_if(jobs.begin(), jobs.end(), [](const Job& j) { return j.milli > 0; });
  if (name == "all" && sharing > 0) {
    std::erase(choice.policies, Policy::las);
    choice.left_out = "las not run: it preempts whole chips only, and " + std::to_string(sharing) +
                      " jobs share a chip";
  }
  return choice;
}

std::vector<double> mean_jct_h_per_seed(const Workload& workload, const WorkloadSource& source,
                                        Policy policy, Failures failures,
                                        const Preemption& preemption,
                                        const std::vector<std::uint64_t>& seeds) {
  std::vector<double> means;
  for (std::uint64_t seed : seeds) {
    failures.seed = seed;
    const std::vector<Job> jobs =
        source.synthetic > 0 ? synthetic_jobs(source.synthetic, workload.fleet, source.load, seed)
                             : workload.jobs;
    means.push_back(simulate(workload.fleet, jobs, policy, failures, preemption, seed).mean_jct_s /
                    3600);
  }
  return means;
}

// --- Round-based scheduling ---

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

RoundsExperiment::RoundsExperiment(const RoundsWorkloadSource& source, RoundOptions options)
    : source_(source), options_(options) {
  check((source.jobs_per_hour > 0) + !source.gavel.empty() == 1,
        "loom fleet rounds needs exactly one of --gavel-continuous RATE and --gavel TRACE");
  fleet_ = fleet_from(source.fleet);
  std::string table_path = source.throughputs;
  if (table_path.empty())
    table_path = !source.gavel.empty()
                     ? table_beside(source.gavel)
                     : (std::filesystem::path(default_catalog_dir()).parent_path() / "data" /
                        "traces" / "gavel" / "simulation_throughputs.json")
                           .string();
  table_ = std::make_unique<GavelThroughputs>(GavelThroughputs::load(table_path));
  if (!source.window.empty()) {
    std::tie(options_.window_begin, options_.window_end) = parse_window(source.window);
  } else if (continuous()) {  // as Gavel measures a continuous stream
    options_.window_begin = 4000;
    options_.window_end = 5000;
  }
  if (!source.gavel.empty())
    trace_ = load_gavel_trace(source.gavel, table_path, &extrapolated_, source.strict_throughputs);
  workload_ = continuous()
                  ? std::string("Gavel continuous-") + (source.single_gpu ? "single" : "multiple") +
                        " at " + std::to_string(source.jobs_per_hour).substr(0, 5) + " jobs/h"
                  : "Gavel trace " + source.gavel + " (" + std::to_string(trace_.size()) + " jobs)";
  // Gavel's measured throughputs, scaled linearly for a trace's jobs above the table's scale
  // factors (the continuous workload draws measured ones only).
  basis_ = continuous()
               ? "every job from measured throughputs (the workload draws measured "
                 "scale factors only)"
               : extrapolation_basis(static_cast<std::int64_t>(trace_.size()), extrapolated_);
}

RoundReport RoundsExperiment::run(RoundPolicy policy, std::uint32_t seed, double speed,
                                  bool measured_only) const {
  RoundOptions options = options_;
  options.seed = seed;
  JobSource inner;
  std::unique_ptr<GavelContinuousJobs> stream;
  std::size_t next = 0;
  if (continuous()) {
    stream = std::make_unique<GavelContinuousJobs>(
        *table_, GavelContinuousOptions{source_.jobs_per_hour, !source_.single_gpu, seed, "v100"});
    inner = [&]() -> std::optional<Job> {
      if (source_.stop_after > 0 && next == static_cast<std::size_t>(source_.stop_after))
        return std::nullopt;
      ++next;
      return stream->next();
    };
  } else {
    inner = [&]() -> std::optional<Job> {
      if (next == trace_.size())
        return std::nullopt;
      return trace_[next++];
    };
  }
  JobSource jobs = [&]() -> std::optional<Job> {
    std::optional<Job> job = inner();
    while (job && measured_only && job->extrapolated)
      job = inner();
    if (job && speed != 1)
      for (auto& [type, seconds] : job->seconds_on)
        seconds /= speed;
    return job;
  };
  return simulate_rounds(fleet_, jobs, policy, options);
}

SeedSummary summarize(const std::vector<double>& means_h, bool saturated) {
  SeedSummary s;
  if (saturated || means_h.empty())
    return s;
  const MeanInterval m = mean_interval(means_h);
  s.mean_h = m.mean;
  s.ci95_h = m.half;
  return s;
}

SeedSummary RoundsExperiment::over_seeds(RoundPolicy policy,
                                         const std::vector<std::uint32_t>& seeds, double speed,
                                         bool measured_only) const {
  std::vector<double> means;
  bool saturated = false;
  for (std::uint32_t seed : seeds) {
    const RoundReport r = run(policy, seed, speed, measured_only);
    saturated = saturated || r.saturated;
    if (!r.saturated)
      means.push_back(r.mean_jct_s / 3600);
  }
  return summarize(means, saturated);
}

std::vector<RoundPolicy> choose_round_policies(const std::string& name) {
  if (name == "all")
    return {RoundPolicy::max_min_fairness, RoundPolicy::max_min_fairness_perf, RoundPolicy::fifo,
            RoundPolicy::fifo_perf};
  const std::optional<RoundPolicy> policy = parse_round_policy(name);
  check(policy.has_value(), "--policy '" + name +
                                "': expected max_min_fairness, max_min_fairness_perf, fifo, "
                                "fifo_perf or all");
  return {*policy};
}

}  // namespace loom::cluster
