#include "cluster/sched/rounds.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <numeric>

#include "cluster/sched/gavel.h"
#include "cluster/sched/linear_program.h"
#include "core/error.h"

namespace loom::cluster {

namespace {
// Water-filling programs solved per allocation at most (each settles at least one level).
constexpr int kMaxFillingRounds = 32;
}  // namespace

std::optional<RoundPolicy> parse_round_policy(const std::string& text) {
  if (text == "max_min_fairness")
    return RoundPolicy::max_min_fairness;
  if (text == "max_min_fairness_perf")
    return RoundPolicy::max_min_fairness_perf;
  if (text == "fifo")
    return RoundPolicy::fifo;
  if (text == "fifo_perf")
    return RoundPolicy::fifo_perf;
  return std::nullopt;
}

const char* round_policy_name(RoundPolicy policy) {
  switch (policy) {
    case RoundPolicy::max_min_fairness:
      return "max_min_fairness";
    case RoundPolicy::max_min_fairness_perf:
      return "max_min_fairness_perf";
    case RoundPolicy::fifo:
      return "fifo";
    case RoundPolicy::fifo_perf:
      return "fifo_perf";
  }
  return "?";
}

std::vector<std::vector<double>> round_allocation(RoundPolicy policy,
                                                  const std::vector<std::vector<double>>& rate,
                                                  const std::vector<std::int64_t>& scale,
                                                  const std::vector<double>& weight,
                                                  const std::vector<std::int64_t>& chips,
                                                  std::int64_t* programs, MaxMinSolver solver) {
  const std::size_t jobs = rate.size(), types = chips.size();
  std::vector<std::vector<double>> x(jobs, std::vector<double>(types, 0.0));
  if (jobs == 0)
    return x;
  const double all_chips =
      static_cast<double>(std::accumulate(chips.begin(), chips.end(), std::int64_t{0}));
  // The coefficient of X[j][t] in job j's normalised share (see rounds.h).
  std::vector<std::vector<double>> c(jobs, std::vector<double>(types, 0.0));
  for (std::size_t j = 0; j < jobs; ++j) {
    double equal_share = 0;  // P_j: throughput under an equal share of every type
    for (std::size_t t = 0; t < types; ++t)
      equal_share += rate[j][t] * static_cast<double>(chips[t]) / all_chips;
    for (std::size_t t = 0; t < types; ++t) {
      if (!(rate[j][t] > 0) || chips[t] < scale[j])
        continue;  // cannot run there: no variable
      const double s = static_cast<double>(scale[j]);
      c[j][t] = policy == RoundPolicy::max_min_fairness
                    ? s / weight[j]
                    : rate[j][t] * s / (weight[j] * equal_share);
    }
  }
  // Jobs alike (the same coefficients and chips) are one class: by symmetry a max-min
  // allocation gives each member the same, so the programs are over classes, X[k][t] the
  // class's summed time on type t (at most its n_k members' time), each member's share
  // sum_t c[k][t] X[k][t] / n_k. A continuous Gavel workload has at most 83 classes however
  // many jobs wait, which keeps the programs small. Coefficients alike to within about
  // 1e-9 (relative) are the same: a throughput that comes back from run time = steps /
  // throughput differs in its last bits from job to job, and keyed exactly, a workload of
  // 83 kinds of job made 115-127 classes (and as many water-filling levels).
  auto key_of = [](const std::vector<double>& coefficients) {
    std::vector<std::int64_t> key;
    for (double v : coefficients)
      key.push_back(v > 0 ? std::llround(std::log2(v) * 1e9) : INT64_MIN);
    return key;
  };
  std::map<std::pair<std::vector<std::int64_t>, std::int64_t>, std::size_t> class_of_key;
  std::vector<std::size_t> class_of(jobs, SIZE_MAX);
  std::vector<std::size_t> members;
  std::vector<std::vector<double>> cc;  // per class: c[k][t]
  std::vector<std::int64_t> class_scale;
  for (std::size_t j = 0; j < jobs; ++j) {
    if (std::none_of(c[j].begin(), c[j].end(), [](double v) { return v > 0; }))
      continue;  // no type can run it: no share
    auto [it, added] = class_of_key.emplace(std::pair{key_of(c[j]), scale[j]}, cc.size());
    if (added) {
      cc.push_back(c[j]);
      class_scale.push_back(scale[j]);
      members.push_back(0);
    }
    class_of[j] = it->second;
    ++members[it->second];
  }
  const std::size_t classes = cc.size();
  // Max-min fairness by water-filling: maximise the least share z among the classes not
  // yet settled; the classes whose share constraint binds at the optimum (a non-zero dual:
  // no optimal allocation gives them more) settle at z; repeat with the others, whose
  // shares must now stay at least z. The allocation is the last program's.
  LinearProgram lp;
  std::vector<std::vector<std::size_t>> var(classes, std::vector<std::size_t>(types, SIZE_MAX));
  for (std::size_t k = 0; k < classes; ++k)
    for (std::size_t t = 0; t < types; ++t)
      if (cc[k][t] > 0)
        var[k][t] = lp.add_variable(0, static_cast<double>(members[k]), 0);
  const std::size_t z = lp.add_variable(0, LinearProgram::kInf, 1);
  std::vector<std::size_t> share_row(classes, SIZE_MAX);
  std::vector<std::vector<std::pair<std::size_t, double>>> share(classes);
  for (std::size_t k = 0; k < classes; ++k) {
    std::vector<std::pair<std::size_t, double>> time;
    for (std::size_t t = 0; t < types; ++t)
      if (var[k][t] != SIZE_MAX) {
        share[k].push_back({var[k][t], cc[k][t] / static_cast<double>(members[k])});
        time.push_back({var[k][t], 1.0});
      }
    auto with_z = share[k];
    with_z.push_back({z, -1.0});
    share_row[k] = lp.add_row(with_z, 0, LinearProgram::kInf);                // share_k >= z
    lp.add_row(time, -LinearProgram::kInf, static_cast<double>(members[k]));  // members' time
  }
  for (std::size_t t = 0; t < types; ++t) {
    std::vector<std::pair<std::size_t, double>> used;
    for (std::size_t k = 0; k < classes; ++k)
      if (var[k][t] != SIZE_MAX)
        used.push_back({var[k][t], static_cast<double>(class_scale[k])});
    if (!used.empty())
      lp.add_row(used, -LinearProgram::kInf, static_cast<double>(chips[t]));
  }
  std::vector<bool> settled(classes, false);
  std::vector<std::vector<double>> X(classes, std::vector<double>(types, 0.0));
  std::size_t unsettled = classes;
  for (int round = 0; unsettled > 0; ++round) {
    if (solver == MaxMinSolver::interior_point) {  // one program, ended inside its optima
      if (programs != nullptr)
        ++*programs;
      const std::optional<std::vector<double>> solution = lp.maximize_interior();
      check(solution.has_value(),
            "round-based scheduling: the interior-point method found no allocation");
      for (std::size_t k = 0; k < classes; ++k)
        for (std::size_t t = 0; t < types; ++t)
          if (var[k][t] != SIZE_MAX)
            X[k][t] = std::max((*solution)[var[k][t]], 0.0);
      break;
    }
    std::optional<std::vector<double>> solution = lp.maximize();
    if (programs != nullptr)
      ++*programs;
    // The first program always has a solution (nothing allocated, z = 0). A later one is
    // the last with its settled classes held 1e-9 (relative) below their levels; should
    // rounding still make it infeasible, the last allocation stands. (A slack of 1e-7
    // made GLPK's warm starts crawl: a Gavel run at 2.2 jobs/h took over 5 minutes, not 30 s.)
    if (!solution && round > 0)
      break;
    check(solution.has_value(), "round-based scheduling: the allocation program has no solution");
    for (std::size_t k = 0; k < classes; ++k)
      for (std::size_t t = 0; t < types; ++t)
        if (var[k][t] != SIZE_MAX)
          X[k][t] = std::max((*solution)[var[k][t]], 0.0);
    // Settle the binding classes: their rows become share_k >= z* without z (the next
    // program starts from this one's basis). When the duals name none (degenerate), or
    // after enough rounds, the classes left keep what they have.
    const double least = (*solution)[z];
    std::size_t now_settled = 0;
    for (std::size_t k = 0; k < classes; ++k)
      if (!settled[k] && std::abs(lp.dual(share_row[k])) > 1e-9) {
        settled[k] = true;
        lp.set_row(share_row[k], share[k], least * (1 - 1e-9), LinearProgram::kInf);
        ++now_settled;
      }
    if (now_settled == 0 || round + 1 >= kMaxFillingRounds)
      break;
    unsettled -= now_settled;
  }
  for (std::size_t j = 0; j < jobs; ++j)
    if (class_of[j] != SIZE_MAX)
      for (std::size_t t = 0; t < types; ++t)
        x[j][t] =
            std::clamp(X[class_of[j]][t] / static_cast<double>(members[class_of[j]]), 0.0, 1.0);
  return x;
}

std::vector<std::vector<double>> FifoAllocator::allocate(
    const std::vector<std::int64_t>& ids, const std::vector<std::vector<double>>& rate,
    const std::vector<std::int64_t>& scale, const std::vector<std::string>& type_names,
    const std::vector<std::int64_t>& chips) {
  const std::size_t types = chips.size();
  check(type_names.size() == types && rate.size() == ids.size() && scale.size() == ids.size(),
        "FifoAllocator: jobs and types disagree in size");
  std::map<std::int64_t, std::size_t> index_of;  // id -> row
  for (std::size_t j = 0; j < ids.size(); ++j)
    index_of[ids[j]] = j;
  if (performance_aware_)
    allocation_.clear();
  std::vector<std::int64_t> available = chips;  // may go below 0, as in Gavel
  std::deque<std::int64_t> queue;               // waiting jobs by id
  for (const auto& [id, row] : index_of)
    if (!allocation_.contains(id))
      queue.push_back(id);
  // Finished jobs hand their type to the queue's head when it fits there; the others
  // still hold theirs. (Over a snapshot of the ids: jobs placed here are not visited.)
  std::vector<std::int64_t> held;
  for (const auto& entry : allocation_)
    held.push_back(entry.first);
  for (std::int64_t id : held) {
    const auto [type, held_chips] = allocation_.at(id);
    if (index_of.contains(id)) {
      available[type] -= held_chips;
      continue;
    }
    if (!queue.empty()) {
      const std::size_t head = index_of.at(queue.front());
      if (scale[head] <= available[type] && rate[head][type] > 0) {
        allocation_[queue.front()] = {type, scale[head]};
        available[type] -= scale[head];
        queue.pop_front();
      }
    }
    allocation_.erase(id);
  }
  // The types with free chips, by name.
  std::vector<std::size_t> with_free;
  for (std::size_t t = 0; t < types; ++t)
    if (available[t] > 0)
      with_free.push_back(t);
  std::sort(with_free.begin(), with_free.end(),
            [&](std::size_t a, std::size_t b) { return type_names[a] < type_names[b]; });
  while (!queue.empty() && !with_free.empty()) {
    const std::int64_t id = queue.front();
    queue.pop_front();
    const std::size_t j = index_of.at(id);
    std::vector<std::size_t> fitting;  // positions in `with_free` with room for the job
    for (std::size_t i = 0; i < with_free.size(); ++i)
      if (available[with_free[i]] >= scale[j])
        fitting.push_back(i);
    if (fitting.empty())
      break;  // first come, first served: no later job jumps ahead
    std::size_t pick = 0, type = 0;
    if (!performance_aware_) {
      pick = rng_.randbelow(static_cast<std::uint32_t>(fitting.size()));
      type = with_free.back();  // Gavel's code: see rounds.h
    } else {
      double best = -1;
      for (std::size_t i = 0; i < fitting.size(); ++i)
        if (rate[j][with_free[fitting[i]]] > best) {
          best = rate[j][with_free[fitting[i]]];
          pick = i;
          type = with_free[fitting[i]];
        }
    }
    if (!(rate[j][type] > 0))
      continue;
    allocation_[id] = {type, scale[j]};
    available[type] -= scale[j];
    if (available[type] == 0)
      with_free.erase(with_free.begin() + static_cast<std::ptrdiff_t>(fitting[pick]));
  }
  std::vector<std::vector<double>> x(ids.size(), std::vector<double>(types, 0.0));
  for (const auto& [id, held_type] : allocation_)
    x[index_of.at(id)][held_type.first] = 1.0;
  return x;
}

namespace {

struct Active {
  Job job;
  std::vector<double> rate;      // steps/s on each type (0: cannot run there)
  double remaining = 0;          // steps
  std::vector<double> time_run;  // Gavel's _job_time_so_far, per type
  std::vector<double> deficit;   // per type (a tie-break)
  std::vector<double> share;     // the allocation's X[j][t]
  bool allocated = false;        // in the current allocation
};

}  // namespace

RoundReport simulate_rounds(const Fleet& fleet, const JobSource& source, RoundPolicy policy,
                            const RoundOptions& o) {
  RoundReport report;
  report.policy = policy;
  // Chip types, in the fleet's order (Gavel's worker-type order: v100, p100, k80).
  std::vector<std::int64_t> chips;
  for (const Pool& pool : fleet.pools) {
    auto it = std::find(report.types.begin(), report.types.end(), pool.chip);
    if (it == report.types.end()) {
      report.types.push_back(pool.chip);
      chips.push_back(pool.chips());
    } else {
      chips[static_cast<std::size_t>(it - report.types.begin())] += pool.chips();
    }
  }
  const std::size_t types = report.types.size();
  check(types > 0, "round-based scheduling: the fleet has no chips");
  const double half_round = o.round_s / 2;  // a new or reset job's time so far (Gavel)
  std::vector<double> busy(types, 0.0), type_time(types, 0.0);  // type_time: _worker_time_so_far
  std::vector<Active> active;
  PythonRandom type_order_rng(o.seed + 5);
  std::optional<FifoAllocator> fifo;
  if (policy == RoundPolicy::fifo || policy == RoundPolicy::fifo_perf)
    fifo.emplace(policy == RoundPolicy::fifo_perf, o.seed);
  std::optional<Job> pending = source();
  double now = 0, last_reset = 0, jct_sum_all = 0, jct_sum_window = 0;
  bool reset_yet = false, need_allocation = false;
  auto in_window = [&](std::int64_t id) {
    return id >= o.window_begin && (o.window_end < 0 || id < o.window_end);
  };
  std::int64_t window_left = o.window_end < 0 ? -1 : o.window_end - o.window_begin;

  struct Run {
    std::size_t job;  // index into active
    std::size_t type;
    double steps, start, finish;
  };
  std::vector<Run> running;
  while (true) {
    if (window_left == 0)
      break;
    // Advance to the end of the round (the last micro-task's finish), or, with nothing
    // running, to the next arrival.
    if (!running.empty()) {
      double end = now;
      for (const Run& r : running)
        end = std::max(end, r.finish);
      now = end;
      std::vector<std::size_t> done;
      for (const Run& r : running) {
        Active& a = active[r.job];
        const double ran = r.finish - r.start;
        a.time_run[r.type] += ran;
        type_time[r.type] += ran;
        busy[r.type] += ran * static_cast<double>(a.job.chips);
        a.remaining -= r.steps;
        if (a.remaining <= a.job.steps * 1e-12) {
          const double jct = r.finish - a.job.arrival_s;
          report.jct_s[static_cast<std::size_t>(a.job.id)] = jct;
          ++report.finished;
          jct_sum_all += jct;
          if (in_window(a.job.id)) {
            jct_sum_window += jct;
            ++report.window_jobs;
            if (window_left > 0)
              --window_left;
          }
          done.push_back(r.job);
        }
      }
      running.clear();
      std::sort(done.rbegin(), done.rend());
      for (std::size_t i : done)
        active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
      need_allocation = need_allocation || !done.empty();
      if (window_left == 0)
        break;
    } else if (pending) {
      now = std::max(now, pending->arrival_s);
    } else if (!active.empty()) {
      now = std::max(now, last_reset + o.min_reset_s);  // waiting for an allocation
    } else {
      break;
    }
    // Arrivals up to now.
    while (pending && pending->arrival_s <= now) {
      Job job = std::move(*pending);
      pending = source();
      ++report.jobs;
      if (report.jct_s.size() <= static_cast<std::size_t>(job.id))
        report.jct_s.resize(static_cast<std::size_t>(job.id) + 1,
                            std::numeric_limits<double>::quiet_NaN());
      Active a;
      a.rate.assign(types, 0.0);
      bool runnable = false;
      for (std::size_t t = 0; t < types; ++t) {
        auto it = job.seconds_on.find(report.types[t]);
        if (it != job.seconds_on.end() && it->second > 0 && chips[t] >= job.chips) {
          // steps/s; a job without a step count runs one "step" in all
          a.rate[t] = (job.steps > 0 ? job.steps : 1.0) / it->second;
          runnable = true;
        }
      }
      if (!runnable) {
        report.rejected.push_back("job " + std::to_string(job.id) + " (" + job.name +
                                  "): no chip type of the fleet can run it");
        if (in_window(job.id) && window_left > 0)
          --window_left;
        continue;
      }
      a.remaining = job.steps > 0 ? job.steps : 1.0;
      a.time_run.assign(types, half_round);
      a.deficit.assign(types, 0.0);
      a.share.assign(types, 0.0);
      a.job = std::move(job);
      active.push_back(std::move(a));
      need_allocation = true;
    }
    if (static_cast<std::int64_t>(active.size()) > o.max_active_jobs) {
      report.saturated = true;
      break;
    }
    if (active.empty())
      continue;
    // A new allocation when jobs came or went, at most every min_reset_s.
    if (need_allocation && (!reset_yet || now - last_reset >= o.min_reset_s)) {
      const double elapsed = now - last_reset;
      std::fill(type_time.begin(), type_time.end(), 0.0);
      std::vector<std::vector<double>> rate;
      std::vector<std::int64_t> scale;
      std::vector<double> weight;
      for (Active& a : active) {
        for (std::size_t t = 0; t < types; ++t) {
          if (a.allocated)
            a.deficit[t] += a.share[t] * elapsed - (a.time_run[t] - half_round);
          a.time_run[t] = half_round;
          type_time[t] += half_round;
        }
        rate.push_back(a.rate);
        scale.push_back(a.job.chips);
        weight.push_back(a.job.weight);
      }
      std::vector<std::vector<double>> x;
      if (fifo) {
        std::vector<std::int64_t> ids;
        for (const Active& a : active)
          ids.push_back(a.job.id);
        x = fifo->allocate(ids, rate, scale, report.types, chips);
      } else {
        x = round_allocation(policy, rate, scale, weight, chips, &report.programs, o.solver);
      }
      for (std::size_t j = 0; j < active.size(); ++j) {
        active[j].share = x[j];
        active[j].allocated = true;
      }
      last_reset = now;
      reset_yet = true;
      need_allocation = false;
      ++report.allocations;
    }
    // Priorities per (job, type), then the types in order (shuffled each round for the
    // type-agnostic policy), each type's jobs by priority, then deficit, then share, ties in
    // arrival order; each job takes one type, all its chips there.
    std::vector<std::size_t> order(types);
    std::iota(order.begin(), order.end(), std::size_t{0});
    if (policy == RoundPolicy::max_min_fairness || policy == RoundPolicy::fifo)
      type_order_rng.shuffle(order);  // Gavel shuffles for the policies not named Perf
    std::vector<std::int64_t> free = chips;
    std::vector<bool> taken(active.size(), false);
    struct Entry {
      double priority, deficit, share;
      std::size_t job;
    };
    std::vector<Entry> entries;
    for (std::size_t t : order) {
      entries.clear();
      for (std::size_t j = 0; j < active.size(); ++j) {
        const Active& a = active[j];
        double priority = 0;
        if (a.allocated && a.share[t] > 0 && a.rate[t] > 0) {
          const double fraction = type_time[t] > 0 ? a.time_run[t] / type_time[t] : 0;
          priority = fraction > 0 ? a.share[t] / fraction : a.share[t] * 1e9;
        }
        entries.push_back({priority, a.deficit[t], a.share[t], j});
      }
      std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
        if (a.priority != b.priority)
          return a.priority > b.priority;
        if (a.deficit != b.deficit)
          return a.deficit > b.deficit;
        return a.share > b.share;
      });
      for (const Entry& e : entries) {
        if (free[t] == 0)
          break;
        Active& a = active[e.job];
        if (taken[e.job] || !(a.rate[t] > 0) || a.job.chips > free[t])
          continue;
        if (fifo && !(e.priority > 0))
          continue;  // all-or-nothing allocations: X = 0 means not here (Gavel)
        free[t] -= a.job.chips;
        taken[e.job] = true;
        if (!a.allocated)
          continue;  // arrived since the allocation: its chips stay idle this round (Gavel)
        // Whole steps in a round (Gavel's int(throughput x round)), at most what is left.
        double steps = std::min(std::floor(a.rate[t] * o.round_s), a.remaining);
        if (steps <= 0)
          steps = std::min(a.rate[t] * o.round_s, a.remaining);  // under a step a round
        running.push_back({e.job, t, steps, now, now + steps / a.rate[t]});
      }
    }
    ++report.rounds;
  }
  report.end_s = now;
  report.mean_jct_all_s = report.finished ? jct_sum_all / static_cast<double>(report.finished) : 0;
  report.mean_jct_s =
      report.window_jobs ? jct_sum_window / static_cast<double>(report.window_jobs) : 0;
  for (std::size_t t = 0; t < types; ++t)
    report.utilization.push_back(now > 0 ? busy[t] / (static_cast<double>(chips[t]) * now) : 0);
  return report;
}

}  // namespace loom::cluster
