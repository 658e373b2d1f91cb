#include "cluster/service/job_file.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>

#include "cluster/catalog/catalog.h"
#include "core/error.h"
#include "core/job_contract.h"

namespace loom::service {

namespace fs = std::filesystem;

nlohmann::json json_of(const YAML::Node& node, const std::string& where) {
  if (node.IsMap()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& item : node) {
      check(item.first.IsScalar(), where + ": a key must be a field name");
      j[item.first.Scalar()] = json_of(item.second, where + "." + item.first.Scalar());
    }
    return j;
  }
  if (node.IsSequence()) {
    nlohmann::json j = nlohmann::json::array();
    for (std::size_t i = 0; i < node.size(); ++i)
      j.push_back(json_of(node[i], where + "[" + std::to_string(i) + "]"));
    return j;
  }
  if (node.IsNull())
    return nullptr;
  const std::string& text = node.Scalar();
  if (node.Tag() == "!")
    return text;
  if (text == "true" || text == "false")
    return text == "true";
  std::int64_t i = 0;
  if (YAML::convert<std::int64_t>::decode(node, i) &&
      text.find_first_of(".eE") == std::string::npos)
    return i;
  double d = 0;
  if (YAML::convert<double>::decode(node, d))
    return d;
  return text;
}

nlohmann::json read_job_file(const std::string& path) {
  YAML::Node root = cluster::read_yaml_file(path);
  check(root.IsMap(), path + ": a job is a mapping of fields (name, config, steps, ...)");
  nlohmann::json job = json_of(root, path);
  const fs::path base = fs::absolute(path).parent_path();
  if (job.contains("config_file")) {
    check(!job.contains("config"), path + ": give config or config_file, not both");
    check(job["config_file"].is_string(), path + ": field 'config_file' must be a path");
    fs::path file = job["config_file"].get<std::string>();
    if (file.is_relative())
      file = base / file;
    job["config"] = json_of(cluster::read_yaml_file(file.string()), file.string());
    job.erase("config_file");
  }
  if (job.contains("config") && job["config"].is_object())
    for (const contract::TrainKey& train_key : contract::kTrainKeys) {
      const std::string key(train_key.name);
      if (!train_key.has(contract::kPath) || !job["config"].contains(key) ||
          !job["config"][key].is_string())
        continue;
      const std::string value = job["config"][key].get<std::string>();
      if (value == "random" || value == "mnist" || value.empty() || fs::path(value).is_absolute())
        continue;
      for (const fs::path& candidate : {base / value, fs::absolute(value)})
        if (std::error_code ec; fs::exists(candidate, ec)) {
          job["config"][key] = fs::weakly_canonical(candidate).string();
          break;
        }
    }
  return job;
}

}  // namespace loom::service
