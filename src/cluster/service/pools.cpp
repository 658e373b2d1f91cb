#include "cluster/service/pools.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "cluster/catalog/catalog.h"
#include "core/checked.h"
#include "core/error.h"

namespace loom::service {

std::vector<PoolSpec> load_pools(const std::string& path) {
  return cluster::with_yaml_errors(path, [&] {
    YAML::Node root = cluster::read_yaml_file(path);
    check(root.IsMap() && root["pools"] && root["pools"].IsSequence() && root["pools"].size() > 0,
          path + ": expected 'pools:', a list of pools");
    std::vector<PoolSpec> pools;
    std::set<std::string> names;
    for (std::size_t i = 0; i < root["pools"].size(); ++i) {
      const YAML::Node node = root["pools"][i];
      const std::string where = path + ": pools[" + std::to_string(i) + "]";
      check(node.IsMap(), where + ": expected a mapping of fields");
      static const std::set<std::string> known{
          "name", "executor",       "backend",    "slots",     "threads",
          "chip", "price_per_hour", "slurm_conf", "partition", "gres"};
      for (const auto& item : node) {
        check(item.first.IsScalar(), where + ": a key must be a field name");
        check(known.count(item.first.Scalar()) > 0,
              where + ": field '" + item.first.Scalar() +
                  "' is unknown (name, executor, backend, slots, threads, price_per_hour, chip, "
                  "slurm_conf, partition, gres)");
      }
      auto text = [&](const char* field, const std::string& fallback) {
        if (!node[field])
          return fallback;
        check(node[field].IsScalar() && !node[field].Scalar().empty(),
              where + ": field '" + field + "' must be a non-empty word");
        return node[field].Scalar();
      };
      auto number = [&](const char* field, double fallback) {
        if (!node[field])
          return fallback;
        double value = 0;
        check(node[field].IsScalar() && YAML::convert<double>::decode(node[field], value),
              where + ": field '" + field + "' is '" +
                  (node[field].IsScalar() ? node[field].Scalar() : "not a number") +
                  "', expected a number");
        return value;
      };
      PoolSpec p;
      check(node["name"].IsDefined(), where + ": field 'name' is missing");
      p.name = text("name", "");
      check(p.name.find_first_of(" \t\n/\"'") == std::string::npos && p.name.size() <= 64,
            where + ": name '" + p.name + "' must be one word of at most 64 characters, no '/'");
      check(names.insert(p.name).second, where + ": pool name '" + p.name + "' is used twice");
      p.executor = text("executor", "local");
      check(p.executor == "local" || p.executor == "slurm",
            where + ": executor '" + p.executor + "' is unknown, expected local or slurm");
      p.slurm_conf = text("slurm_conf", "");
      p.partition = text("partition", "");
      p.gres = text("gres", "");
      check(
          p.executor == "slurm" || (p.slurm_conf.empty() && p.partition.empty() && p.gres.empty()),
          where + ": slurm_conf, partition and gres belong to executor slurm, not " + p.executor);
      std::error_code missing;  // the non-throwing form: a name too long is "missing" too
      check(p.slurm_conf.empty() || std::filesystem::exists(p.slurm_conf, missing),
            where + ": field 'slurm_conf' names '" + p.slurm_conf + "', which does not exist");
      check(p.gres.find_first_of(" \t'\"") == std::string::npos,
            where + ": field 'gres' is '" + p.gres + "', expected a GRES such as gpu:h100:1");
      p.backend = text("backend", "cpu");
      p.chip = text("chip", "");
      p.slots = whole_number(number("slots", 1), 1, 4096, where + ": field 'slots'");
      p.threads = whole_number(number("threads", 1), 1, 1024, where + ": field 'threads'");
      p.price_per_hour = number("price_per_hour", 0);
      check(std::isfinite(p.price_per_hour) && p.price_per_hour >= 0 && p.price_per_hour <= 1e6,
            where + ": field 'price_per_hour' is " + number_text(p.price_per_hour) +
                ", expected a price in [0, 1e6]");
      pools.push_back(p);
    }
    return pools;
  });
}

}  // namespace loom::service
