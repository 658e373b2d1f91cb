// cluster/service/service_probe.cpp — the Service's prober: `loom ops --config JOB --json`
// run for each (model, backend, threads, binary) the scheduler asks about, its answer
// stored as knowledge (service.h).
#include "cluster/service/service.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cluster/service/attempts.h"
#include "cluster/service/slurm_executor.h"
#include "core/error.h"
#include "core/job_contract.h"

namespace loom::service {

namespace fs = std::filesystem;

void Service::probe_loop() {
  while (!stopping_) {
    std::string id;
    ProbeRequest request;
    {
      std::unique_lock lock(probe_mutex_);
      probe_wanted_.wait(lock, [&] { return stopping_.load() || !probe_queue_.empty(); });
      if (stopping_)
        return;
      auto it = probe_queue_.begin();
      id = it->first;
      request = it->second;
      probe_queue_.erase(it);
      probing_.insert(id);
    }
    bool answered = false;
    try {
      answered = probe(request);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "loom fleet serve: probe failed: %s\n", e.what());
    }
    {
      std::lock_guard lock(probe_mutex_);
      probing_.erase(id);
      if (!answered && ++probe_failures_[id] < 3) {
        // Asked again by the next pass; after three deaths the error is stored.
      }
    }
    wake();
  }
}

bool Service::probe(const ProbeRequest& request) {
  const PoolSpec& pool = request.pool;
  std::uint64_t serial = 0;
  {
    std::lock_guard lock(probe_mutex_);
    serial = ++probe_serial_;
  }
  // Files of this probe alone (a probe of an earlier daemon may still be writing its own).
  const std::string base =
      options_.state_dir + "/probes/" + std::to_string(::getpid()) + "-" + std::to_string(serial);
  write_atomically(base + ".yaml", config_yaml(request.config));
  const std::vector<std::string> args{
      options_.loom, "ops",        "--config",  base + ".yaml",
      "--backend",   pool.backend, "--threads", std::to_string(pool.threads),
      "--steps",     "2",          "--json"};
  std::string out, err;
  int status = run_command(args, {}, out, err);
  // A GPU pool's nodes may be elsewhere (Slurm): where this host has no such device, the
  // CUDA backend's coverage comes from its CPU emulator, which runs the same supports()
  // and kernels; its step time says nothing about a GPU and is dropped.
  bool emulated = false;
  constexpr int kNoDevice = contract::code(contract::ExitCode::device_unavailable);
  if (status == kNoDevice && pool.backend == "cuda") {
    status = run_command(args, {"LOOM_CUDA_EMULATOR=1"}, out, err);
    emulated = true;
  }
  Knowledge k;
  k.model_key = request.model_key;
  k.backend = pool.backend;
  k.threads = pool.threads;
  k.version = version_;
  k.probed = true;
  std::string error;
  {
    std::istringstream lines(err);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("loom: error: ", 0) == 0)
        error = line;
  }
  const std::string id =
      request.model_key + "|" + pool.backend + "|" + std::to_string(pool.threads);
  bool answered = true;
  if (status == 0) {
    nlohmann::json report = nlohmann::json::parse(out, nullptr, false);
    // `loom ops --json` objects of the contract's schema (an older loom wrote no version).
    using namespace contract::record;
    if (report.is_object() && report.contains(kOps) &&
        report.value(kSchemaVersion, nlohmann::json(kOpsSchemaVersion)) ==
            nlohmann::json(kOpsSchemaVersion)) {
      for (const auto& [op, cell] : report[kOps].items())
        if (cell.value(kOpPath, "") == "fallback")
          k.fallbacks.push_back(op);
      if (!emulated && report.contains(kStepSeconds) && report[kStepSeconds].is_number())
        k.step_s = report[kStepSeconds].get<double>();
      if (report.contains(kTransformer) && report.contains(kLaunchesPerStep))
        k.transformer = nlohmann::json{{kTransformer, report[kTransformer]},
                                       {kLaunchesPerStep, report[kLaunchesPerStep]}}
                            .dump();
    } else {
      answered = false;
    }
  } else if (status == kNoDevice) {
    // The backend is absent on this host (its pool's nodes are elsewhere): its coverage is
    // unproven, so strict jobs stay off the pool; others may run there, speed unknown.
    k.fallbacks.push_back("coverage unknown: backend " + pool.backend +
                          " is not available on the fleet service's host");
  } else if (status == contract::code(contract::ExitCode::error) && !error.empty()) {
    k.error = error.substr(std::char_traits<char>::length("loom: error: "));  // the config
  } else {
    answered = false;  // killed, crashed, or the backend is absent here: no verdict
  }
  if (!answered) {
    int failures = 0;
    {
      std::lock_guard lock(probe_mutex_);
      failures = probe_failures_[id] + 1;
    }
    if (failures < 3) {
      std::error_code ec;
      fs::remove(base + ".yaml", ec);
      return false;
    }
    k.error = "loom ops --config ... --backend " + pool.backend + " died " +
              std::to_string(failures) + " times without a report (status " +
              std::to_string(status) + ")";
  }
  store_->put_knowledge(k);
  std::error_code ec;
  fs::remove(base + ".yaml", ec);
  return true;
}

}  // namespace loom::service
