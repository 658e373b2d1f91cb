#include "cluster/sched/alibaba.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"

namespace loom::cluster {
namespace {

// A CSV file with a header: rows of fields by name. The trace has no quoted fields.
class CsvFile {
 public:
  CsvFile(const std::string& path, const std::vector<std::string>& needed) : path_(path) {
    in_.open(path);
    check(in_.good(), path + ": cannot read");
    std::string header;
    check(static_cast<bool>(std::getline(in_, header)), path + ": empty, expected a header line");
    names_ = split(header);
    for (const std::string& name : needed)
      check(std::find(names_.begin(), names_.end(), name) != names_.end(),
            path + ": the header has no column '" + name + "'");
  }
  // The next row (false at the end); `line` counts from 1 with the header.
  bool next() {
    std::string text;
    while (std::getline(in_, text)) {
      ++line_;
      if (!text.empty() && text.back() == '\r')
        text.pop_back();
      if (text.empty())
        continue;
      fields_ = split(text);
      check(fields_.size() == names_.size(),
            where() + ": " + std::to_string(fields_.size()) + " fields, expected " +
                std::to_string(names_.size()) + " as in the header");
      return true;
    }
    return false;
  }
  const std::string& text(const std::string& name) const {
    const auto it = std::find(names_.begin(), names_.end(), name);
    return fields_[static_cast<std::size_t>(it - names_.begin())];
  }
  // An integer in [low, high]; `empty` is returned for an empty field when given.
  std::int64_t integer(const std::string& name, std::int64_t low, std::int64_t high,
                       std::optional<std::int64_t> empty = std::nullopt) const {
    const std::string& value = text(name);
    if (value.empty() && empty)
      return *empty;
    std::int64_t v = 0;
    const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), v);
    check(error == std::errc() && end == value.data() + value.size() && v >= low && v <= high,
          where() + ": " + name + " '" + value + "': expected an integer from " +
              std::to_string(low) + " to " + std::to_string(high));
    return v;
  }
  std::string where() const { return path_ + " line " + std::to_string(line_ + 1); }

 private:
  static std::vector<std::string> split(const std::string& text) {
    std::vector<std::string> fields;
    std::size_t start = 0;
    while (true) {
      const std::size_t comma = text.find(',', start);
      fields.push_back(text.substr(start, comma - start));
      if (comma == std::string::npos)
        return fields;
      start = comma + 1;
    }
  }
  std::string path_;
  std::ifstream in_;
  std::vector<std::string> names_, fields_;
  std::int64_t line_ = 0;
};

// Times in the trace are seconds from its start; a year bounds them well.
constexpr std::int64_t kMaxTime = std::int64_t{1} << 40;

}  // namespace

AlibabaTrace load_alibaba_trace(const std::string& pods_csv, const std::string& nodes_csv) {
  AlibabaTrace trace;
  // Nodes -> pools of (model, GPUs per node), in model then size order.
  std::map<std::pair<std::string, std::int64_t>, std::int64_t> nodes_of;
  {
    CsvFile nodes(nodes_csv, {"sn", "gpu", "model"});
    while (nodes.next()) {
      const std::int64_t gpus = nodes.integer("gpu", 0, 1024);
      if (gpus == 0) {
        ++trace.cpu_nodes;
        continue;
      }
      const std::string& model = nodes.text("model");
      check(!model.empty() && model != "nan",
            nodes.where() + ": model '" + model + "': a node with GPUs needs its GPU model");
      ++nodes_of[{model, gpus}];
      ++trace.gpu_nodes;
    }
  }
  check(!nodes_of.empty(), nodes_csv + ": no node has GPUs");
  std::set<std::string> models;
  for (const auto& [key, count] : nodes_of) {
    trace.fleet.pools.push_back({key.first, count, key.second});
    models.insert(key.first);
  }
  CsvFile pods(pods_csv, {"name", "num_gpu", "gpu_milli", "gpu_spec", "creation_time",
                          "deletion_time", "scheduled_time"});
  while (pods.next()) {
    ++trace.pods;
    const std::int64_t gpus = pods.integer("num_gpu", 0, 1024);
    if (gpus == 0) {
      ++trace.cpu_only;
      continue;
    }
    const std::int64_t milli = pods.integer("gpu_milli", 1, 1000);
    check(gpus == 1 || milli == 1000, pods.where() + ": gpu_milli '" + pods.text("gpu_milli") +
                                          "' with num_gpu " + std::to_string(gpus) +
                                          ": expected 1000 (only a one-GPU pod shares its GPU)");
    const std::int64_t created = pods.integer("creation_time", 0, kMaxTime);
    const std::int64_t scheduled = pods.integer("scheduled_time", 0, kMaxTime, -1);
    const std::int64_t deleted = pods.integer("deletion_time", 0, kMaxTime, -1);
    if (scheduled < 0) {
      ++trace.never_scheduled;
      continue;
    }
    if (deleted < 0 || deleted <= scheduled) {
      ++trace.no_run_time;
      continue;
    }
    std::set<std::string> allowed;
    const std::string& spec = pods.text("gpu_spec");
    for (std::size_t start = 0; !spec.empty() && start <= spec.size();) {
      const std::size_t bar = std::min(spec.find('|', start), spec.size());
      const std::string model = spec.substr(start, bar - start);
      check(!model.empty(), pods.where() + ": gpu_spec '" + spec +
                                "': expected GPU models separated by '|' (e.g. V100M16|V100M32)");
      allowed.insert(model);
      start = bar + 1;
    }
    Job job;
    job.id = static_cast<std::int64_t>(trace.jobs.size());
    job.name = pods.text("name");
    job.arrival_s = static_cast<double>(created);
    job.chips = gpus;
    job.milli = milli < 1000 ? milli : 0;
    const double seconds = static_cast<double>(deleted - scheduled);
    std::string joined;
    for (const std::string& model : allowed.empty() ? models : allowed) {
      job.seconds_on[model] = seconds;  // a model the fleet lacks only makes it unplaceable
      if (!allowed.empty())
        joined += (joined.empty() ? "" : "|") + model;
    }
    trace.shared += job.milli > 0;
    trace.constrained += !allowed.empty();
    trace.job_models.push_back(joined);
    trace.jobs.push_back(std::move(job));
  }
  return trace;
}

}  // namespace loom::cluster
