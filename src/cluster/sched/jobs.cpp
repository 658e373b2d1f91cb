#include "cluster/sched/jobs.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cluster/catalog/catalog.h"
#include "cluster/plan/plan.h"
#include "cluster/sched/gavel.h"
#include "core/checked.h"
#include "core/error.h"

namespace loom::cluster {
namespace {

// The most chips (and the largest batch or sequence) a job may ask for.
constexpr std::int64_t kMaxChips = std::int64_t{1} << 31;

double parse_number(const std::string& text, const std::string& where) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  check(used == text.size() && !text.empty() && std::isfinite(value),
        where + ": '" + text + "' is not a number");
  return value;
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> fields;
  std::size_t start = 0;
  while (true) {
    std::size_t tab = line.find('\t', start);
    fields.push_back(
        line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos)
      return fields;
    start = tab + 1;
  }
}

}  // namespace

std::vector<Job> load_gavel_trace(const std::string& trace_path,
                                  const std::string& throughputs_path, std::int64_t* extrapolated,
                                  bool strict) {
  const GavelThroughputs table = GavelThroughputs::load(throughputs_path);
  std::ifstream trace(trace_path);
  check(trace.good(), trace_path + ": cannot open the trace");
  std::vector<Job> jobs;
  std::int64_t scaled = 0;
  std::string line;
  for (std::int64_t line_no = 1; std::getline(trace, line); ++line_no) {
    if (line.empty())
      continue;
    const std::string where = trace_path + ": line " + std::to_string(line_no);
    std::vector<std::string> f = split_tabs(line);
    // Gavel's trace formats over its history, told apart by their field count.
    struct Format {
      std::size_t total_steps, arrival, scale, weight;  // weight: SIZE_MAX when absent
      const char* fields;
    };
    static const std::map<std::size_t, Format> formats{
        {6,
         {3, 4, 5, SIZE_MAX,
          "job_type, command, num_steps_arg, total_steps, arrival_time, scale_factor"}},
        {7,
         {4, 5, 6, SIZE_MAX,
          "job_type, command, num_steps_arg, needs_data_dir, total_steps, arrival_time_s, "
          "scale_factor"}},
        {9,
         {4, 8, 5, 6,
          "job_type, command, num_steps_arg, needs_data_dir, total_steps, scale_factor, "
          "priority_weight, SLO, arrival_time"}},
        {10,
         {5, 9, 6, 7,
          "job_type, command, working_directory, num_steps_arg, needs_data_dir, total_steps, "
          "scale_factor, priority_weight, SLO, arrival_time"}}};
    auto format = formats.find(f.size());
    check(format != formats.end(),
          where + ": " + std::to_string(f.size()) +
              " tab-separated fields, expected one of Gavel's trace formats: 10 (" +
              formats.at(10).fields + "), 9 (without working_directory), 7 (" +
              formats.at(7).fields + ") or 6 (" + formats.at(6).fields + ")");
    const Format& fmt = format->second;
    Job job;
    job.id = static_cast<std::int64_t>(jobs.size());
    job.name = f[0];
    const double steps = parse_number(f[fmt.total_steps], where + ": total_steps");
    job.arrival_s = parse_number(f[fmt.arrival], where + ": arrival_time");
    // Range-checked before the cast: 1e30 was undefined behaviour, and 2.7 truncated to 2.
    job.chips = whole_number(parse_number(f[fmt.scale], where + ": scale_factor"), 1, kMaxChips,
                             where + ": scale_factor");
    check(steps > 0 && job.arrival_s >= 0,
          where + ": total_steps and arrival_time must be positive");
    job.steps = steps;
    if (fmt.weight != SIZE_MAX) {
      job.weight = parse_number(f[fmt.weight], where + ": priority_weight");
      check(job.weight > 0 && job.weight <= 1e6,
            where + ": priority_weight is " + f[fmt.weight] + ", expected a weight in (0, 1e6]");
    }
    // The measured scale factor at or below the job's (linear scaling above it).
    auto first = table.steps_per_s.lower_bound({job.name, 0});
    check(first != table.steps_per_s.end() && first->first.first == job.name,
          where + ": job type '" + job.name + "' is not in " + throughputs_path);
    auto measured = table.steps_per_s.upper_bound({job.name, job.chips});
    check(measured != first, where + ": no throughput for '" + job.name + "' at " +
                                 std::to_string(job.chips) + " or fewer workers");
    --measured;
    if (strict && measured->first.second != job.chips) {
      std::string scales;
      for (auto it = first; it != table.steps_per_s.end() && it->first.first == job.name; ++it)
        scales += (scales.empty() ? "" : ", ") + std::to_string(it->first.second);
      throw Error(where + ": '" + job.name + "' on " + std::to_string(job.chips) +
                  " workers: " + throughputs_path + " measures it on " + scales +
                  " only, and --strict-throughputs refuses extrapolated run times");
    }
    const double factor =
        static_cast<double>(job.chips) / static_cast<double>(measured->first.second);
    scaled += measured->first.second != job.chips;
    job.extrapolated = measured->first.second != job.chips;
    for (const auto& [worker, rate] : measured->second)
      job.seconds_on[worker] = steps / (rate * factor);
    jobs.push_back(std::move(job));
  }
  if (extrapolated != nullptr)
    *extrapolated = scaled;
  return jobs;
}

std::vector<Job> load_training_jobs(const std::string& path, const Catalog& catalog,
                                    const Fleet& fleet) {
  return with_yaml_errors(path, [&] {
    const YAML::Node root = read_yaml_file(path);
    const YAML::Node list = root["jobs"];
    check(list && list.IsSequence(), path + ": field 'jobs' is missing or not a list");
    ThroughputCache cache;
    std::vector<Job> jobs;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string where = path + ": jobs[" + std::to_string(i) + "]";
      const YAML::Node e = list[i];
      auto text = [&](const char* field) {
        check(e[field] && e[field].IsScalar(), where + ": field '" + field + "' is missing");
        return e[field].as<std::string>();
      };
      Job job;
      job.id = static_cast<std::int64_t>(i);
      job.name = text("model");
      const Model& model = catalog.model(job.name);
      const double tokens = parse_number(text("tokens"), where + ": field 'tokens'");
      const double chips = parse_number(text("chips"), where + ": field 'chips'");
      check(tokens > 0,
            where + ": field 'tokens' is " + text("tokens") + ", expected a positive number");
      job.chips = whole_number(chips, 1, kMaxChips, where + ": field 'chips'");
      job.arrival_s = e["arrival_h"]
                          ? 3600.0 * parse_number(text("arrival_h"), where + ": field 'arrival_h'")
                          : 0.0;
      check(job.arrival_s >= 0, where + ": field 'arrival_h' is negative");
      // Optional: the global batch in sequences and the sequence length (otherwise the
      // planner's defaults: about 4M tokens, the model's sequence).
      Constraints fixed;
      for (auto [field, slot] :
           {std::pair{"global_batch", &fixed.global_batch}, {"seq", &fixed.seq}}) {
        if (!e[field])
          continue;
        const std::string at = where + ": field '" + field + "'";
        *slot = whole_number(parse_number(text(field), at), 1, kMaxChips, at);
      }
      for (const Pool& pool : fleet.pools) {
        const double rate = cache.tokens_per_s(model, catalog.chip(pool.chip), job.chips, fixed);
        if (rate > 0)
          job.seconds_on[pool.chip] = tokens / rate;
      }
      jobs.push_back(std::move(job));
    }
    std::stable_sort(jobs.begin(), jobs.end(),
                     [](const Job& a, const Job& b) { return a.arrival_s < b.arrival_s; });
    return jobs;
  });
}

std::vector<Job> synthetic_jobs(std::int64_t count, const Fleet& fleet, double load,
                                std::uint64_t seed) {
  check(count > 0 && load > 0, "synthetic jobs: the count and the load must be positive");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::int64_t node = 1;
  for (const Pool& p : fleet.pools)
    node = std::max(node, p.chips_per_node);
  std::vector<Job> jobs(static_cast<std::size_t>(count));
  double work = 0;  // chip-seconds on the reference (first) chip type
  for (std::int64_t i = 0; i < count; ++i) {
    Job& job = jobs[static_cast<std::size_t>(i)];
    job.id = i;
    job.name = "synthetic";
    // Chips: 1, 2, 4, ... up to a node with falling odds, then 2-16 whole nodes (5%).
    const double u = unit(rng);
    if (u < 0.95) {
      std::int64_t chips = 1;
      while (chips < node && unit(rng) < 0.45)
        chips *= 2;
      job.chips = chips;
    } else {
      job.chips = node * (2 << static_cast<int>(unit(rng) * 4));
    }
    // Run time: log-uniform from 5 minutes to 5 days on the reference type.
    const double seconds = 300.0 * std::pow(1440.0, unit(rng));
    work += seconds * static_cast<double>(job.chips);
    for (std::size_t p = 0; p < fleet.pools.size(); ++p) {
      const double speed = p == 0 ? 1.0 : std::pow(4.0, 2.0 * unit(rng) - 1.0);  // 1/4x .. 4x
      job.seconds_on[fleet.pools[p].chip] = seconds / speed;
    }
  }
  // Poisson arrivals whose mean rate keeps `load` of the fleet's chips busy.
  const double span = work / (load * static_cast<double>(fleet.chips()));
  std::exponential_distribution<double> gap(static_cast<double>(count) / span);
  double t = 0;
  for (Job& job : jobs) {
    job.arrival_s = t;
    t += gap(rng);
  }
  return jobs;
}

std::vector<Job> with_speed(std::vector<Job> jobs, double speed) {
  check(speed > 0 && std::isfinite(speed), "with_speed: the factor must be positive");
  for (Job& job : jobs)
    for (auto& [type, seconds] : job.seconds_on)
      seconds /= speed;
  return jobs;
}

std::vector<Job> without_extrapolated(const std::vector<Job>& jobs) {
  std::vector<Job> kept;
  std::copy_if(jobs.begin(), jobs.end(), std::back_inserter(kept),
               [](const Job& job) { return !job.extrapolated; });
  return kept;
}

}  // namespace loom::cluster
