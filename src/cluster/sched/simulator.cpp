#include "cluster/sched/simulator.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <queue>
#include <random>
#include <set>

#include "cluster/sched/pool_state.h"
#include "core/error.h"

namespace loom::cluster {
namespace {

double percentile(std::vector<double> values, double q) {
  if (values.empty())
    return 0;
  std::size_t k = static_cast<std::size_t>(std::ceil(q * static_cast<double>(values.size()))) - 1;
  k = std::min(k, values.size() - 1);
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k), values.end());
  return values[k];
}

}  // namespace

namespace {

// The simulation's state and its event handlers; simulate() runs it once.
class Simulation {
 public:
  Simulation(const Fleet& fleet, const std::vector<Job>& jobs, Policy policy,
             const Failures& failures, const Preemption& preemption, std::uint64_t tie_seed)
      : fleet_(fleet),
        jobs_(jobs),
        policy_(policy),
        failures_(failures),
        preemption_(preemption),
        rng_(failures.seed) {
    for (const Pool& p : fleet.pools)
      pools_.emplace_back(p);
    const std::size_t n = jobs.size();
    runnable_.resize(n);
    best_seconds_.assign(n, 0);
    left_.assign(n, 1.0);
    held_.resize(n);
    run_.resize(n);
    generation_.assign(n, 0);
    // Per job, the pools that can run it (its chip type measured, enough chips in all).
    for (std::size_t j = 0; j < n; ++j) {
      for (std::size_t p = 0; p < fleet.pools.size(); ++p) {
        auto it = jobs[j].seconds_on.find(fleet.pools[p].chip);
        if (it == jobs[j].seconds_on.end() ||
            !pools_[p].capacity_for(jobs[j].milli > 0 ? 1 : jobs[j].chips, fleet.pools[p].nodes))
          continue;
        check(it->second > 0 && std::isfinite(it->second), "job " + std::to_string(jobs[j].id) +
                                                               ": run time on " + it->first +
                                                               " is not positive");
        runnable_[j].push_back(static_cast<int>(p));
        best_seconds_[j] =
            best_seconds_[j] == 0 ? it->second : std::min(best_seconds_[j], it->second);
      }
    }
    // Each job as the policy core sees it: its chips and the pools that can run it (in
    // the fleet's order) with its run time on each; the key is set when it is queued.
    std::vector<int> type_of_pool;  // pools grouped by chip type, for the tie-break
    for (std::size_t p = 0; p < fleet.pools.size(); ++p) {
      int type = static_cast<int>(p);
      for (std::size_t q = 0; q < p; ++q)
        if (fleet.pools[q].chip == fleet.pools[p].chip) {
          type = type_of_pool[q];
          break;
        }
      type_of_pool.push_back(type);
    }
    candidates_.resize(n);
    for (std::size_t j = 0; j < n; ++j) {
      candidates_[j].job = j;
      candidates_[j].chips = jobs[j].chips;
      candidates_[j].milli = jobs[j].milli;
      for (int p : tie_break_order(runnable_[j], type_of_pool, tie_seed, jobs[j].id))
        candidates_[j].options.push_back({p, seconds_on(j, p)});
    }
    for (std::size_t p = 0; p < fleet.pools.size(); ++p)
      terms_.push_back({fleet.label(p), 0});
    // Waiting jobs in classes of equal shape (chips asked for, pools that can run them),
    // each ordered by the policy's key: arrival rank, or remaining run time for sjf. Jobs
    // of one class fit wherever any of them does, so a scheduling pass looks at the head
    // of each class only: its cost grows with the number of shapes, not the queue.
    std::map<std::pair<std::int64_t, std::vector<int>>, std::size_t> class_of_shape;
    class_.assign(n, 0);
    for (std::size_t j = 0; j < n; ++j)
      if (!runnable_[j].empty())  // the shape: chips, or a share as minus its thousandths
        class_[j] = class_of_shape
                        .emplace(std::pair{jobs[j].milli > 0 ? -jobs[j].milli : jobs[j].chips,
                                           runnable_[j]},
                                 class_of_shape.size())
                        .first->second;
    waiting_.resize(class_of_shape.size());
    busy_.assign(fleet.pools.size(), 0);
    started_on_.assign(fleet.pools.size(), 0);
    report_.placements.assign(n, Placement{});
    rank_.assign(n, 0);
    attained_.assign(n, 0);
    stopped_.assign(n, false);
    arrivals_left_ = n;
  }

  SimReport run() {
    SimReport& r = report_;
    r.policy = policy_;
    r.jobs = static_cast<std::int64_t>(jobs_.size());
    std::vector<std::size_t> order(jobs_.size());
    for (std::size_t j = 0; j < order.size(); ++j)
      order[j] = j;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return jobs_[a].arrival_s < jobs_[b].arrival_s;
    });
    if (policy_ == Policy::las && !order.empty())
      push(jobs_[order[0]].arrival_s + preemption_.quantum_min * 60, Kind::round, 0, 0);
    if (failures_.node_mtbf_h > 0)
      for (std::size_t p = 0; p < pools_.size(); ++p)
        schedule_failure(static_cast<int>(p), order.empty() ? 0 : jobs_[order[0]].arrival_s);
    std::size_t next = 0;
    while (next < order.size() || running_ > 0 || queued_ > 0) {
      const double arrival = next < order.size() ? jobs_[order[next]].arrival_s : INFINITY;
      check(!events_.empty() || arrival < INFINITY,
            "scheduler: jobs wait with no event left to free chips");
      const double now = std::min(arrival, events_.empty() ? INFINITY : events_.top().time);
      while (!events_.empty() && events_.top().time <= now) {
        Event e = events_.top();
        events_.pop();
        handle(e);
      }
      while (next < order.size() && jobs_[order[next]].arrival_s <= now) {
        arrive(order[next], next);
        ++next;
      }
      if (rebalance_due_) {
        rebalance(now);
        rebalance_due_ = false;
      }
      schedule(now);
    }
    finish_report();
    return r;
  }

 private:
  enum class Kind { completion, failure, repair, round };
  struct Event {
    double time;
    std::uint64_t sequence;  // ties keep their order of scheduling: deterministic runs
    Kind kind;
    std::size_t index;    // completion: the job; failure and repair: the pool
    std::int64_t detail;  // completion: the job's run generation; repair: the node
    bool operator>(const Event& o) const {
      return time != o.time ? time > o.time : sequence > o.sequence;
    }
  };
  struct Run {  // the job's current (or last) run
    int pool = -1;
    double start = 0, overhead = 0;  // overhead: the restart before work resumes
  };

  // The chips job j holds on pool p (for chip-seconds): whole nodes' worth for a job
  // larger than a node, its share for a job sharing a chip.
  double footprint(std::size_t j, int p) const {
    if (jobs_[j].milli > 0)
      return static_cast<double>(jobs_[j].milli) / PoolState::kWhole;
    return static_cast<double>(pools_[static_cast<std::size_t>(p)].footprint(jobs_[j].chips));
  }
  double seconds_on(std::size_t j, int p) const {
    return jobs_[j].seconds_on.at(fleet_.pools[static_cast<std::size_t>(p)].chip);
  }
  void push(double time, Kind kind, std::size_t index, std::int64_t detail) {
    events_.push(Event{time, sequence_++, kind, index, detail});
  }
  void schedule_failure(int p, double after) {
    const double rate = static_cast<double>(fleet_.pools[static_cast<std::size_t>(p)].nodes) /
                        (failures_.node_mtbf_h * 3600);
    push(after + std::exponential_distribution<double>(rate)(rng_), Kind::failure,
         static_cast<std::size_t>(p), 0);
  }

  void arrive(std::size_t j, std::size_t rank) {
    ++report_.events;
    --arrivals_left_;
    if (runnable_[j].empty()) {
      report_.rejected.push_back(
          "job " + std::to_string(jobs_[j].id) + " (" + jobs_[j].name + ", " +
          std::to_string(jobs_[j].chips) +
          " chips): no pool of the fleet has a chip type it can run on (measured, or allowed "
          "by its constraints) and that many chips");
      return;
    }
    rank_[j] = static_cast<double>(rank);
    enqueue(j);
  }
  // A waiting job's place in the policy's order (smaller first).
  double key(std::size_t j) const {
    switch (policy_) {
      case Policy::sjf:
        return best_seconds_[j] * left_[j];
      case Policy::las:
        return static_cast<double>(las_queue(attained_[j])) * 1e12 + rank_[j];
      default:
        return rank_[j];
    }
  }
  // las's priority queues, as Tiresias discretises attained service: queue k holds jobs
  // with 10^(k-1) to 10^k chip-hours of service (queue 0: under one); first come, first
  // served inside a queue, so jobs of similar service do not preempt each other.
  static int las_queue(double chip_seconds) {
    int queue = 0;
    for (double limit = 3600; chip_seconds >= limit && queue < 40; limit *= 10)
      ++queue;
    return queue;
  }
  void enqueue(std::size_t j) {
    candidates_[j].key = key(j);
    waiting_[class_[j]].insert({candidates_[j].key, j});
    ++queued_;
  }

  void start(std::size_t j, int p, double now) {
    PoolState& pool = pools_[static_cast<std::size_t>(p)];
    held_[j] = pool.hold(jobs_[j].chips, jobs_[j].milli, j);
    Placement& pl = report_.placements[j];
    const double overhead = stopped_[j] ? failures_.restart_min * 60 : 0;
    if (pl.pool < 0)  // the first start
      pl.start_s = now;
    pl.pool = p;
    run_[j] = {p, now, overhead};
    push(now + overhead + left_[j] * seconds_on(j, p), Kind::completion, j, ++generation_[j]);
    ++started_on_[static_cast<std::size_t>(p)];
    ++running_;
    running_jobs_.insert(j);
  }
  // Gives back the chips of job j's run, which ends at `now`; returns the chip-seconds held.
  double stop(std::size_t j, double now) {
    const Run& run = run_[j];
    PoolState& pool = pools_[static_cast<std::size_t>(run.pool)];
    pool.release(held_[j], j);
    held_[j] = {};
    --running_;
    running_jobs_.erase(j);
    const double held = (now - run.start) * footprint(j, run.pool);
    busy_[static_cast<std::size_t>(run.pool)] += held;
    attained_[j] += held;
    return held;
  }
  void complete(std::size_t j, double now) {
    const double held = stop(j, now);
    const double overhead = run_[j].overhead * footprint(j, run_[j].pool);
    kept_ += held - overhead;
    report_.lost_chip_hours += overhead / 3600;
    left_[j] = 0;
    report_.placements[j].end_s = now;
    ++report_.finished;
  }
  // Stops job j's run at `now`, keeping `kept_seconds` of its work (at this pool's speed);
  // the rest of the run, restart included, is lost. Its completion event goes stale.
  void stop_keeping(std::size_t j, double now, double kept_seconds) {
    const Run run = run_[j];
    const double footprint = this->footprint(j, run.pool);
    stop(j, now);
    left_[j] = std::max(0.0, left_[j] - kept_seconds / seconds_on(j, run.pool));
    kept_ += kept_seconds * footprint;
    report_.lost_chip_hours += (now - run.start - kept_seconds) * footprint / 3600;
    ++generation_[j];
    stopped_[j] = true;
  }
  double worked(std::size_t j, double now) const {
    return std::max(0.0, now - run_[j].start - run_[j].overhead);
  }

  // A failure stops job j: the work since its last checkpoint is lost, and it waits again.
  void interrupt(std::size_t j, double now) {
    const double interval = failures_.checkpoint_min * 60;
    stop_keeping(j, now, interval > 0 ? std::floor(worked(j, now) / interval) * interval : 0);
    ++report_.interruptions;
    if (++report_.placements[j].interruptions > kMaxInterruptions) {
      // No progress to speak of: without this the simulation could run forever.
      report_.abandoned.push_back(
          "job " + std::to_string(jobs_[j].id) + " (" + jobs_[j].name + ", " +
          std::to_string(jobs_[j].chips) + " chips): interrupted " +
          std::to_string(kMaxInterruptions) +
          " times before finishing; checkpoint more often, or use fewer chips");
      return;
    }
    enqueue(j);
  }
  static constexpr int kMaxInterruptions = 10000;

  // The preemptive policy stops job j: it checkpoints first, so only the restart it spent
  // is lost, and it waits again with the service it has had.
  void preempt(std::size_t j, double now) {
    stop_keeping(j, now, worked(j, now));
    ++report_.preemptions;
    enqueue(j);
  }

  // las: who should hold chips now, by service queue (las_queue) and arrival; running jobs
  // beyond their pool's chips in that order are preempted. A run is kept for its restart
  // and one quantum of work at least, so every run makes progress. Fragmentation is
  // ignored here: a job chosen to start that finds no node waits for the next pass.
  void rebalance(double now) {
    std::vector<std::int64_t> budget;
    for (const PoolState& pool : pools_)
      budget.push_back(pool.up_chips());
    struct Candidate {
      bool protected_run;
      int queue;
      double rank;
      std::size_t job;
      bool running;
    };
    std::vector<Candidate> active;
    const double quantum = preemption_.quantum_min * 60;
    for (std::size_t j : running_jobs_) {
      const Run& run = run_[j];
      const double footprint =
          static_cast<double>(pools_[static_cast<std::size_t>(run.pool)].footprint(jobs_[j].chips));
      active.push_back({now - run.start < run.overhead + quantum,
                        las_queue(attained_[j] + (now - run.start) * footprint), rank_[j], j,
                        true});
    }
    for (const auto& cls : waiting_)
      for (const auto& [service, j] : cls)
        active.push_back({false, las_queue(attained_[j]), rank_[j], j, false});
    std::sort(active.begin(), active.end(), [](const Candidate& a, const Candidate& b) {
      if (a.protected_run != b.protected_run)
        return a.protected_run;
      return a.queue != b.queue ? a.queue < b.queue : a.rank < b.rank;
    });
    std::vector<std::size_t> victims;
    for (const Candidate& c : active) {
      if (c.running) {
        const auto p = static_cast<std::size_t>(run_[c.job].pool);
        const std::int64_t need = pools_[p].footprint(jobs_[c.job].chips);
        if (budget[p] >= need)
          budget[p] -= need;
        else
          victims.push_back(c.job);
        continue;
      }
      for (int p : runnable_[c.job]) {
        const std::int64_t need = pools_[static_cast<std::size_t>(p)].footprint(jobs_[c.job].chips);
        if (budget[static_cast<std::size_t>(p)] >= need) {
          budget[static_cast<std::size_t>(p)] -= need;
          break;
        }
      }
    }
    for (std::size_t j : victims)
      preempt(j, now);
  }

  void handle(const Event& e) {
    ++report_.events;
    switch (e.kind) {
      case Kind::completion:
        if (e.detail == generation_[e.index])
          complete(e.index, e.time);
        return;
      case Kind::failure: {
        PoolState& pool = pools_[e.index];
        const std::int64_t node =
            std::uniform_int_distribution<std::int64_t>(0, pool.nodes() - 1)(rng_);
        if (!pool.is_down(node)) {  // a failure of a node under repair changes nothing
          ++report_.node_failures;
          const std::vector<std::size_t> victims = pool.jobs_on(node);
          for (std::size_t j : victims)
            interrupt(j, e.time);
          pool.set_down(node);
          push(e.time + failures_.repair_h * 3600, Kind::repair, e.index, node);
        }
        if (running_ > 0 || queued_ > 0 || arrivals_left_ > 0)
          schedule_failure(static_cast<int>(e.index), e.time);
        return;
      }
      case Kind::repair:
        pools_[e.index].set_up(e.detail);
        return;
      case Kind::round:  // las reconsiders who runs, once the events of this instant are in
        rebalance_due_ = true;
        if (running_ > 0 || queued_ > 0 || arrivals_left_ > 0)
          push(e.time + preemption_.quantum_min * 60, Kind::round, 0, 0);
        return;
    }
  }

  // The policy core (policy.h) sees the pools' room through this view.
  class PoolRoom : public Room {
   public:
    explicit PoolRoom(const std::vector<PoolState>& pools) : pools_(pools) {}
    bool fits(int pool, std::int64_t chips) const override {
      return pools_[static_cast<std::size_t>(pool)].fits(chips);
    }
    bool fits_share(int pool, std::int64_t milli) const override {
      return pools_[static_cast<std::size_t>(pool)].fits_share(milli);
    }
    std::int64_t free_chips(int pool) const override {
      return pools_[static_cast<std::size_t>(pool)].up_chips();
    }

   private:
    const std::vector<PoolState>& pools_;
  };

  // Repeatedly: the policy core picks, among the heads of the waiting classes, the job to
  // start and its pool (fifo: the first job overall, or nothing until it fits).
  void schedule(double now) {
    const PoolRoom room(pools_);
    std::vector<const WaitingJob*> heads;
    while (queued_ > 0) {
      bool any_room = false;
      for (const PoolState& s : pools_)
        any_room = any_room || s.any_free();
      if (!any_room)
        return;
      heads.clear();
      for (const auto& cls : waiting_)
        if (!cls.empty())
          heads.push_back(&candidates_[cls.begin()->second]);
      std::optional<Choice> choice = choose_start(policy_, heads, terms_, room, now, false);
      if (!choice)
        return;
      const std::size_t j = heads[choice->candidate]->job;
      auto& cls = waiting_[class_[j]];
      cls.erase(cls.begin());
      --queued_;
      start(j, choice->pool, now);
    }
  }

  void finish_report() {
    SimReport& r = report_;
    std::vector<double> jct;
    double wait = 0, first = INFINITY, last = 0;
    for (std::size_t j = 0; j < jobs_.size(); ++j) {
      const Placement& pl = r.placements[j];
      if (pl.pool < 0 || left_[j] > 0)  // never ran, or abandoned
        continue;
      jct.push_back(pl.end_s - jobs_[j].arrival_s);
      wait += pl.start_s - jobs_[j].arrival_s;
      first = std::min(first, jobs_[j].arrival_s);
      last = std::max(last, pl.end_s);
    }
    if (!jct.empty()) {
      double total = 0;
      for (double v : jct)
        total += v;
      r.mean_jct_s = total / static_cast<double>(jct.size());
      r.mean_wait_s = wait / static_cast<double>(jct.size());
      r.median_jct_s = percentile(jct, 0.5);
      r.p99_jct_s = percentile(jct, 0.99);
      r.makespan_s = last - first;
    }
    double held = 0;
    for (std::size_t p = 0; p < fleet_.pools.size(); ++p) {
      const double capacity = static_cast<double>(fleet_.pools[p].chips()) * r.makespan_s;
      r.pools.push_back({fleet_.label(p), fleet_.pools[p].chips(), started_on_[p],
                         capacity > 0 ? busy_[p] / capacity : 0});
      held += busy_[p];
    }
    r.goodput = held > 0 ? kept_ / held : 1;
  }

  const Fleet& fleet_;
  const std::vector<Job>& jobs_;
  Policy policy_;
  Failures failures_;
  Preemption preemption_;
  std::mt19937_64 rng_;
  std::vector<PoolState> pools_;
  std::vector<std::vector<int>> runnable_;
  std::vector<WaitingJob> candidates_;
  std::vector<PoolTerms> terms_;
  std::vector<double> best_seconds_, left_, rank_, attained_;  // attained: chip-seconds held
  std::vector<bool> stopped_;  // interrupted or preempted: a restart costs restart_min
  std::set<std::size_t> running_jobs_;
  std::vector<std::size_t> class_;
  std::vector<std::set<std::pair<double, std::size_t>>> waiting_;
  std::vector<Holding> held_;
  std::vector<Run> run_;
  std::vector<std::int64_t> generation_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::uint64_t sequence_ = 0;
  std::vector<double> busy_;
  std::vector<std::int64_t> started_on_;
  std::int64_t running_ = 0, queued_ = 0;
  std::size_t arrivals_left_ = 0;
  bool rebalance_due_ = false;
  double kept_ = 0;  // chip-seconds of work that was kept
  SimReport report_;
};

}  // namespace

SimReport simulate(const Fleet& fleet, const std::vector<Job>& jobs, Policy policy,
                   const Failures& failures, const Preemption& preemption, std::uint64_t tie_seed) {
  check(failures.node_mtbf_h >= 0 && failures.repair_h >= 0 && failures.checkpoint_min >= 0 &&
            failures.restart_min >= 0,
        "failures: MTBF, repair, checkpoint and restart times must not be negative");
  check(preemption.quantum_min > 0, "preemption: the quantum must be positive");
  if (policy == Policy::las)
    for (const Job& job : jobs)
      check(job.milli == 0, "las: job " + std::to_string(job.id) +
                                " asks for a share of a chip; las preempts whole chips only "
                                "(use another policy for traces with GPU sharing)");
  return Simulation(fleet, jobs, policy, failures, preemption, tie_seed).run();
}

}  // namespace loom::cluster
