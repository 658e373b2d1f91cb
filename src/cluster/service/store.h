// cluster/service/store — the fleet service's durable state, in SQLite: jobs, their
// attempts (one per process launched), events, pool drains and what probes learned.
//
// Every state change is one transaction (BEGIN IMMEDIATE ... COMMIT, WAL journal,
// synchronous=FULL), so a crash at any instant leaves the state before or after it. A
// submit returns only once its transaction is committed; submits that arrive together
// share one transaction (group commit). The schema is versioned (PRAGMA user_version) and
// migrated forward on open.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cluster/service/job_spec.h"
#include "cluster/service/sqlite.h"

namespace loom::service {

// queued -> launching -> running -> (stopping ->) succeeded | failed | cancelled, or back
// to queued (preempted, lost, or a crash with retries left); unplaceable: no pool can run
// it (the reason says why).
struct JobRecord {
  std::int64_t id = 0;
  std::shared_ptr<const JobSpec> spec;  // immutable after the submit; shared, not copied
  std::string state = "queued";
  std::int64_t attempts = 0, failures = 0, preemptions = 0;
  std::string pool, reason;
  double submitted_s = 0, updated_s = 0;
  std::optional<double> deadline_s;
  bool cancel_requested = false;
  nlohmann::json to_json() const;
};

// One process launched for a job: launching -> running -> (stopping ->) exited | lost.
struct AttemptRecord {
  std::int64_t job = 0, number = 0;
  std::string pool, state;
  std::optional<std::int64_t> pid, exit_code;
  std::optional<double> started_s, ended_s;
  std::string reason;  // why it was placed there, and why it stopped
  nlohmann::json to_json() const;
};

struct EventRecord {
  std::int64_t id = 0;
  double time_s = 0;
  std::int64_t job = 0;
  std::string kind, message;
  nlohmann::json to_json() const;
};

// What a probe learned about a model on a backend (loom ops --config ... --json).
struct Knowledge {
  std::string model_key, backend;
  std::int64_t threads = 1;
  std::string version;
  bool probed = false;                    // a probe ran (else only a measured step is known)
  std::vector<std::string> fallbacks;     // ops that fall back to the CPU
  std::optional<double> step_s;           // probed seconds per step
  std::optional<double> measured_step_s;  // median of a real run's steps on such a pool
  std::string error;                      // the probe failed (the config is bad): why
  // A transformer's shape, batch, precision and device op calls per step, as `loom ops
  // --json` reports them (its "transformer" and "launches_per_step"): what the performance
  // model needs to predict a step on a catalog chip. Empty: not a transformer.
  std::string transformer;
};

class Store {
 public:
  explicit Store(const std::string& path);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // 1: the first schema; 2: knowledge.transformer. An older store is upgraded in place,
  // in one transaction; a newer one is refused.
  static constexpr int kSchemaVersion = 2;

  struct Submitted {
    std::int64_t id;
    bool created;  // false: the idempotency key named an existing job
  };
  // Durable when it returns (group commit with concurrent submits).
  Submitted submit(const JobSpec& spec, double now);

  std::vector<JobRecord> jobs(bool unfinished_only = false);
  std::optional<JobRecord> job(std::int64_t id);
  std::vector<AttemptRecord> attempts(std::int64_t job);
  std::vector<AttemptRecord> live_attempts();  // launching, running or stopping

  // A new attempt about to be launched: the job becomes launching on `pool`.
  void begin_attempt(std::int64_t job, std::int64_t number, const std::string& pool,
                     const std::string& reason, double now);
  void attempt_running(std::int64_t job, std::int64_t number, std::int64_t pid, double now);
  void attempt_stopping(std::int64_t job, std::int64_t number, const std::string& why, double now);
  // The attempt is over: `exit_code` from its exit record, or nullopt when it was lost (its
  // processes gone without one). Decides the job's next state, once: a second call for
  // the same attempt changes nothing. Returns the job's new state.
  std::string attempt_over(std::int64_t job, std::int64_t number, std::optional<int> exit_code,
                           double now);
  void set_unplaceable(std::int64_t job, const std::string& why, double now);
  void set_waiting_reason(std::int64_t job, const std::string& why);
  // Cancel: a queued job ends at once; a running one is asked to stop. False: no such job.
  bool request_cancel(std::int64_t job, double now);

  void set_draining(const std::string& pool, bool draining, double now);
  std::vector<std::string> draining_pools();

  std::optional<Knowledge> knowledge(const std::string& model_key, const std::string& backend,
                                     std::int64_t threads, const std::string& version);
  void put_knowledge(const Knowledge& k);
  void record_measured_step(const std::string& model_key, const std::string& backend,
                            std::int64_t threads, const std::string& version, double step_s);

  std::vector<EventRecord> events_after(std::int64_t after, std::size_t limit = 500);
  void add_event(std::int64_t job, const std::string& kind, const std::string& message, double now);

 private:
  void migrate();
  void event(std::int64_t job, const std::string& kind, const std::string& message, double now);
  void committer();  // group commit of submits
  Submitted insert(const JobSpec& spec, double now);

  JobRecord job_of(const Statement& row);

  Database db_;
  std::mutex mutex_;  // one transaction at a time on the connection
  // Specs never change after a submit: each is parsed from the store once.
  std::unordered_map<std::int64_t, std::shared_ptr<const JobSpec>> specs_;

  struct PendingSubmit {
    JobSpec spec;
    double now;
    std::promise<Submitted> done;
  };
  std::mutex queue_mutex_;
  std::condition_variable queue_ready_;
  std::deque<PendingSubmit> queue_;
  bool stopping_ = false;
  std::thread committer_;
};

}  // namespace loom::service
