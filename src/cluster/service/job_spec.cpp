#include "cluster/service/job_spec.h"

#include <cmath>
#include <set>

#include "core/error.h"
#include "core/job_contract.h"

namespace loom::service {

namespace {

constexpr std::size_t kMaxText = 4096;
constexpr std::size_t kMaxConfigKeys = 200;

[[noreturn]] void refuse(const std::string& where, const std::string& field,
                         const nlohmann::json& value, const std::string& expected) {
  std::string shown = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (shown.size() > 80) {
    std::size_t cut = 77;
    while (cut > 0 && (static_cast<unsigned char>(shown[cut]) & 0xC0) == 0x80)
      --cut;  // not inside a UTF-8 sequence: the message stays valid UTF-8
    shown = shown.substr(0, cut) + "...";
  }
  throw BadRequest(400, where + ": field '" + field + "' is " + shown + ", expected " + expected);
}

std::string text_field(const nlohmann::json& j, const std::string& where, const char* field,
                       std::size_t max = 200) {
  const nlohmann::json& v = j.at(field);
  if (!v.is_string() || v.get_ref<const std::string&>().empty() ||
      v.get_ref<const std::string&>().size() > max)
    refuse(where, field, v, "a non-empty string of at most " + std::to_string(max) + " characters");
  return v.get<std::string>();
}

std::int64_t integer_field(const nlohmann::json& j, const std::string& where, const char* field,
                           std::int64_t lo, std::int64_t hi) {
  const nlohmann::json& v = j.at(field);
  // Integers only: a float such as 1e30 is refused before any conversion.
  if (!v.is_number_integer())
    refuse(where, field, v,
           "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  if (v.is_number_unsigned() ? v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi)
                             : (v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi))
    refuse(where, field, v,
           "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v.get<std::int64_t>();
}

// The text `loom train` reads for a config value (config_yaml writes a string's text, and
// any other scalar as JSON spells it).
std::string text_of(const nlohmann::json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

}  // namespace

JobSpec JobSpec::from_json(const nlohmann::json& request, const std::string& where, Origin origin) {
  if (!request.is_object())
    throw BadRequest(400,
                     where + ": a job is a JSON object, got " + std::string(request.type_name()));
  static const std::set<std::string> known{"name",           "config",      "steps",
                                           "priority",       "deadline_h",  "pools",
                                           "allow_fallback", "max_retries", "idempotency_key"};
  for (const auto& [key, value] : request.items())
    if (!known.count(key))
      refuse(where, key, value,
             "no such field (name, config, steps, priority, deadline_h, pools, allow_fallback, "
             "max_retries, idempotency_key)");
  JobSpec spec;
  if (!request.contains("name"))
    throw BadRequest(400, where + ": field 'name' is missing");
  spec.name = text_field(request, where, "name");
  if (!request.contains("config"))
    throw BadRequest(400, where + ": field 'config' is missing (the training settings)");
  const nlohmann::json& config = request.at("config");
  if (!config.is_object())
    refuse(where, "config", config, "a mapping of training keys to values");
  if (config.size() > kMaxConfigKeys)
    throw BadRequest(400, where + ": field 'config' has " + std::to_string(config.size()) +
                              " keys, expected at most " + std::to_string(kMaxConfigKeys));
  for (const auto& [key, value] : config.items()) {
    const std::string field = "config." + key;
    if (key.empty() || key.size() > 64)
      refuse(where, field, key, "a training key");
    const contract::TrainKey* train_key = contract::find_train_key(key);
    if (train_key != nullptr && train_key->has(contract::kService))
      refuse(where, field, value, "nothing: the fleet service sets '" + key + "' itself");
    if (!(value.is_string() || value.is_number() || value.is_boolean()))
      refuse(where, field, value, "a string, number or boolean");
    if (value.is_string() && value.get_ref<const std::string&>().size() > kMaxText)
      refuse(where, field, value, "at most " + std::to_string(kMaxText) + " characters");
    if (value.is_number_float() && !std::isfinite(value.get<double>()))
      refuse(where, field, value, "a finite number");
    if (origin == Origin::stored)
      continue;
    if (train_key == nullptr)
      refuse(where, field, value, "a key of loom train ('loom train --help' lists them)");
    try {
      contract::check_value(*train_key, text_of(value), "it");
    } catch (const Error& e) {
      refuse(where, field, value, std::string("a value loom train accepts (") + e.what() + ")");
    }
  }
  spec.config = config;
  if (request.contains("steps"))
    spec.steps = integer_field(request, where, "steps", 1, 100'000'000);
  if (request.contains("priority"))
    spec.priority = integer_field(request, where, "priority", -100, 100);
  if (request.contains("deadline_h")) {
    const nlohmann::json& v = request.at("deadline_h");
    if (!v.is_number() || !(v.get<double>() > 0) || v.get<double>() > 1e6)
      refuse(where, "deadline_h", v, "hours after submission, in (0, 1e6]");
    spec.deadline_h = v.get<double>();
  }
  if (request.contains("pools")) {
    const nlohmann::json& v = request.at("pools");
    if (!v.is_array() || v.size() > 1000)
      refuse(where, "pools", v, "a list of pool names, in order of preference");
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string() || v[i].get_ref<const std::string&>().empty())
        refuse(where, "pools[" + std::to_string(i) + "]", v[i], "a pool name");
      spec.pools.push_back(v[i].get<std::string>());
    }
  }
  if (request.contains("allow_fallback")) {
    const nlohmann::json& v = request.at("allow_fallback");
    if (!v.is_boolean())
      refuse(where, "allow_fallback", v, "true or false");
    spec.allow_fallback = v.get<bool>();
  }
  if (request.contains("max_retries"))
    spec.max_retries = integer_field(request, where, "max_retries", 0, 100);
  if (request.contains("idempotency_key"))
    spec.idempotency_key = text_field(request, where, "idempotency_key");
  return spec;
}

nlohmann::json JobSpec::to_json() const {
  nlohmann::json j{{"name", name},
                   {"config", config},
                   {"priority", priority},
                   {"pools", pools},
                   {"allow_fallback", allow_fallback},
                   {"max_retries", max_retries}};
  if (steps > 0)
    j["steps"] = steps;
  if (deadline_h)
    j["deadline_h"] = *deadline_h;
  if (!idempotency_key.empty())
    j["idempotency_key"] = idempotency_key;
  return j;
}

std::int64_t JobSpec::total_steps() const {
  if (steps > 0)
    return steps;
  const contract::TrainKey& key = *contract::find_train_key("steps");
  if (config.contains("steps")) {
    try {
      return contract::parse_integer(key, text_of(config.at("steps")), "steps");
    } catch (const Error&) {
      // A stored job an older Loom accepted: loom train will refuse it; count the default.
    }
  }
  const auto text = [&](const char* name, const char* otherwise) {
    return config.contains(name) ? text_of(config.at(name)) : std::string(otherwise);
  };
  const std::string default_steps(key.default_for(
      contract::defaults_kind(text("model", "gpt"), config.contains("data"), text("data", ""))));
  return contract::parse_integer(key, default_steps, "the default steps");
}

std::string JobSpec::config_yaml() const {
  nlohmann::json settings = config;
  if (steps > 0)
    settings["steps"] = steps;
  return service::config_yaml(settings);
}

std::string config_yaml(const nlohmann::json& config) {
  std::string yaml;
  for (const auto& [key, value] : config.items())
    yaml += key + ": " + value.dump() + "\n";
  return yaml;
}

const std::string& JobSpec::model_key() const {
  if (model_key_.empty()) {
    nlohmann::json key = nlohmann::json::object();
    for (const auto& [k, v] : config.items())
      if (const contract::TrainKey* train_key = contract::find_train_key(k);
          train_key != nullptr && train_key->has(contract::kSpeed))
        key[k] = v;
    model_key_ = key.dump();  // nlohmann's objects are ordered by key: equal configs, equal keys
  }
  return model_key_;
}

}  // namespace loom::service
