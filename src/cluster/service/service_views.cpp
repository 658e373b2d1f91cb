// cluster/service/service_views.cpp — what the Service shows of itself: a job's loss curve
// and the pools' state, as the HTTP API and the status page serve them (service.h).
#include "cluster/service/service.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "cluster/service/attempts.h"
#include "core/error.h"
#include "core/job_contract.h"

namespace loom::service {

namespace fs = std::filesystem;

std::vector<std::pair<std::int64_t, double>> Service::loss_curve(std::int64_t job) const {
  std::vector<std::pair<std::int64_t, double>> curve;
  std::ifstream in(job_dir(job) + "/out/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
    using namespace contract::record;
    if (r.is_object() && r.contains(kLoss) && r.contains(kStep) && r[kLoss].is_number())
      curve.emplace_back(r[kStep].get<std::int64_t>(), r[kLoss].get<double>());
  }
  // At most ~400 points for a page: every k-th, and the last.
  if (curve.size() > 400) {
    const std::size_t k = curve.size() / 400 + 1;
    std::vector<std::pair<std::int64_t, double>> thin;
    for (std::size_t i = 0; i < curve.size(); i += k)
      thin.push_back(curve[i]);
    if (thin.back() != curve.back())
      thin.push_back(curve.back());
    curve = std::move(thin);
  }
  return curve;
}

nlohmann::json Service::pools_json() {
  std::map<std::string, std::int64_t> used;
  for (const AttemptRecord& a : store_->live_attempts())
    ++used[a.pool];
  std::set<std::string> draining;
  for (const std::string& d : store_->draining_pools())
    draining.insert(d);
  nlohmann::json out = nlohmann::json::array();
  for (const PoolSpec& p : pools_)
    out.push_back(
        {{"name", p.name},
         {"executor", p.executor},
         {"backend", p.backend},
         {"slots", p.slots},
         {"threads", p.threads},
         {"used", used[p.name]},
         {"utilization", static_cast<double>(used[p.name]) / static_cast<double>(p.slots)},
         {"price_per_hour", p.price_per_hour},
         {"chip", p.chip},
         {"draining", draining.count(p.name) > 0}});
  return out;
}

}  // namespace loom::service
