// cluster/service/job_spec — a job as submitted to the fleet service, validated field by
// field: what to train (a training config, as `loom train CONFIG` reads it), how long,
// how urgent, where it may run and whether it may run with CPU fallbacks.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace loom::service {

// A request the service refuses: an HTTP 4xx answer naming the field, the value and what
// was expected. Nothing is stored.
struct BadRequest : std::runtime_error {
  BadRequest(int status, const std::string& message)
      : std::runtime_error(message), status(status) {}
  int status;
};

struct JobSpec {
  std::string name;
  // Training config keys (scalars), as in a `loom train` YAML file. The service owns
  // out, device, threads and the resume keys: a config that sets them is refused.
  nlohmann::json config = nlohmann::json::object();
  std::int64_t steps = 0;            // > 0: overrides the config's steps
  std::int64_t priority = 0;         // -100..100: higher starts first and may preempt lower
  std::optional<double> deadline_h;  // hours after submission by which it should finish
  std::vector<std::string> pools;    // acceptable pools, in order of preference (empty: all)
  bool allow_fallback = true;        // false: never on a backend that falls back to the CPU
  std::int64_t max_retries = 2;      // crashes retried (a preemption is not a crash)
  std::string idempotency_key;       // a retried submit with the same key makes no second job

  // Where a request comes from: a client's submit is checked against the job contract
  // (every config key one of `loom train`'s, each value one it accepts); a job the store
  // kept was checked when it was submitted, perhaps by an older Loom, and is read as it is.
  enum class Origin { submitted, stored };
  // Validates a JSON request; throws BadRequest naming `where` and the field.
  static JobSpec from_json(const nlohmann::json& request, const std::string& where,
                           Origin origin = Origin::submitted);
  nlohmann::json to_json() const;
  // The steps the job trains: `steps`, else the config's, else loom train's default for
  // its model (core/job_contract.def: 3,200 for the MLP, 1,600 for the CNN, ...).
  std::int64_t total_steps() const;
  // The config as YAML text (what the job's `loom train` reads).
  std::string config_yaml() const;
  // The keys that decide the model's operators and speed (coverage and probe cache key).
  const std::string& model_key() const;

 private:
  mutable std::string model_key_;  // computed once: a pass asks for it of every queued job
};

// A training config (JSON scalars by key) as the YAML `loom train CONFIG` reads: JSON
// scalars are valid YAML flow scalars, and the keys are the contract's plain words.
std::string config_yaml(const nlohmann::json& config);

}  // namespace loom::service
