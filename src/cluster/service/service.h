// cluster/service/service — the fleet service's scheduler: a state machine over the store
// (store.h) that, each pass, reconciles every live attempt with its processes (attempts.h),
// asks the policy core (cluster/sched/policy.h) which waiting jobs start where and which
// running ones a higher priority preempts, and launches them.
//
// It never links the engine: what a job's model needs and how fast it trains are learnt
// by running `loom ops --config ... --json` (coverage and a probe step time, cached per
// model, backend, threads and Loom version) and from each finished run's metrics.jsonl.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cluster/catalog/catalog.h"
#include "cluster/sched/policy.h"
#include "cluster/service/executor.h"
#include "cluster/service/pools.h"
#include "cluster/service/store.h"

namespace loom::service {

struct ServiceOptions {
  std::string state_dir;   // the store, the jobs' folders
  std::string pools_file;  // pools.yaml
  std::string loom;        // the loom binary jobs and probes run (default: this one)
  std::string policy = "loom";
  double pass_seconds = 0.25;  // a pass at least this often (and whenever woken)
  // A job waits up to this long after its submission for the probes of its acceptable
  // pools (coverage, speed), so that its first placement compares them all.
  double probe_wait_seconds = 60;
  // Test hook: "NAME" or "NAME:N" makes the service die (SIGKILL itself) at the Nth time it
  // reaches crash point NAME (launch:before_commit, launch:after_commit,
  // launch:after_fork, finish:before_record, finish:after_record).
  std::string crash_at;
  // What runs attempts (default: the local executor) and what time it is (default: the
  // wall clock): tests replace both to drive the scheduler in simulated time.
  std::shared_ptr<Executor> executor;
  std::function<double()> clock;
  bool probes = true;  // false: never run `loom ops` (tests that seed the knowledge)
  // The chip catalog that pools' `chip` names (default: the repository's catalog/).
  std::string catalog_dir;
};

// How fast a job's model trains on a pool, and what says so.
struct StepTime {
  std::optional<double> seconds;  // per step; nullopt: unknown
  // "measured" (a finished run's median step on such a pool), "performance model of
  // CHIP" (a transformer on a pool that stands for a catalog chip), "probe" (`loom ops`
  // on the service's host), or "unknown" with why.
  std::string basis;
};

class Service {
 public:
  explicit Service(ServiceOptions options);
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  // Runs passes until stop() (the scheduler thread and the probe thread).
  void start();
  void stop();
  void wake();  // a state change: run a pass soon
  // One pass: reconcile attempts, decide, launch (the scheduler thread's body; tests call
  // it directly).
  void pass();
  // The placement the next pass would make first, without making it (benchmarks: the
  // cost of one decision over the whole queue).
  std::optional<cluster::Choice> next_decision();

  Store& store() { return *store_; }
  const std::vector<PoolSpec>& pools() const { return pools_; }
  const ServiceOptions& options() const { return options_; }
  // The loom binary's identity in the probe cache (its size and modification time).
  const std::string& version() const { return version_; }
  std::string job_dir(std::int64_t job) const;
  // Submit-time checks beyond the spec's own: pools exist; a strict job that cached
  // coverage proves no acceptable pool can run is refused (422).
  void check_submittable(const JobSpec& spec);
  // The steps logged so far by a job's runs (metrics.jsonl): {step, loss} pairs.
  std::vector<std::pair<std::int64_t, double>> loss_curve(std::int64_t job) const;
  nlohmann::json pools_json();
  // The speed the next placement of a job of this model would assume on `pool`.
  StepTime step_time(const JobSpec& spec, const PoolSpec& pool);

 private:
  struct Route {           // what the service knows of a job on a pool
    bool allowed = false;  // coverage allows it
    bool pending = false;  // coverage or speed not known yet (a probe is wanted)
    StepTime speed;        // measured, else the performance model's, else probed
    std::string why_not;   // !allowed: why
    std::string error;     // the job's config is bad (the probe said why)
  };
  struct Queue;  // the waiting jobs as the policy core sees them, built once per pass
  Queue waiting_jobs(double now, bool record_reasons);
  struct ProbeRequest {
    std::string model_key;
    nlohmann::json config;
    PoolSpec pool;
  };
  Route route(const JobSpec& spec, const std::string& model_key, const PoolSpec& pool);
  StepTime step_time_of(const std::optional<Knowledge>& k, const PoolSpec& pool) const;
  void reconcile(double now);
  void schedule(double now);
  void launch(const JobRecord& job, const PoolSpec& pool, const std::string& reason, double now);
  void finished(const AttemptRecord& attempt, std::optional<int> exit_code, double now);
  void crash_point(const std::string& name);
  void probe_loop();
  // Runs one probe; false when it died without an answer (it is asked again later).
  bool probe(const ProbeRequest& request);
  const PoolSpec* pool_named(const std::string& name) const;

  ServiceOptions options_;
  std::vector<PoolSpec> pools_;
  std::map<std::string, cluster::Chip> chips_;  // of the pools that name a catalog chip
  std::unique_ptr<Store> store_;
  cluster::Policy policy_;
  std::string version_;  // of the loom binary: the probe cache's key
  std::map<std::string, int> crash_counts_;
  // Each queued job that names no pools: its seeded order of the pools (tie_break_order),
  // kept across passes (a pass over 10,000 jobs on 100 pools spent 40 ms re-sorting them);
  // a job's entry goes when it is no longer queued.
  std::mutex pool_order_mutex_;
  std::unordered_map<std::int64_t, std::vector<int>> pool_order_;

  std::mutex wake_mutex_;
  std::condition_variable woken_;
  bool wake_requested_ = false;
  std::atomic<bool> stopping_{false};
  std::thread scheduler_, prober_;

  // Probes wanted by the last pass, one per (model key, backend, threads): what the store
  // caches; pools that share a backend and thread count share the answer.
  std::mutex probe_mutex_;
  std::condition_variable probe_wanted_;
  std::map<std::string, ProbeRequest> probe_queue_;
  std::set<std::string> probing_;
  std::map<std::string, int> probe_failures_;  // probes that died without an answer
  std::uint64_t probe_serial_ = 0;
};

}  // namespace loom::service
