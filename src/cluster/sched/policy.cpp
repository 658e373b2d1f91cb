#include "cluster/sched/policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace loom::cluster {

Policy parse_policy(const std::string& text) {
  std::string names;
  for (Policy p : all_policies()) {
    if (text == policy_name(p))
      return p;
    names += std::string(names.empty() ? "" : ", ") + policy_name(p);
  }
  throw Error("policy '" + text + "' is not one of: " + names);
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
    case Policy::las:
      return "las";
    case Policy::cheapest:
      return "cheapest";
    case Policy::loom:
      return "loom";
  }
  return "?";
}

std::vector<Policy> all_policies() {
  return {Policy::fifo, Policy::backfill, Policy::sjf, Policy::fastest,
          Policy::las,  Policy::cheapest, Policy::loom};
}

namespace {
// splitmix64's finaliser: a well-mixed 64-bit hash of x.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

std::vector<int> tie_break_order(std::vector<int> pools, std::span<const int> group_of,
                                 std::uint64_t seed, std::int64_t job_id) {
  const std::uint64_t job = mix(seed ^ mix(static_cast<std::uint64_t>(job_id)));
  // Each pool's rank computed once (a sort asks for it many times): (rank, pool) pairs.
  std::vector<std::pair<std::uint64_t, int>> ranked;
  ranked.reserve(pools.size());
  for (int pool : pools) {
    const int group = group_of.empty() ? pool : group_of[static_cast<std::size_t>(pool)];
    ranked.push_back({mix(job ^ static_cast<std::uint64_t>(group)), pool});
  }
  std::sort(ranked.begin(), ranked.end());
  for (std::size_t i = 0; i < pools.size(); ++i)
    pools[i] = ranked[i].second;
  return pools;
}

double order_key(Policy policy, std::int64_t priority, double arrival_rank, double best_seconds) {
  // Priorities are small integers: one priority level outweighs any rank or run time.
  const double level = -static_cast<double>(priority) * 1e15;
  return level + (policy == Policy::sjf ? best_seconds : arrival_rank);
}

namespace {

double seconds_or_inf(const PoolOption& o) {
  return std::isnan(o.seconds) ? INFINITY : o.seconds;
}

// Cost of running the candidate on the option's pool: price x chips x hours (NaN when its
// run time is unknown; 0 when the pool has no price).
double cost_of(const WaitingJob& c, const PoolOption& o, std::span<const PoolTerms> pools) {
  const double price = pools[static_cast<std::size_t>(o.pool)].price_per_chip_hour;
  return price * static_cast<double>(c.chips) * o.seconds / 3600.0;
}

bool meets_deadline(const WaitingJob& c, const PoolOption& o, double now) {
  return !std::isnan(o.seconds) && now + o.seconds <= c.deadline_s;
}

// Whether option `a` beats option `b` (earlier in the job's order) under the policy.
bool better(Policy policy, const WaitingJob& c, const PoolOption& a, const PoolOption& b,
            std::span<const PoolTerms> pools, double now) {
  switch (policy) {
    case Policy::fastest:
      return seconds_or_inf(a) < seconds_or_inf(b);
    case Policy::cheapest: {
      const bool ma = meets_deadline(c, a, now), mb = meets_deadline(c, b, now);
      if (ma != mb)
        return ma;
      if (ma)  // both meet it: the cheaper (known costs before unknown)
        return cost_of(c, a, pools) < cost_of(c, b, pools);
      return seconds_or_inf(a) < seconds_or_inf(b);  // neither: the earliest finish
    }
    case Policy::loom: {
      const bool ma = meets_deadline(c, a, now), mb = meets_deadline(c, b, now);
      if (ma != mb)
        return ma;
      if (seconds_or_inf(a) != seconds_or_inf(b))
        return seconds_or_inf(a) < seconds_or_inf(b);
      const double ca = cost_of(c, a, pools), cb = cost_of(c, b, pools);
      return !std::isnan(ca) && !std::isnan(cb) && ca < cb;
    }
    default:  // fifo, backfill, sjf, las: the first pool with room in the job's order
      return false;
  }
}

std::string hours(double seconds) {
  char text[32];
  if (seconds < 90)
    std::snprintf(text, sizeof text, "%.1f s", seconds);
  else if (seconds < 3600)
    std::snprintf(text, sizeof text, "%.0f min", seconds / 60);
  else
    std::snprintf(text, sizeof text, "%.1f h", seconds / 3600);
  return text;
}

std::string ratio(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1fx", x);
  return text;
}

// The reason in words: what made the chosen pool win, and how the best other pool compares.
std::string explain_choice(Policy policy, const WaitingJob& c, const PoolOption& chosen,
                           std::span<const PoolTerms> pools, const Room& room, double now) {
  const std::string& name = pools[static_cast<std::size_t>(chosen.pool)].name;
  const bool deadline = std::isfinite(c.deadline_s);
  const std::string limit = deadline ? hours(c.deadline_s - now) + " deadline" : "";
  std::string why;
  switch (policy) {
    case Policy::cheapest:
      why = meets_deadline(c, chosen, now)
                ? (deadline ? "cheapest that meets the " + limit : "cheapest")
                : "no pool with room meets the " + limit + "; earliest predicted finish";
      break;
    case Policy::loom:
      why = std::isnan(chosen.seconds)
                ? "first pool with room in the job's order (speed unknown everywhere)"
            : meets_deadline(c, chosen, now)
                ? (deadline ? "earliest predicted finish (" + hours(chosen.seconds) +
                                  ") that meets the " + limit
                            : "earliest predicted finish (" + hours(chosen.seconds) + ")")
                : "no pool with room meets the " + limit + "; earliest predicted finish (" +
                      hours(chosen.seconds) + ")";
      break;
    case Policy::fastest:
      why = std::isnan(chosen.seconds) ? "speed unknown on every pool with room"
                                       : "fastest with room (" + hours(chosen.seconds) + ")";
      break;
    default:
      why = std::string("first pool with room in the job's order (") + policy_name(policy) + ")";
  }
  // The best other option by speed, for comparison.
  const PoolOption* other = nullptr;
  for (const PoolOption& o : c.options)
    if (o.pool != chosen.pool && (other == nullptr || seconds_or_inf(o) < seconds_or_inf(*other)))
      other = &o;
  if (other != nullptr) {
    const std::string& other_name = pools[static_cast<std::size_t>(other->pool)].name;
    std::string compare;
    if (std::isnan(other->seconds)) {
      compare = other_name + " speed unknown";
    } else if (!std::isnan(chosen.seconds) && other->seconds < chosen.seconds) {
      compare = other_name + " " + ratio(chosen.seconds / other->seconds) + " faster";
      const double mine = cost_of(c, chosen, pools), theirs = cost_of(c, *other, pools);
      if (mine > 0 && theirs > mine)
        compare += " but " + ratio(theirs / mine) + " the price";
      if (!room.has_room(other->pool, c))
        compare += ", but full";
    } else if (!std::isnan(chosen.seconds)) {
      compare = other_name + " " + ratio(other->seconds / chosen.seconds) + " slower";
      if (!room.has_room(other->pool, c))
        compare += " and full";
    }
    if (!compare.empty())
      why += "; " + compare;
  }
  return name + ": " + why;
}

}  // namespace

std::optional<Choice> choose_pool(Policy policy, const WaitingJob& candidate,
                                  std::span<const PoolTerms> pools, const Room& room, double now,
                                  bool explain) {
  const PoolOption* best = nullptr;
  for (const PoolOption& o : candidate.options) {
    if (!room.has_room(o.pool, candidate))
      continue;
    if (best == nullptr) {
      best = &o;
      if (policy == Policy::fifo || policy == Policy::backfill || policy == Policy::sjf ||
          policy == Policy::las)
        break;  // the first pool with room
      continue;
    }
    if (better(policy, candidate, o, *best, pools, now))
      best = &o;
  }
  if (best == nullptr)
    return std::nullopt;
  Choice choice;
  choice.pool = best->pool;
  if (explain)
    choice.reason = explain_choice(policy, candidate, *best, pools, room, now);
  return choice;
}

std::optional<Choice> choose_start(Policy policy, std::span<const WaitingJob* const> candidates,
                                   std::span<const PoolTerms> pools, const Room& room, double now,
                                   bool explain) {
  auto before = [&](const WaitingJob& a, const WaitingJob& b) {
    return a.key != b.key ? a.key < b.key : a.job < b.job;
  };
  if (policy == Policy::fifo) {  // the first job, or nothing until it fits
    const WaitingJob* first = nullptr;
    std::size_t at = 0;
    for (std::size_t i = 0; i < candidates.size(); ++i)
      if (first == nullptr || before(*candidates[i], *first)) {
        first = candidates[i];
        at = i;
      }
    if (first == nullptr)
      return std::nullopt;
    std::optional<Choice> choice = choose_pool(policy, *first, pools, room, now, explain);
    if (choice)
      choice->candidate = at;
    return choice;
  }
  // The first in key order that can start: scan, checking only candidates that would
  // come before the best found so far.
  std::optional<Choice> best;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (best && !before(*candidates[i], *candidates[best->candidate]))
      continue;
    std::optional<Choice> choice = choose_pool(policy, *candidates[i], pools, room, now, false);
    if (!choice)
      continue;
    choice->candidate = i;
    best = choice;
  }
  if (best && explain)
    best->reason =
        choose_pool(policy, *candidates[best->candidate], pools, room, now, true)->reason;
  return best;
}

std::optional<PreemptionChoice> choose_preemption(Policy policy, const WaitingJob& candidate,
                                                  std::span<const RunningJob> running,
                                                  std::span<const PoolTerms> pools,
                                                  const Room& room, double now) {
  if (candidate.milli > 0)
    return std::nullopt;  // chips counted whole below: shares are not preempted for
  // The job's pools in the policy's order of preference.
  std::vector<PoolOption> order = candidate.options;
  std::stable_sort(order.begin(), order.end(), [&](const PoolOption& a, const PoolOption& b) {
    return better(policy, candidate, a, b, pools, now);
  });
  for (const PoolOption& o : order) {
    std::vector<std::size_t> lower;
    for (std::size_t r = 0; r < running.size(); ++r)
      if (running[r].pool == o.pool && running[r].priority < candidate.priority)
        lower.push_back(r);
    std::sort(lower.begin(), lower.end(), [&](std::size_t a, std::size_t b) {
      if (running[a].priority != running[b].priority)
        return running[a].priority < running[b].priority;
      if (running[a].started_s != running[b].started_s)
        return running[a].started_s > running[b].started_s;
      return running[a].job > running[b].job;
    });
    std::int64_t free = room.free_chips(o.pool);
    PreemptionChoice choice;
    choice.pool = o.pool;
    for (std::size_t r : lower) {
      if (free >= candidate.chips)
        break;
      choice.victims.push_back(r);
      free += running[r].chips;
    }
    if (free < candidate.chips || choice.victims.empty())
      continue;
    choice.reason = pools[static_cast<std::size_t>(o.pool)].name + ": preempting " +
                    std::to_string(choice.victims.size()) + " job(s) of lower priority (" +
                    std::to_string(running[choice.victims.front()].priority) + ") for priority " +
                    std::to_string(candidate.priority);
    return choice;
  }
  return std::nullopt;
}

}  // namespace loom::cluster
