#include "cluster/service/store.h"

#include "core/error.h"
#include "core/job_contract.h"

namespace loom::service {

namespace {

constexpr std::int64_t kMaxAttempts = 1000;  // a job lost this often is failed, not retried

const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS jobs(
  id INTEGER PRIMARY KEY,
  idempotency_key TEXT UNIQUE,
  name TEXT NOT NULL,
  spec TEXT NOT NULL,
  state TEXT NOT NULL,
  priority INTEGER NOT NULL,
  submitted_s REAL NOT NULL,
  updated_s REAL NOT NULL,
  deadline_s REAL,
  attempts INTEGER NOT NULL DEFAULT 0,
  failures INTEGER NOT NULL DEFAULT 0,
  preemptions INTEGER NOT NULL DEFAULT 0,
  pool TEXT NOT NULL DEFAULT '',
  reason TEXT NOT NULL DEFAULT '',
  cancel_requested INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state);
CREATE TABLE IF NOT EXISTS attempts(
  job INTEGER NOT NULL REFERENCES jobs(id),
  number INTEGER NOT NULL,
  pool TEXT NOT NULL,
  state TEXT NOT NULL,
  pid INTEGER,
  started_s REAL,
  ended_s REAL,
  exit_code INTEGER,
  reason TEXT NOT NULL DEFAULT '',
  PRIMARY KEY(job, number));
CREATE TABLE IF NOT EXISTS events(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  time_s REAL NOT NULL,
  job INTEGER NOT NULL,
  kind TEXT NOT NULL,
  message TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pools(
  name TEXT PRIMARY KEY,
  draining INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS knowledge(
  model_key TEXT NOT NULL,
  backend TEXT NOT NULL,
  threads INTEGER NOT NULL,
  version TEXT NOT NULL,
  fallbacks TEXT,
  step_s REAL,
  measured_step_s REAL,
  error TEXT NOT NULL DEFAULT '',
  transformer TEXT NOT NULL DEFAULT '',
  PRIMARY KEY(model_key, backend, threads, version));
)sql";

// Upgrades from each earlier schema version to the next.
const char* kUpgradeFrom1 = "ALTER TABLE knowledge ADD COLUMN transformer TEXT NOT NULL DEFAULT ''";

const char* kJobColumns =
    "id, spec, state, attempts, failures, preemptions, pool, reason, submitted_s, updated_s, "
    "deadline_s, cancel_requested";

}  // namespace

JobRecord Store::job_of(const Statement& s) {
  JobRecord j;
  j.id = s.integer(0);
  auto cached = specs_.find(j.id);
  if (cached == specs_.end())
    cached =
        specs_
            .emplace(j.id,
                     std::make_shared<const JobSpec>(JobSpec::from_json(
                         nlohmann::json::parse(s.text(1)), "stored job", JobSpec::Origin::stored)))
            .first;
  j.spec = cached->second;
  j.state = s.text(2);
  j.attempts = s.integer(3);
  j.failures = s.integer(4);
  j.preemptions = s.integer(5);
  j.pool = s.text(6);
  j.reason = s.text(7);
  j.submitted_s = s.real(8);
  j.updated_s = s.real(9);
  j.deadline_s = s.optional_real(10);
  j.cancel_requested = s.integer(11) != 0;
  return j;
}

namespace {

const char* kAttemptColumns =
    "job, number, pool, state, pid, started_s, ended_s, exit_code, reason";

AttemptRecord attempt_of(const Statement& s) {
  AttemptRecord a;
  a.job = s.integer(0);
  a.number = s.integer(1);
  a.pool = s.text(2);
  a.state = s.text(3);
  a.pid = s.optional_integer(4);
  a.started_s = s.optional_real(5);
  a.ended_s = s.optional_real(6);
  a.exit_code = s.optional_integer(7);
  a.reason = s.text(8);
  return a;
}

}  // namespace

nlohmann::json JobRecord::to_json() const {
  nlohmann::json j{{"id", id},
                   {"name", spec->name},
                   {"state", state},
                   {"pool", pool},
                   {"reason", reason},
                   {"priority", spec->priority},
                   {"attempts", attempts},
                   {"failures", failures},
                   {"preemptions", preemptions},
                   {"submitted_s", submitted_s},
                   {"updated_s", updated_s},
                   {"allow_fallback", spec->allow_fallback},
                   {"pools", spec->pools},
                   {"steps", spec->total_steps()},
                   {"spec", spec->to_json()}};
  if (deadline_s)
    j["deadline_s"] = *deadline_s;
  if (cancel_requested)
    j["cancel_requested"] = true;
  return j;
}

nlohmann::json AttemptRecord::to_json() const {
  nlohmann::json j{
      {"job", job}, {"number", number}, {"pool", pool}, {"state", state}, {"reason", reason}};
  if (pid)
    j["pid"] = *pid;
  if (started_s)
    j["started_s"] = *started_s;
  if (ended_s)
    j["ended_s"] = *ended_s;
  if (exit_code)
    j["exit_code"] = *exit_code;
  return j;
}

nlohmann::json EventRecord::to_json() const {
  return {{"id", id}, {"time_s", time_s}, {"job", job}, {"kind", kind}, {"message", message}};
}

Store::Store(const std::string& path) : db_(path) {
  migrate();
  committer_ = std::thread([this] { committer(); });
}

Store::~Store() {
  {
    std::lock_guard lock(queue_mutex_);
    stopping_ = true;
  }
  queue_ready_.notify_all();
  committer_.join();
}

void Store::migrate() {
  std::lock_guard lock(mutex_);
  const int version = db_.user_version();
  check(version <= kSchemaVersion, db_.path() + ": schema version " + std::to_string(version) +
                                       " is newer than this Loom's (" +
                                       std::to_string(kSchemaVersion) + "); upgrade Loom");
  if (version == kSchemaVersion)
    return;
  Transaction t(db_);
  if (version == 0)
    db_.execute(kSchema);  // a new store
  if (version == 1)
    db_.execute(kUpgradeFrom1);
  db_.execute("PRAGMA user_version = " + std::to_string(kSchemaVersion));
  t.commit();
}

void Store::event(std::int64_t job, const std::string& kind, const std::string& message,
                  double now) {
  Statement(db_, "INSERT INTO events(time_s, job, kind, message) VALUES(?1, ?2, ?3, ?4)")
      .bind(1, now)
      .bind(2, job)
      .bind(3, kind)
      .bind(4, message)
      .run();
}

void Store::add_event(std::int64_t job, const std::string& kind, const std::string& message,
                      double now) {
  std::lock_guard lock(mutex_);
  Transaction t(db_);
  event(job, kind, message, now);
  t.commit();
}

Store::Submitted Store::insert(const JobSpec& spec, double now) {
  if (!spec.idempotency_key.empty()) {
    Statement existing(db_, "SELECT id FROM jobs WHERE idempotency_key = ?1");
    existing.bind(1, spec.idempotency_key);
    if (existing.step())
      return {existing.integer(0), false};
  }
  std::optional<double> deadline;
  if (spec.deadline_h)
    deadline = now + *spec.deadline_h * 3600;
  Statement(db_,
            "INSERT INTO jobs(idempotency_key, name, spec, state, priority, submitted_s, "
            "updated_s, deadline_s, reason) VALUES(?1, ?2, ?3, 'queued', ?4, ?5, ?5, ?6, "
            "'waiting to be placed')")
      .bind(1, spec.idempotency_key.empty() ? std::optional<std::string>()
                                            : std::optional<std::string>(spec.idempotency_key))
      .bind(2, spec.name)
      .bind(3, spec.to_json().dump())
      .bind(4, spec.priority)
      .bind(5, now)
      .bind(6, deadline)
      .run();
  const std::int64_t id = db_.last_insert_id();
  event(id, "submitted", spec.name, now);
  return {id, true};
}

void Store::committer() {
  for (;;) {
    std::deque<PendingSubmit> batch;
    {
      std::unique_lock lock(queue_mutex_);
      queue_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty() && stopping_)
        return;
      batch.swap(queue_);
    }
    std::vector<Submitted> results;
    try {
      std::lock_guard lock(mutex_);
      Transaction t(db_);
      for (PendingSubmit& p : batch)
        results.push_back(insert(p.spec, p.now));
      t.commit();
    } catch (...) {
      for (PendingSubmit& p : batch)
        p.done.set_exception(std::current_exception());
      continue;
    }
    for (std::size_t i = 0; i < batch.size(); ++i)
      batch[i].done.set_value(results[i]);
  }
}

Store::Submitted Store::submit(const JobSpec& spec, double now) {
  std::future<Submitted> done;
  {
    std::lock_guard lock(queue_mutex_);
    queue_.push_back(PendingSubmit{spec, now, {}});
    done = queue_.back().done.get_future();
  }
  queue_ready_.notify_one();
  return done.get();
}

std::vector<JobRecord> Store::jobs(bool unfinished_only) {
  std::lock_guard lock(mutex_);
  Statement s(
      db_, std::string("SELECT ") + kJobColumns + " FROM jobs" +
               (unfinished_only ? " WHERE state NOT IN ('succeeded', 'failed', 'cancelled')" : "") +
               " ORDER BY id");
  std::vector<JobRecord> out;
  while (s.step())
    out.push_back(job_of(s));
  return out;
}

std::optional<JobRecord> Store::job(std::int64_t id) {
  std::lock_guard lock(mutex_);
  Statement s(db_, std::string("SELECT ") + kJobColumns + " FROM jobs WHERE id = ?1");
  s.bind(1, id);
  if (!s.step())
    return std::nullopt;
  return job_of(s);
}

std::vector<AttemptRecord> Store::attempts(std::int64_t job) {
  std::lock_guard lock(mutex_);
  Statement s(db_, std::string("SELECT ") + kAttemptColumns +
                       " FROM attempts WHERE job = ?1 ORDER BY number");
  s.bind(1, job);
  std::vector<AttemptRecord> out;
  while (s.step())
    out.push_back(attempt_of(s));
  return out;
}

std::vector<AttemptRecord> Store::live_attempts() {
  std::lock_guard lock(mutex_);
  Statement s(db_, std::string("SELECT ") + kAttemptColumns +
                       " FROM attempts WHERE state IN ('launching', 'running', 'stopping') "
                       "ORDER BY job, number");
  std::vector<AttemptRecord> out;
  while (s.step())
    out.push_back(attempt_of(s));
  return out;
}

void Store::begin_attempt(std::int64_t job, std::int64_t number, const std::string& pool,
                          const std::string& reason, double now) {
  std::lock_guard lock(mutex_);
  Transaction t(db_);
  Statement(db_,
            "INSERT INTO attempts(job, number, pool, state, reason) VALUES(?1, ?2, ?3, "
            "'launching', ?4)")
      .bind(1, job)
      .bind(2, number)
      .bind(3, pool)
      .bind(4, reason)
      .run();
  Statement(db_,
            "UPDATE jobs SET state = 'launching', attempts = ?2, pool = ?3, reason = ?4, "
            "updated_s = ?5 WHERE id = ?1")
      .bind(1, job)
      .bind(2, number)
      .bind(3, pool)
      .bind(4, reason)
      .bind(5, now)
      .run();
  event(job, "placed", "attempt " + std::to_string(number) + " on " + reason, now);
  t.commit();
}

void Store::attempt_running(std::int64_t job, std::int64_t number, std::int64_t pid, double now) {
  std::lock_guard lock(mutex_);
  Transaction t(db_);
  Statement(db_,
            "UPDATE attempts SET state = 'running', pid = ?3, started_s = COALESCE(started_s, ?4) "
            "WHERE job = ?1 AND number = ?2 AND state = 'launching'")
      .bind(1, job)
      .bind(2, number)
      .bind(3, pid)
      .bind(4, now)
      .run();
  if (db_.changes() > 0) {
    Statement(db_,
              "UPDATE jobs SET state = 'running', updated_s = ?2 WHERE id = ?1 AND state = "
              "'launching'")
        .bind(1, job)
        .bind(2, now)
        .run();
    event(job, "started", "attempt " + std::to_string(number) + ", pid " + std::to_string(pid),
          now);
  }
  t.commit();
}

void Store::attempt_stopping(std::int64_t job, std::int64_t number, const std::string& why,
                             double now) {
  std::lock_guard lock(mutex_);
  Transaction t(db_);
  Statement(db_,
            "UPDATE attempts SET state = 'stopping', reason = reason || '; stopping: ' || ?3 "
            "WHERE job = ?1 AND number = ?2 AND state IN ('launching', 'running')")
      .bind(1, job)
      .bind(2, number)
      .bind(3, why)
      .run();
  if (db_.changes() > 0) {
    Statement(db_, "UPDATE jobs SET state = 'stopping', reason = ?2, updated_s = ?3 WHERE id = ?1")
        .bind(1, job)
        .bind(2, "stopping: " + why)
        .bind(3, now)
        .run();
    event(job, "stopping", why, now);
  }
  t.commit();
}

std::string Store::attempt_over(std::int64_t job, std::int64_t number, std::optional<int> exit_code,
                                double now) {
  std::lock_guard lock(mutex_);
  Transaction t(db_);
  Statement current(db_, "SELECT state, reason FROM attempts WHERE job = ?1 AND number = ?2");
  current.bind(1, job).bind(2, number);
  check(current.step(),
        db_.path() + ": job " + std::to_string(job) + " has no attempt " + std::to_string(number));
  const std::string attempt_state = current.text(0);
  const std::string placement = current.text(1);  // why it was placed where it ran
  current.reset();
  Statement read(db_, std::string("SELECT ") + kJobColumns + " FROM jobs WHERE id = ?1");
  read.bind(1, job);
  check(read.step(), db_.path() + ": no job " + std::to_string(job));
  JobRecord j = job_of(read);
  read.reset();
  if (attempt_state == "exited" || attempt_state == "lost")
    return j.state;  // recorded already: a completion counts once
  Statement(db_,
            "UPDATE attempts SET state = ?3, exit_code = ?4, ended_s = ?5 WHERE job = ?1 AND "
            "number = ?2")
      .bind(1, job)
      .bind(2, number)
      .bind(3, exit_code ? "exited" : "lost")
      .bind(4, exit_code ? std::optional<std::int64_t>(*exit_code) : std::nullopt)
      .bind(5, now)
      .run();
  std::string state, reason, kind;
  std::int64_t failures = j.failures, preemptions = j.preemptions;
  const std::string attempt = "attempt " + std::to_string(number);
  if (exit_code && *exit_code == 0) {
    state = "succeeded", kind = "succeeded", reason = attempt + " finished; placed on " + placement;
  } else if (j.cancel_requested) {
    state = "cancelled", kind = "cancelled", reason = "cancelled";
  } else if (exit_code && *exit_code == contract::code(contract::ExitCode::preempted)) {
    ++preemptions;
    state = "queued", kind = "requeued",
    reason = attempt + " checkpointed and stopped (preempted); resumes from its checkpoint";
  } else if (!exit_code) {
    state = j.attempts >= kMaxAttempts ? "failed" : "queued", kind = "lost";
    reason = attempt +
             " was lost (its processes ended without an exit record); resumes from "
             "its last checkpoint";
  } else {
    ++failures;
    const bool retry = failures <= j.spec->max_retries;
    state = retry ? "queued" : "failed", kind = retry ? "crashed" : "failed";
    const bool no_device = *exit_code == contract::code(contract::ExitCode::device_unavailable);
    reason =
        attempt +
        (no_device ? " could not open its pool's device on the host it ran on (exit status " +
                         std::to_string(*exit_code) + ")"
                   : " crashed with exit status " + std::to_string(*exit_code)) +
        (retry
             ? "; retry " + std::to_string(failures) + " of " + std::to_string(j.spec->max_retries)
             : "; no retries left (max_retries = " + std::to_string(j.spec->max_retries) + ")");
  }
  Statement(db_,
            "UPDATE jobs SET state = ?2, reason = ?3, failures = ?4, preemptions = ?5, "
            "updated_s = ?6 WHERE id = ?1")
      .bind(1, job)
      .bind(2, state)
      .bind(3, reason)
      .bind(4, failures)
      .bind(5, preemptions)
      .bind(6, now)
      .run();
  event(job, kind, reason, now);
  t.commit();
  return state;
}

void Store::set_unplaceable(std::int64_t job, const std::string& why, double now) {
  std::lock_guard lock(mutex_);
  Transaction t(db_);
  Statement(db_,
            "UPDATE jobs SET state = 'unplaceable', reason = ?2, updated_s = ?3 WHERE id = ?1 "
            "AND state = 'queued'")
      .bind(1, job)
      .bind(2, why)
      .bind(3, now)
      .run();
  if (db_.changes() > 0)
    event(job, "unplaceable", why, now);
  t.commit();
}

void Store::set_waiting_reason(std::int64_t job, const std::string& why) {
  std::lock_guard lock(mutex_);
  Statement(db_, "UPDATE jobs SET reason = ?2 WHERE id = ?1 AND state = 'queued' AND reason != ?2")
      .bind(1, job)
      .bind(2, why)
      .run();
}

bool Store::request_cancel(std::int64_t job, double now) {
  std::lock_guard lock(mutex_);
  Transaction t(db_);
  Statement read(db_, "SELECT state FROM jobs WHERE id = ?1");
  read.bind(1, job);
  if (!read.step())
    return false;
  const std::string state = read.text(0);
  read.reset();
  if (state == "succeeded" || state == "failed" || state == "cancelled")
    return true;  // nothing left to cancel
  const bool idle = state == "queued" || state == "unplaceable";
  Statement(db_,
            "UPDATE jobs SET cancel_requested = 1, state = CASE WHEN ?2 THEN 'cancelled' ELSE "
            "state END, reason = CASE WHEN ?2 THEN 'cancelled before it ran again' ELSE "
            "'cancel requested' END, updated_s = ?3 WHERE id = ?1")
      .bind(1, job)
      .bind(2, idle ? 1 : 0)
      .bind(3, now)
      .run();
  event(job, idle ? "cancelled" : "cancel", idle ? "cancelled" : "cancel requested", now);
  t.commit();
  return true;
}

void Store::set_draining(const std::string& pool, bool draining, double now) {
  std::lock_guard lock(mutex_);
  Transaction t(db_);
  Statement(db_,
            "INSERT INTO pools(name, draining) VALUES(?1, ?2) ON CONFLICT(name) DO UPDATE SET "
            "draining = ?2")
      .bind(1, pool)
      .bind(2, draining ? 1 : 0)
      .run();
  event(0, draining ? "drain" : "undrain", pool, now);
  t.commit();
}

std::vector<std::string> Store::draining_pools() {
  std::lock_guard lock(mutex_);
  Statement s(db_, "SELECT name FROM pools WHERE draining = 1 ORDER BY name");
  std::vector<std::string> out;
  while (s.step())
    out.push_back(s.text(0));
  return out;
}

std::optional<Knowledge> Store::knowledge(const std::string& model_key, const std::string& backend,
                                          std::int64_t threads, const std::string& version) {
  std::lock_guard lock(mutex_);
  Statement s(db_,
              "SELECT fallbacks, step_s, measured_step_s, error, transformer FROM knowledge WHERE "
              "model_key = "
              "?1 AND backend = ?2 AND threads = ?3 AND version = ?4");
  s.bind(1, model_key).bind(2, backend).bind(3, threads).bind(4, version);
  if (!s.step())
    return std::nullopt;
  Knowledge k;
  k.model_key = model_key;
  k.backend = backend;
  k.threads = threads;
  k.version = version;
  k.probed = !s.is_null(0) || !s.text(3).empty();
  if (!s.is_null(0))
    k.fallbacks = nlohmann::json::parse(s.text(0)).get<std::vector<std::string>>();
  k.step_s = s.optional_real(1);
  k.measured_step_s = s.optional_real(2);
  k.error = s.text(3);
  k.transformer = s.text(4);
  return k;
}

void Store::put_knowledge(const Knowledge& k) {
  std::lock_guard lock(mutex_);
  Transaction t(db_);
  Statement(db_,
            "INSERT INTO knowledge(model_key, backend, threads, version, fallbacks, step_s, "
            "error, transformer) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT DO UPDATE "
            "SET fallbacks = ?5, step_s = ?6, error = ?7, transformer = ?8")
      .bind(1, k.model_key)
      .bind(2, k.backend)
      .bind(3, k.threads)
      .bind(4, k.version)
      .bind(5, nlohmann::json(k.fallbacks).dump())
      .bind(6, k.step_s)
      .bind(7, k.error)
      .bind(8, k.transformer)
      .run();
  t.commit();
}

void Store::record_measured_step(const std::string& model_key, const std::string& backend,
                                 std::int64_t threads, const std::string& version, double step_s) {
  std::lock_guard lock(mutex_);
  Transaction t(db_);
  Statement(db_,
            "INSERT INTO knowledge(model_key, backend, threads, version, measured_step_s) "
            "VALUES(?1, ?2, ?3, ?4, ?5) ON CONFLICT DO UPDATE SET measured_step_s = ?5")
      .bind(1, model_key)
      .bind(2, backend)
      .bind(3, threads)
      .bind(4, version)
      .bind(5, step_s)
      .run();
  t.commit();
}

std::vector<EventRecord> Store::events_after(std::int64_t after, std::size_t limit) {
  std::lock_guard lock(mutex_);
  Statement s(
      db_, "SELECT id, time_s, job, kind, message FROM events WHERE id > ?1 ORDER BY id LIMIT ?2");
  s.bind(1, after).bind(2, static_cast<std::int64_t>(limit));
  std::vector<EventRecord> out;
  while (s.step())
    out.push_back({s.integer(0), s.real(1), s.integer(2), s.text(3), s.text(4)});
  return out;
}

}  // namespace loom::service
