// The fleet service's two costs that grow with load (docs/fleet.md):
//  1. durable submits per second through the HTTP API, each answered only after its
//     transaction is committed (WAL, synchronous=FULL; concurrent submits share one);
//  2. the time to decide a placement with 10,000 jobs queued on 100 pools: the service
//     reads the queue from its store and builds every candidate, then the policy core
//     picks (Service::next_decision), and the policy core's pick alone.
// Prints one JSON object. Usage: fleet_service_bench [--submits N] [--clients K]
//   [--queued N] [--pools P]
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "cluster/service/http_api.h"
#include "cluster/service/service.h"

using namespace loom;
using namespace loom::service;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string make_state(const std::string& name, int pools) {
  const std::string dir = (fs::temp_directory_path() / ("loom-fleet-bench-" + name)).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream out(dir + "/pools.yaml");
  out << "pools:\n";
  for (int p = 0; p < pools; ++p)  // distinct thread counts: distinct speeds per pool
    out << "  - {name: pool" << p << ", backend: cpu, slots: 2, threads: " << (p + 1)
        << ", price_per_hour: " << 0.5 + 0.01 * p << "}\n";
  return dir;
}

const char* kJob = R"({"name": "bench", "steps": 1000, "config": {"layers": 2, "width": 64}})";

}  // namespace

int main(int argc, char** argv) {
  int submits = 4000, clients = 8, queued = 10000, pools = 100;
  for (int i = 1; i + 1 < argc; i += 2) {
    const int value = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--submits"))
      submits = value;
    else if (!std::strcmp(argv[i], "--clients"))
      clients = value;
    else if (!std::strcmp(argv[i], "--queued"))
      queued = value;
    else if (!std::strcmp(argv[i], "--pools"))
      pools = value;
  }
  nlohmann::ordered_json result;

  // --- 1. durable submits through the API ------------------------------------------
  {
    const std::string dir = make_state("submits", 3);
    ServiceOptions options;
    options.state_dir = dir + "/state";
    options.pools_file = dir + "/pools.yaml";
    options.probes = false;
    Service service(options);  // no scheduler thread: the queue only grows
    HttpApi api(service, {"127.0.0.1", 0, ""});
    api.bind();
    std::thread server([&] { api.serve(); });
    auto run = [&](int n, int k) {
      std::vector<std::thread> threads;
      std::atomic<int> failed{0};
      const auto t0 = Clock::now();
      for (int c = 0; c < k; ++c)
        threads.emplace_back([&, c] {
          httplib::Client client("127.0.0.1", api.port());
          for (int i = c; i < n; i += k) {
            auto r = client.Post("/api/jobs", kJob, "application/json");
            if (!r || r->status != 201)
              ++failed;
          }
        });
      for (auto& t : threads)
        t.join();
      if (failed > 0)
        std::fprintf(stderr, "fleet_service_bench: %d submits failed\n", failed.load());
      return n / seconds_since(t0);
    };
    run(200, clients);  // warm up: connections, the store's pages
    result["submits_per_s_one_client"] = run(std::min(submits, 1000), 1);
    result["submits_per_s"] = run(submits, clients);
    result["clients"] = clients;
    api.stop();
    server.join();
    fs::remove_all(dir);
  }

  // --- 2. one decision with `queued` jobs on `pools` pools ----------------------------
  {
    const std::string dir = make_state("decide", pools);
    ServiceOptions options;
    options.state_dir = dir + "/state";
    options.pools_file = dir + "/pools.yaml";
    options.probes = false;
    Service service(options);
    JobSpec spec = JobSpec::from_json(nlohmann::json::parse(kJob), "job");
    std::vector<std::thread> fill;
    for (int t = 0; t < 8; ++t)  // concurrent submits share transactions
      fill.emplace_back([&, t] {
        for (int i = t; i < queued; i += 8)
          service.store().submit(spec, 0);
      });
    for (auto& t : fill)
      t.join();
    for (int p = 0; p < pools; ++p) {
      Knowledge k;
      k.model_key = spec.model_key();
      k.backend = "cpu";
      k.threads = p + 1;
      k.version = service.version();
      k.probed = true;
      k.step_s = 0.01 * (1 + (p * 37) % pools) / pools + 0.001;
      service.store().put_knowledge(k);
    }
    std::vector<double> whole, core;
    std::string reason;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = Clock::now();
      auto choice = service.next_decision();
      whole.push_back(seconds_since(t0));
      if (choice)
        reason = choice->reason;
    }
    // The policy core alone, on the same candidates.
    std::vector<cluster::WaitingJob> waiting(static_cast<std::size_t>(queued));
    std::vector<cluster::PoolTerms> terms;
    for (int p = 0; p < pools; ++p)
      terms.push_back({"pool" + std::to_string(p), 0.5 + 0.01 * p});
    for (std::size_t j = 0; j < waiting.size(); ++j) {
      waiting[j].job = j;
      waiting[j].key = static_cast<double>(j);
      for (int p = 0; p < pools; ++p)
        waiting[j].options.push_back({p, 1000 * (0.01 * (1 + (p * 37) % pools) / pools + 0.001)});
    }
    std::vector<const cluster::WaitingJob*> candidates;
    for (const auto& w : waiting)
      candidates.push_back(&w);
    struct AllFull : cluster::Room {  // the worst case: nothing fits, every job is looked at
      bool fits(int, std::int64_t) const override { return false; }
      std::int64_t free_chips(int) const override { return 0; }
    } full;
    struct AllFree : cluster::Room {
      bool fits(int, std::int64_t) const override { return true; }
      std::int64_t free_chips(int) const override { return 2; }
    } free;
    std::vector<double> core_full;
    for (int r = 0; r < 5; ++r) {
      auto t0 = Clock::now();
      cluster::choose_start(cluster::Policy::loom, candidates, terms, free, 0, true);
      core.push_back(seconds_since(t0));
      t0 = Clock::now();
      cluster::choose_start(cluster::Policy::loom, candidates, terms, full, 0, false);
      core_full.push_back(seconds_since(t0));
    }
    result["queued_jobs"] = queued;
    result["pools"] = pools;
    result["decision_ms"] = median(whole) * 1e3;
    result["policy_core_ms"] = median(core) * 1e3;
    result["policy_core_nothing_fits_ms"] = median(core_full) * 1e3;
    result["example_reason"] = reason;
    if (!std::getenv("LOOM_BENCH_KEEP"))
      fs::remove_all(dir);
  }
  std::printf("%s\n", result.dump().c_str());
  return 0;
}
