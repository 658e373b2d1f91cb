#include "cluster/service/service.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "cluster/service/attempts.h"
#include "cluster/service/slurm_executor.h"
#include "core/error.h"
#include "core/job_contract.h"

namespace loom::service {

namespace fs = std::filesystem;
using cluster::PoolOption;
using cluster::PoolTerms;
using cluster::WaitingJob;

namespace {

// What identifies the loom binary's behaviour for the probe cache: its size and time.
std::string binary_version(const std::string& path) {
  struct stat info {};
  check(::stat(path.c_str(), &info) == 0, path + ": the loom binary cannot be read");
  return std::to_string(info.st_size) + "-" + std::to_string(info.st_mtim.tv_sec);
}

std::string self_executable() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  check(!ec, "fleet serve: cannot find its own executable (/proc/self/exe)");
  return self.string();
}

// The last line of a file that starts with `prefix` (an attempt's error, a probe's).
std::string last_line_with(const std::string& path, const std::string& prefix) {
  std::ifstream in(path);
  std::string line, found;
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0)
      found = line;
  return found;
}

// Steps logged in a run's metrics.jsonl and the median step time of the last `tail`.
struct RunProgress {
  std::int64_t steps = 0;
  std::optional<double> median_step_s;
};
RunProgress run_progress(const std::string& metrics, std::size_t tail = 50) {
  RunProgress p;
  std::ifstream in(metrics);
  std::vector<double> ms;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
    using namespace contract::record;
    if (!r.is_object() || !r.contains(kLoss) || !r.contains(kStep))
      continue;
    p.steps = std::max<std::int64_t>(p.steps, r[kStep].get<std::int64_t>());
    if (r.contains(kStepMs) && r[kStepMs].is_number())
      ms.push_back(r[kStepMs].get<double>());
  }
  if (ms.size() > tail)
    ms.erase(ms.begin(), ms.end() - static_cast<std::ptrdiff_t>(tail));
  if (ms.size() >= 3) {
    std::sort(ms.begin(), ms.end());
    p.median_step_s = ms[ms.size() / 2] / 1e3;
  }
  return p;
}

}  // namespace

Service::Service(ServiceOptions options) : options_(std::move(options)) {
  check(!options_.state_dir.empty(), "fleet serve: --state FOLDER is required");
  std::error_code ec;
  fs::create_directories(options_.state_dir + "/jobs", ec);
  fs::create_directories(options_.state_dir + "/probes", ec);
  check(!ec, options_.state_dir + ": cannot create the state folder: " + ec.message());
  pools_ = load_pools(options_.pools_file);
  if (std::any_of(pools_.begin(), pools_.end(),
                  [](const PoolSpec& p) { return !p.chip.empty(); })) {
    const cluster::Catalog catalog = cluster::Catalog::load(
        options_.catalog_dir.empty() ? cluster::default_catalog_dir() : options_.catalog_dir);
    for (const PoolSpec& pool : pools_) {
      if (pool.chip.empty())
        continue;
      try {
        chips_[pool.name] = catalog.chip(pool.chip);
      } catch (const std::exception& e) {
        throw Error(options_.pools_file + ": pool '" + pool.name + "': field 'chip': " + e.what());
      }
    }
  }
  if (options_.loom.empty())
    options_.loom = self_executable();
  version_ = binary_version(options_.loom);
  if (!options_.executor)
    options_.executor = std::make_shared<Executors>(options_.loom);
  if (!options_.clock)
    options_.clock = wall_seconds;
  policy_ = cluster::parse_policy(options_.policy);
  check(policy_ != cluster::Policy::las,
        "fleet serve: policy las is the simulator's (it preempts every quantum); use loom, "
        "cheapest, fastest, backfill, sjf or fifo");
  store_ = std::make_unique<Store>(options_.state_dir + "/fleet.db");
}

Service::~Service() {
  stop();
}

void Service::start() {
  scheduler_ = std::thread([this] {
    while (!stopping_) {
      try {
        pass();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "loom fleet serve: pass failed: %s\n", e.what());
      }
      std::unique_lock lock(wake_mutex_);
      woken_.wait_for(lock, std::chrono::duration<double>(options_.pass_seconds),
                      [&] { return wake_requested_ || stopping_.load(); });
      wake_requested_ = false;
    }
  });
  if (options_.probes)
    prober_ = std::thread([this] { probe_loop(); });
}

void Service::stop() {
  if (stopping_.exchange(true))
    return;
  woken_.notify_all();
  probe_wanted_.notify_all();
  if (scheduler_.joinable())
    scheduler_.join();
  if (prober_.joinable())
    prober_.join();
}

void Service::wake() {
  {
    std::lock_guard lock(wake_mutex_);
    wake_requested_ = true;
  }
  woken_.notify_all();
}

std::string Service::job_dir(std::int64_t job) const {
  return options_.state_dir + "/jobs/" + std::to_string(job);
}

const PoolSpec* Service::pool_named(const std::string& name) const {
  for (const PoolSpec& p : pools_)
    if (p.name == name)
      return &p;
  return nullptr;
}

void Service::crash_point(const std::string& name) {
  if (options_.crash_at.empty())
    return;
  const auto colon = options_.crash_at.find(':', options_.crash_at.find(':') + 1);
  const std::string point = options_.crash_at.substr(0, colon);
  const int nth = colon == std::string::npos ? 1 : std::atoi(options_.crash_at.c_str() + colon + 1);
  if (point == name && ++crash_counts_[name] == nth) {
    std::fprintf(stderr, "loom fleet serve: crash point %s reached: SIGKILL\n", name.c_str());
    std::fflush(stderr);
    ::kill(::getpid(), SIGKILL);
  }
}

void Service::pass() {
  const double now = options_.clock();
  reconcile(now);
  schedule(now);
}

void Service::reconcile(double now) {
  for (const AttemptRecord& a : store_->live_attempts()) {
    const AttemptFiles files{job_dir(a.job), a.number};
    const PoolSpec* pool = pool_named(a.pool);
    const AttemptStatus status =
        pool ? options_.executor->probe(*pool, files, a.pid) : probe_attempt(files);
    if (status.state != AttemptStatus::State::alive) {
      finished(a, status.exit_code, now);
      continue;
    }
    const std::optional<std::int64_t> pid = a.pid ? a.pid : status.pid;
    if (a.state == "launching" && pid)  // adopted after a crash between fork and commit
      store_->attempt_running(a.job, a.number, *pid, now);
    std::optional<JobRecord> job = store_->job(a.job);
    if (job && job->cancel_requested && a.state != "stopping" && pid) {
      if (pool)
        options_.executor->stop(*pool, *pid);
      else
        signal_attempt(*pid, SIGTERM);
      store_->attempt_stopping(a.job, a.number, "cancelled", now);
    }
  }
}

void Service::finished(const AttemptRecord& a, std::optional<int> exit_code, double now) {
  crash_point("finish:before_record");
  const std::string state = store_->attempt_over(a.job, a.number, exit_code, now);
  crash_point("finish:after_record");
  const std::string dir = job_dir(a.job);
  if (exit_code && *exit_code != contract::code(contract::ExitCode::ok) &&
      *exit_code != contract::code(contract::ExitCode::preempted)) {
    const std::string error = last_line_with(AttemptFiles{dir, a.number}.log(), "loom: ");
    if (!error.empty())
      store_->add_event(a.job, "error", error, now);
  }
  // A run's measured speed replaces the probe's for later predictions.
  if (std::optional<JobRecord> job = store_->job(a.job); job) {
    const PoolSpec* pool = pool_named(a.pool);
    const RunProgress progress = run_progress(dir + "/out/metrics.jsonl");
    if (pool && progress.median_step_s)
      store_->record_measured_step(job->spec->model_key(), pool->backend, pool->threads, version_,
                                   *progress.median_step_s);
  }
  (void)state;
}

// The waiting jobs as the policy core sees them, with the pools' terms and free slots.
struct Service::Queue {
  std::vector<PoolTerms> terms;
  std::vector<std::int64_t> free;
  std::vector<JobRecord> jobs;              // unfinished, from the store
  std::vector<WaitingJob> waiting;          // the queued ones that have a pool to go to
  std::vector<const JobRecord*> record_of;  // waiting[i]'s job
  // What is known of each model on each pool (strict, and allowed to fall back), one store
  // read per model and pool per pass; routes_of[i]: waiting[i]'s (the reasons of a launch
  // name each pool's speed source from it, so nothing is spelled out for jobs that wait).
  std::map<std::string, std::array<std::vector<Route>, 2>, std::less<>> routes;
  std::vector<const std::vector<Route>*> routes_of;
  std::vector<AttemptRecord> live;
  std::vector<cluster::RunningJob> running;  // not stopping
  std::set<int> stopping_on;                 // pools with an attempt being stopped
};

Service::Queue Service::waiting_jobs(double now, bool record_reasons) {
  Queue q;
  std::map<std::string, int> index;
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    q.free.push_back(pools_[i].slots);
    q.terms.push_back({pools_[i].name, pools_[i].price_per_hour});
    index[pools_[i].name] = static_cast<int>(i);
  }
  q.live = store_->live_attempts();
  q.jobs = store_->jobs(true);
  std::unordered_map<std::int64_t, const JobRecord*> by_id;
  for (const JobRecord& j : q.jobs)
    by_id[j.id] = &j;
  for (const AttemptRecord& a : q.live) {
    auto it = index.find(a.pool);
    if (it == index.end())
      continue;  // a pool removed from pools.yaml: its attempts still run to the end
    --q.free[static_cast<std::size_t>(it->second)];
    if (a.state == "stopping")
      q.stopping_on.insert(it->second);
    auto job = by_id.find(a.job);
    if (a.state != "stopping" && job != by_id.end())
      q.running.push_back({static_cast<std::size_t>(a.job), it->second, 1,
                           job->second->spec->priority, a.started_s.value_or(now)});
  }
  std::vector<bool> draining(pools_.size(), false);
  for (const std::string& d : store_->draining_pools())
    if (auto it = index.find(d); it != index.end())
      draining[static_cast<std::size_t>(it->second)] = true;
  std::vector<int> every_pool(pools_.size());
  for (std::size_t p = 0; p < pools_.size(); ++p)
    every_pool[p] = static_cast<int>(p);
  // Per pass, what is known of each model on each pool (strict, and allowed to fall back):
  // one store read each, whatever the number of jobs of that model.
  auto& routes = q.routes;
  std::lock_guard pool_order_lock(pool_order_mutex_);
  std::unordered_set<std::int64_t> queued;
  for (const JobRecord& j : q.jobs) {
    if (j.state != "queued" || j.cancel_requested)
      continue;
    queued.insert(j.id);
    WaitingJob w;
    w.job = static_cast<std::size_t>(j.id);
    w.priority = j.spec->priority;
    w.deadline_s = j.deadline_s.value_or(cluster::kNoDeadline);
    const std::int64_t done =
        j.attempts > 0 ? run_progress(job_dir(j.id) + "/out/metrics.jsonl").steps : 0;
    std::string excluded, error;
    bool pending = false;
    double best = INFINITY;
    std::vector<int> named;
    for (const std::string& name : j.spec->pools)
      if (auto it = index.find(name); it != index.end())
        named.push_back(it->second);
    // A job that names no pools considers them in its seeded order (policy.h), as the
    // simulator does with seed 0.
    const std::vector<int>* acceptable_order = &named;
    if (j.spec->pools.empty()) {
      auto [order, added] = pool_order_.try_emplace(j.id);
      if (added)
        order->second = cluster::tie_break_order(every_pool, {}, 0, j.id);
      acceptable_order = &order->second;
    }
    const std::vector<int>& acceptable = *acceptable_order;
    const std::string& model_key = j.spec->model_key();
    auto cached = routes.find(model_key);
    if (cached == routes.end())
      cached = routes.emplace(model_key, std::array<std::vector<Route>, 2>{}).first;
    std::vector<Route>& known = cached->second[j.spec->allow_fallback ? 1 : 0];
    if (known.empty())
      for (const PoolSpec& p : pools_)
        known.push_back(route(*j.spec, model_key, p));
    const double left =
        static_cast<double>(std::max<std::int64_t>(j.spec->total_steps() - done, 1));
    w.options.reserve(acceptable.size());
    for (int pool : acceptable) {
      const Route& r = known[static_cast<std::size_t>(pool)];
      if (!r.error.empty()) {
        error = r.error;
        break;
      }
      pending = pending || r.pending;
      if (!r.allowed) {
        excluded += (excluded.empty() ? "" : "; ") + r.why_not;
        continue;
      }
      if (draining[static_cast<std::size_t>(pool)])
        continue;
      const double seconds = r.speed.seconds ? *r.speed.seconds * left : cluster::kUnknown;
      w.options.push_back({pool, seconds});
      if (!std::isnan(seconds))
        best = std::min(best, seconds);
    }
    if (!error.empty()) {
      if (record_reasons)
        store_->set_unplaceable(j.id, "the job's config is refused: " + error, now);
      continue;
    }
    if (pending && now - j.submitted_s < options_.probe_wait_seconds) {
      if (record_reasons)
        store_->set_waiting_reason(j.id, "waiting for the probes of its pools (coverage, speed)");
      continue;
    }
    if (w.options.empty()) {
      if (record_reasons && !pending && !excluded.empty())
        store_->set_unplaceable(j.id, "no acceptable pool can run it: " + excluded, now);
      else if (record_reasons)
        store_->set_waiting_reason(
            j.id, excluded.empty() ? "every acceptable pool is draining" : excluded);
      continue;
    }
    w.key = cluster::order_key(policy_, j.spec->priority, static_cast<double>(j.id),
                               std::isfinite(best) ? best : 1e12);
    q.waiting.push_back(std::move(w));
    q.record_of.push_back(&j);
    q.routes_of.push_back(&known);
  }
  std::erase_if(pool_order_, [&](const auto& entry) { return !queued.contains(entry.first); });
  return q;
}

namespace {
// Free slots per pool, as the policy core sees them.
class Slots : public cluster::Room {
 public:
  explicit Slots(std::vector<std::int64_t> free) : free_(std::move(free)) {}
  bool fits(int pool, std::int64_t chips) const override {
    return free_[static_cast<std::size_t>(pool)] >= chips;
  }
  std::int64_t free_chips(int pool) const override { return free_[static_cast<std::size_t>(pool)]; }
  void take(int pool) { --free_[static_cast<std::size_t>(pool)]; }

 private:
  std::vector<std::int64_t> free_;
};
}  // namespace

std::optional<cluster::Choice> Service::next_decision() {
  const double now = options_.clock();
  Queue q = waiting_jobs(now, false);
  Slots room(q.free);
  std::vector<const WaitingJob*> candidates;
  for (const WaitingJob& w : q.waiting)
    candidates.push_back(&w);
  std::optional<cluster::Choice> choice =
      cluster::choose_start(policy_, candidates, q.terms, room, now, true);
  if (choice)  // the candidate as a job id
    choice->candidate = candidates[choice->candidate]->job;
  return choice;
}

void Service::schedule(double now) {
  Queue q = waiting_jobs(now, true);
  Slots room(q.free);
  std::vector<const WaitingJob*> candidates;
  for (const WaitingJob& w : q.waiting)
    candidates.push_back(&w);
  while (!candidates.empty()) {
    std::optional<cluster::Choice> choice =
        cluster::choose_start(policy_, candidates, q.terms, room, now, true);
    if (!choice)
      break;
    const WaitingJob* w = candidates[choice->candidate];
    const auto index = static_cast<std::size_t>(w - q.waiting.data());
    const JobRecord& job = *q.record_of[index];
    std::string speeds;
    for (const cluster::PoolOption& option : w->options)
      speeds += (speeds.empty() ? "" : ", ") + pools_[static_cast<std::size_t>(option.pool)].name +
                " " + (*q.routes_of[index])[static_cast<std::size_t>(option.pool)].speed.basis;
    launch(job, pools_[static_cast<std::size_t>(choice->pool)],
           choice->reason + "; speed: " + speeds, now);
    room.take(choice->pool);
    candidates.erase(candidates.begin() + static_cast<std::ptrdiff_t>(choice->candidate));
  }
  // The first job still waiting (by the policy's order) may preempt lower priorities.
  const WaitingJob* first = nullptr;
  for (const WaitingJob* w : candidates)
    if (first == nullptr || w->key < first->key || (w->key == first->key && w->job < first->job))
      first = w;
  if (first == nullptr)
    return;
  std::optional<cluster::PreemptionChoice> preempt =
      cluster::choose_preemption(policy_, *first, q.running, q.terms, room, now);
  if (!preempt || q.stopping_on.count(preempt->pool))
    return;  // nothing to take, or a preemption on that pool is under way already
  for (std::size_t r : preempt->victims) {
    const std::int64_t victim = static_cast<std::int64_t>(q.running[r].job);
    for (const AttemptRecord& a : q.live)
      if (a.job == victim && a.state == "running" && a.pid) {
        options_.executor->stop(pools_[static_cast<std::size_t>(preempt->pool)], *a.pid);
        store_->attempt_stopping(
            a.job, a.number,
            "preempted for job " + std::to_string(first->job) + " (" + preempt->reason + ")", now);
      }
  }
}

void Service::launch(const JobRecord& job, const PoolSpec& pool, const std::string& reason,
                     double now) {
  const std::int64_t number = job.attempts + 1;
  crash_point("launch:before_commit");
  store_->begin_attempt(job.id, number, pool.name, reason, now);
  crash_point("launch:after_commit");
  const std::string dir = job_dir(job.id);
  std::int64_t pid = 0;
  try {
    std::error_code ec;
    fs::create_directories(dir, ec);
    check(!ec, dir + ": cannot create the job folder: " + ec.message());
    if (!fs::exists(dir + "/config.yaml"))
      write_atomically(dir + "/config.yaml", job.spec->config_yaml());
    std::vector<std::string> command{options_.loom,   "train",      dir + "/config.yaml",
                                     "--out",         dir + "/out", "--device",
                                     pool.backend,    "--threads",  std::to_string(pool.threads),
                                     "--auto_resume", "--progress", "false",
                                     "--json"};
    pid = options_.executor->launch(pool, AttemptFiles{dir, number}, command);
  } catch (const std::exception& e) {
    store_->add_event(job.id, "error", std::string("launch failed: ") + e.what(), now);
    store_->attempt_over(job.id, number, 127, now);
    return;
  }
  crash_point("launch:after_fork");
  store_->attempt_running(job.id, number, pid, now);
}

}  // namespace loom::service
