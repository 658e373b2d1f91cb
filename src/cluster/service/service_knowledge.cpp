// cluster/service/service_knowledge.cpp — what the Service knows of a model on a pool:
// whether a job may be submitted (pools exist; a strict job some pool runs natively),
// where it may run (coverage from the probe cache, strict or not) and how fast (measured,
// else the performance model, else the probe). The scheduler (service.cpp) reads these;
// the prober (service_probe.cpp) fills the knowledge they read.
#include "cluster/service/service.h"

#include <algorithm>
#include <mutex>
#include <string>

#include "cluster/service/model_speed.h"
#include "core/error.h"
#include "core/job_contract.h"

namespace loom::service {

void Service::check_submittable(const JobSpec& spec) {
  for (const std::string& name : spec.pools)
    if (pool_named(name) == nullptr) {
      std::string known;
      for (const PoolSpec& p : pools_)
        known += (known.empty() ? "" : ", ") + p.name;
      throw BadRequest(
          400, "job: field 'pools' names '" + name + "', which is not a pool (" + known + ")");
    }
  if (spec.allow_fallback)
    return;
  // A strict job: refused when cached coverage already proves no acceptable pool can run it.
  std::string why;
  for (const PoolSpec& pool : pools_) {
    if (!spec.pools.empty() &&
        std::find(spec.pools.begin(), spec.pools.end(), pool.name) == spec.pools.end())
      continue;
    auto k = store_->knowledge(spec.model_key(), pool.backend, pool.threads, version_);
    if (!k || !k->probed || !k->error.empty() || k->fallbacks.empty())
      return;  // runnable, or not known yet
    why += (why.empty() ? "" : "; ") + pool.name + " (" + pool.backend +
           ") falls back to the CPU for " + nlohmann::json(k->fallbacks).dump();
  }
  throw BadRequest(422,
                   "job: allow_fallback is false and no acceptable pool runs its model "
                   "natively: " +
                       why);
}

// What the service knows of a model (strict or not) on a pool; the same for every job of
// that model, so a pass computes it once per (model, strictness, pool).
Service::Route Service::route(const JobSpec& spec, const std::string& model_key,
                              const PoolSpec& pool) {
  Route r;
  const std::string id = model_key + "|" + pool.backend + "|" + std::to_string(pool.threads);
  const std::optional<Knowledge> k =
      store_->knowledge(model_key, pool.backend, pool.threads, version_);
  const bool probed = k && k->probed;
  if (!probed && options_.probes) {
    std::lock_guard lock(probe_mutex_);
    if (!probing_.count(id) && !probe_queue_.count(id)) {
      probe_queue_[id] = ProbeRequest{model_key, spec.config, pool};
      probe_wanted_.notify_one();
    }
  }
  if (probed && !k->error.empty()) {
    r.error = k->error;
    return r;
  }
  if (!spec.allow_fallback) {
    if (!probed) {
      r.pending = true;
      r.why_not = pool.name + ": coverage not known yet (probing)";
      return r;
    }
    if (!k->fallbacks.empty()) {
      std::string ops;
      for (const std::string& op : k->fallbacks)
        ops += (ops.empty() ? "" : ", ") + op;
      r.why_not = pool.name + " (" + pool.backend + ") would fall back to the CPU for " + ops;
      return r;
    }
  }
  r.allowed = true;
  r.pending = !probed;
  r.speed = step_time_of(k, pool);
  return r;
}

// Measured beats the performance model, which beats the probe: a finished run's median
// step on such a pool is what the pool does; the model speaks for the chip a pool stands
// for (a probe runs on the service's host, which is not that chip); the probe is what is
// left.
StepTime Service::step_time_of(const std::optional<Knowledge>& k, const PoolSpec& pool) const {
  if (k && k->measured_step_s)
    return {k->measured_step_s, "measured"};
  std::string why_not;
  if (auto chip = chips_.find(pool.name); chip != chips_.end()) {
    if (k && !k->transformer.empty()) {
      // {"transformer": {...}, "launches_per_step": N}, as the probe stored it
      const nlohmann::json stored = nlohmann::json::parse(k->transformer, nullptr, false);
      using namespace contract::record;
      const bool ok = stored.is_object() && stored.contains(kTransformer) &&
                      stored.value(kLaunchesPerStep, nlohmann::json()).is_number_unsigned();
      ModelSpeed m =
          model_step_time(ok ? stored[kTransformer] : nlohmann::json(),
                          ok ? stored[kLaunchesPerStep].get<std::uint64_t>() : 0, chip->second);
      if (m.step_s)
        return {m.step_s, m.basis};
      why_not = m.basis;
    } else if (k && k->probed) {
      why_not = "not a transformer: the performance model does not apply";
    }
  }
  if (k && k->step_s)
    return {k->step_s, "probe"};
  return {std::nullopt, "unknown" + (why_not.empty() ? std::string() : " (" + why_not + ")")};
}

StepTime Service::step_time(const JobSpec& spec, const PoolSpec& pool) {
  return step_time_of(store_->knowledge(spec.model_key(), pool.backend, pool.threads, version_),
                      pool);
}

}  // namespace loom::service
