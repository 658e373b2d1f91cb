#include "cluster/sched/simulator.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <queue>
#include <set>

#include "core/error.h"

namespace loom::cluster {
namespace {

// One pool's nodes, bucketed by their free chips so that best fit is a short scan.
class PoolState {
 public:
  explicit PoolState(const Pool& pool)
      : per_node_(pool.chips_per_node),
        free_(static_cast<std::size_t>(pool.nodes), pool.chips_per_node),
        position_(static_cast<std::size_t>(pool.nodes)),
        buckets_(static_cast<std::size_t>(pool.chips_per_node) + 1) {
    for (std::int64_t n = 0; n < pool.nodes; ++n)
      insert(n);
  }

  // Chips a job of `chips` holds here: its own when it fits in a node, else whole nodes.
  std::int64_t footprint(std::int64_t chips) const {
    return chips <= per_node_ ? chips : (chips + per_node_ - 1) / per_node_ * per_node_;
  }
  bool capacity_for(std::int64_t chips, std::int64_t nodes) const {
    return footprint(chips) <= nodes * per_node_;
  }
  bool fits(std::int64_t chips) const {
    if (chips > per_node_)
      return whole_nodes(chips) <= static_cast<std::int64_t>(buckets_.back().size());
    for (std::int64_t f = chips; f <= per_node_; ++f)
      if (!buckets_[static_cast<std::size_t>(f)].empty())
        return true;
    return false;
  }
  // The nodes and chips taken; fits(chips) must hold.
  std::vector<std::pair<std::int64_t, std::int64_t>> take(std::int64_t chips) {
    std::vector<std::pair<std::int64_t, std::int64_t>> taken;
    if (chips > per_node_) {
      for (std::int64_t k = whole_nodes(chips); k > 0; --k) {
        std::int64_t node = buckets_.back().back();
        move(node, 0);
        taken.push_back({node, per_node_});
      }
      return taken;
    }
    for (std::int64_t f = chips; f <= per_node_; ++f) {
      auto& bucket = buckets_[static_cast<std::size_t>(f)];
      if (bucket.empty())
        continue;
      std::int64_t node = bucket.back();
      move(node, f - chips);
      taken.push_back({node, chips});
      return taken;
    }
    throw Error("scheduler: no node has room (fits() was not checked)");
  }
  void give_back(const std::vector<std::pair<std::int64_t, std::int64_t>>& taken) {
    for (auto [node, chips] : taken) {
      std::int64_t now = free_[static_cast<std::size_t>(node)] + chips;
      check(now <= per_node_, "scheduler: a node got back more chips than it has");
      move(node, now);
    }
  }
  bool any_free() const { return free_nodes_ > 0 || partly_free_ > 0; }

 private:
  std::int64_t whole_nodes(std::int64_t chips) const { return (chips + per_node_ - 1) / per_node_; }
  void insert(std::int64_t node) {
    auto& bucket = buckets_[static_cast<std::size_t>(free_[static_cast<std::size_t>(node)])];
    position_[static_cast<std::size_t>(node)] = bucket.size();
    bucket.push_back(node);
    count(free_[static_cast<std::size_t>(node)], +1);
  }
  void erase(std::int64_t node) {
    const std::int64_t f = free_[static_cast<std::size_t>(node)];
    auto& bucket = buckets_[static_cast<std::size_t>(f)];
    std::size_t at = position_[static_cast<std::size_t>(node)];
    bucket[at] = bucket.back();
    position_[static_cast<std::size_t>(bucket[at])] = at;
    bucket.pop_back();
    count(f, -1);
  }
  void move(std::int64_t node, std::int64_t free_now) {
    erase(node);
    free_[static_cast<std::size_t>(node)] = free_now;
    insert(node);
  }
  void count(std::int64_t free, int delta) {
    if (free == per_node_)
      free_nodes_ += delta;
    else if (free > 0)
      partly_free_ += delta;
  }

  std::int64_t per_node_;
  std::vector<std::int64_t> free_;
  std::vector<std::size_t> position_;
  std::vector<std::vector<std::int64_t>> buckets_;
  std::int64_t free_nodes_ = 0, partly_free_ = 0;
};

double percentile(std::vector<double> values, double q) {
  if (values.empty())
    return 0;
  std::size_t k = static_cast<std::size_t>(std::ceil(q * static_cast<double>(values.size()))) - 1;
  k = std::min(k, values.size() - 1);
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k), values.end());
  return values[k];
}

}  // namespace

Policy parse_policy(const std::string& text) {
  for (Policy p : all_policies())
    if (text == policy_name(p))
      return p;
  throw Error("policy '" + text + "' is not one of: fifo, backfill, sjf, fastest");
}

const char* policy_name(Policy policy) {
  switch (policy) {
    case Policy::fifo:
      return "fifo";
    case Policy::backfill:
      return "backfill";
    case Policy::sjf:
      return "sjf";
    case Policy::fastest:
      return "fastest";
  }
  return "?";
}

std::vector<Policy> all_policies() {
  return {Policy::fifo, Policy::backfill, Policy::sjf, Policy::fastest};
}

SimReport simulate(const Fleet& fleet, const std::vector<Job>& jobs, Policy policy) {
  SimReport r;
  r.policy = policy;
  r.jobs = static_cast<std::int64_t>(jobs.size());
  r.placements.assign(jobs.size(), Placement{});
  std::vector<PoolState> pools;
  for (const Pool& p : fleet.pools)
    pools.emplace_back(p);
  // Per job, the pools that can run it (its chip type measured, enough chips in all).
  std::vector<std::vector<int>> runnable(jobs.size());
  std::vector<double> best_seconds(jobs.size(), 0);
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    double best = 0;
    for (std::size_t p = 0; p < fleet.pools.size(); ++p) {
      auto it = jobs[j].seconds_on.find(fleet.pools[p].chip);
      if (it == jobs[j].seconds_on.end() ||
          !pools[p].capacity_for(jobs[j].chips, fleet.pools[p].nodes))
        continue;
      check(
          it->second > 0 && std::isfinite(it->second),
          "job " + std::to_string(jobs[j].id) + ": run time on " + it->first + " is not positive");
      runnable[j].push_back(static_cast<int>(p));
      best = best == 0 ? it->second : std::min(best, it->second);
    }
    best_seconds[j] = best;
  }
  std::vector<std::size_t> order(jobs.size());
  for (std::size_t j = 0; j < order.size(); ++j)
    order[j] = j;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return jobs[a].arrival_s < jobs[b].arrival_s;
  });
  // Waiting jobs in classes of equal shape (chips asked for, pools that can run them),
  // each ordered by the policy's key: arrival rank, or run time for sjf. Jobs of one class
  // fit wherever any of them does, so a pass looks at the head of each class only: its
  // cost grows with the number of shapes, not with the length of the queue.
  std::map<std::pair<std::int64_t, std::vector<int>>, std::size_t> class_of_shape;
  std::vector<std::size_t> job_class(jobs.size(), 0);
  for (std::size_t j = 0; j < jobs.size(); ++j)
    if (!runnable[j].empty())
      job_class[j] =
          class_of_shape.emplace(std::pair{jobs[j].chips, runnable[j]}, class_of_shape.size())
              .first->second;
  std::vector<std::set<std::pair<double, std::size_t>>> waiting(class_of_shape.size());
  using Completion = std::pair<double, std::size_t>;  // (end time, job)
  std::priority_queue<Completion, std::vector<Completion>, std::greater<>> running;
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> held(jobs.size());
  std::vector<double> busy(fleet.pools.size(), 0);
  std::vector<std::int64_t> started_on(fleet.pools.size(), 0);

  auto start = [&](std::size_t j, int p, double now) {
    held[j] = pools[static_cast<std::size_t>(p)].take(jobs[j].chips);
    const double seconds = jobs[j].seconds_on.at(fleet.pools[static_cast<std::size_t>(p)].chip);
    r.placements[j] = {p, now, now + seconds};
    running.push({now + seconds, j});
    busy[static_cast<std::size_t>(p)] +=
        seconds * static_cast<double>(pools[static_cast<std::size_t>(p)].footprint(jobs[j].chips));
    ++started_on[static_cast<std::size_t>(p)];
  };
  auto choose_pool = [&](std::size_t j) {
    int chosen = -1;
    for (int p : runnable[j]) {
      if (!pools[static_cast<std::size_t>(p)].fits(jobs[j].chips))
        continue;
      if (policy != Policy::fastest)
        return p;  // the first pool with room, in the fleet's order
      if (chosen < 0 ||
          jobs[j].seconds_on.at(fleet.pools[static_cast<std::size_t>(p)].chip) <
              jobs[j].seconds_on.at(fleet.pools[static_cast<std::size_t>(chosen)].chip))
        chosen = p;
    }
    return chosen;
  };
  // Repeatedly: the waiting job first in the policy's order among those that fit now
  // starts (fifo: the first job overall, or nothing until it fits).
  auto schedule = [&](double now) {
    while (true) {
      bool room = false;
      for (const PoolState& s : pools)
        room = room || s.any_free();
      if (!room)
        return;
      const std::pair<double, std::size_t>* best = nullptr;
      std::size_t best_class = 0;
      for (std::size_t c = 0; c < waiting.size(); ++c) {
        if (waiting[c].empty())
          continue;
        const auto& head = *waiting[c].begin();
        if (best != nullptr && *best < head)
          continue;
        if (policy != Policy::fifo && choose_pool(head.second) < 0)
          continue;
        best = &head;
        best_class = c;
      }
      if (best == nullptr)
        return;
      const std::size_t j = best->second;
      const int p = choose_pool(j);
      if (p < 0)
        return;  // fifo: the first job waits, and so does everyone behind it
      waiting[best_class].erase(waiting[best_class].begin());
      start(j, p, now);
    }
  };

  std::size_t next = 0;
  while (next < order.size() || !running.empty()) {
    const double now = std::min(next < order.size() ? jobs[order[next]].arrival_s : INFINITY,
                                running.empty() ? INFINITY : running.top().first);
    while (!running.empty() && running.top().first <= now) {
      const std::size_t j = running.top().second;
      running.pop();
      pools[static_cast<std::size_t>(r.placements[j].pool)].give_back(held[j]);
      held[j].clear();
      ++r.finished;
      ++r.events;
    }
    while (next < order.size() && jobs[order[next]].arrival_s <= now) {
      const std::size_t j = order[next];
      ++r.events;
      if (runnable[j].empty()) {
        r.rejected.push_back(
            "job " + std::to_string(jobs[j].id) + " (" + jobs[j].name + ", " +
            std::to_string(jobs[j].chips) +
            " chips): no pool of the fleet has its chip type measured and that many chips");
      } else {
        waiting[job_class[j]].insert(
            {policy == Policy::sjf ? best_seconds[j] : static_cast<double>(next), j});
      }
      ++next;
    }
    schedule(now);
  }
  // Metrics over the jobs that ran.
  std::vector<double> jct;
  double wait = 0, first = INFINITY, last = 0;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    const Placement& pl = r.placements[j];
    if (pl.pool < 0)
      continue;
    jct.push_back(pl.end_s - jobs[j].arrival_s);
    wait += pl.start_s - jobs[j].arrival_s;
    first = std::min(first, jobs[j].arrival_s);
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
  for (std::size_t p = 0; p < fleet.pools.size(); ++p) {
    const double capacity = static_cast<double>(fleet.pools[p].chips()) * r.makespan_s;
    r.pools.push_back({fleet.pools[p].chip, fleet.pools[p].chips(), started_on[p],
                       capacity > 0 ? busy[p] / capacity : 0});
  }
  return r;
}

}  // namespace loom::cluster
