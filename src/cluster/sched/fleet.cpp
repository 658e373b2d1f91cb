#include "cluster/sched/fleet.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <set>

#include "cluster/catalog/catalog.h"
#include "core/checked.h"
#include "core/error.h"

namespace loom::cluster {
namespace {

std::int64_t positive(const std::string& text, const std::string& what, const std::string& where) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  check(used == text.size() && !text.empty() && value > 0,
        where + ": " + what + " '" + text + "' is not a positive integer");
  return value;
}

void validate(const Fleet& fleet, const std::string& where) {
  check(!fleet.pools.empty(), where + ": a fleet needs at least one pool");
  // Pool::chips() and Fleet::chips() multiply and add the counts unchecked; they are
  // checked once here, where the numbers come in.
  std::int64_t total = 0;
  for (const Pool& p : fleet.pools)
    total = checked_add(total,
                        checked_mul(p.nodes, p.chips_per_node,
                                    where + ": pool '" + p.chip + "': nodes x chips per node"),
                        where + ": the fleet's chip count");
  std::set<std::pair<std::string, std::int64_t>> seen;
  for (const Pool& p : fleet.pools)
    check(seen.insert({p.chip, p.chips_per_node}).second,
          where + ": two pools of chip '" + p.chip + "' with " + std::to_string(p.chips_per_node) +
              " chips per node; make them one pool");
}

}  // namespace

std::int64_t Fleet::chips() const {
  std::int64_t total = 0;
  for (const Pool& p : pools)
    total += p.chips();
  return total;
}

std::string Fleet::label(std::size_t pool) const {
  const Pool& p = pools.at(pool);
  for (std::size_t q = 0; q < pools.size(); ++q)
    if (q != pool && pools[q].chip == p.chip)
      return p.chip + ":" + std::to_string(p.nodes) + "x" + std::to_string(p.chips_per_node);
  return p.chip;
}

std::string Fleet::describe() const {
  std::string text;
  for (const Pool& p : pools)
    text += (text.empty() ? "" : ", ") + p.chip + ":" + std::to_string(p.nodes) + "x" +
            std::to_string(p.chips_per_node);
  return text + " (" + std::to_string(chips()) + " chips)";
}

Fleet parse_fleet(const std::string& spec) {
  Fleet fleet;
  const std::string where = "fleet '" + spec + "'";
  std::size_t start = 0;
  while (start <= spec.size()) {
    std::size_t comma = spec.find(',', start);
    std::string item =
        spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    std::size_t colon = item.find(':');
    check(colon != std::string::npos && colon > 0,
          where + ": pool '" + item + "' is not CHIP:NODESxCHIPS (e.g. h100-sxm:128x8)");
    Pool p;
    p.chip = item.substr(0, colon);
    std::string size = item.substr(colon + 1);
    std::size_t x = size.find('x');
    p.nodes = positive(size.substr(0, x), "node count", where);
    p.chips_per_node =
        x == std::string::npos ? 1 : positive(size.substr(x + 1), "chips per node", where);
    fleet.pools.push_back(p);
    if (comma == std::string::npos)
      break;
    start = comma + 1;
  }
  validate(fleet, where);
  return fleet;
}

Fleet load_fleet(const std::string& path) {
  return with_yaml_errors(path, [&] {
    const YAML::Node root = read_yaml_file(path);
    const YAML::Node pools = root["pools"];
    check(pools && pools.IsSequence(), path + ": field 'pools' is missing or not a list");
    Fleet fleet;
    for (std::size_t i = 0; i < pools.size(); ++i) {
      const std::string where = path + ": pools[" + std::to_string(i) + "]";
      const YAML::Node e = pools[i];
      check(e["chip"] && e["chip"].IsScalar(), where + ": field 'chip' is missing");
      Pool p;
      p.chip = e["chip"].as<std::string>();
      for (auto [field, slot] :
           {std::pair{"nodes", &p.nodes}, {"chips_per_node", &p.chips_per_node}}) {
        check(e[field] && e[field].IsScalar(), where + ": field '" + field + "' is missing");
        *slot = positive(e[field].as<std::string>(), std::string("field '") + field + "'", where);
      }
      fleet.pools.push_back(p);
    }
    validate(fleet, path);
    return fleet;
  });
}

Fleet fleet_from(const std::string& spec_or_path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(spec_or_path, ec))
    return load_fleet(spec_or_path);
  return parse_fleet(spec_or_path);
}

}  // namespace loom::cluster
