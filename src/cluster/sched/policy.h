// cluster/sched/policy — the placement decision, one library call shared by the fleet
// simulator (simulator.h) and the live fleet service (cluster/service): which waiting job
// starts now, on which pool, and why; and which running jobs a waiting job of higher
// priority preempts. A simulation therefore predicts what the service will do.
//
// Ties break one documented way everywhere: candidates by their key, then by the
// caller's job index (arrival order); pools by the policy's rules, then by the job's own
// order of acceptable pools. A job that states no order of its own (every job in the
// simulator, a service job that names no pools) gets one from tie_break_order: a seeded
// pseudo-random order per job, so that no policy prefers the first pool listed. The
// order is reproducible: the same seed, job id and pools give the same order.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace loom::cluster {

enum class Policy {
  fifo,      // arrival order; the first job waits until some pool has room (head-of-line blocking)
  backfill,  // arrival order, but a job that does not fit yet lets later ones start
  sjf,       // shortest job first (its run time on its fastest chip type), skipping as backfill
  fastest,   // arrival order with skipping; each job on the pool, among those with room,
             // where it finishes soonest (heterogeneity-aware)
  las,       // least attained service first, preemptive (Tiresias' discretised LAS): every
             // quantum, jobs in a lower service queue (under 1, 10, 100... chip-hours held)
             // take the chips of jobs in higher ones, which checkpoint and wait (simulator only)
  cheapest,  // arrival order with skipping; each job on the pool with room where it costs
             // least while meeting its deadline; when none can, where it finishes soonest
  loom,      // arrival order with skipping; the pool by, in order: coverage allowed ->
             // deadline met -> earliest predicted finish -> lower cost -> the job's own order
};
Policy parse_policy(const std::string& text);  // throws listing the policies
const char* policy_name(Policy policy);
std::vector<Policy> all_policies();

inline constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kNoDeadline = std::numeric_limits<double>::infinity();

// A pool as the decision sees it.
struct PoolTerms {
  std::string name;
  double price_per_chip_hour = 0;  // 0: free or unknown (cost then plays no part)
};

// One pool a job may run on, in the job's own order of preference.
struct PoolOption {
  int pool = -1;              // index into the caller's pools
  double seconds = kUnknown;  // predicted run time there (NaN: unknown, ranked after known)
};

// A waiting job.
struct WaitingJob {
  std::size_t job = 0;  // the caller's index: the last tie-break
  std::int64_t chips = 1;
  std::int64_t milli = 0;           // > 0: a share of one chip, in thousandths (Job::milli)
  double key = 0;                   // the policy's order, smaller first (see order_key)
  double deadline_s = kNoDeadline;  // absolute time by which it should finish
  std::int64_t priority = 0;        // higher preempts lower (service)
  std::vector<PoolOption> options;  // pools it may run on (coverage allowed), in its order
};

// What the pools hold now: the caller's state (the simulator's nodes, the service's slots).
class Room {
 public:
  virtual ~Room() = default;
  virtual bool fits(int pool, std::int64_t chips) const = 0;
  // Room for a share of one chip (thousandths); a caller without shared chips has none.
  virtual bool fits_share(int /*pool*/, std::int64_t /*milli*/) const { return false; }
  bool has_room(int pool, const WaitingJob& job) const {
    return job.milli > 0 ? fits_share(pool, job.milli) : fits(pool, job.chips);
  }
  // Chips free in the pool (for preemption: freed chips plus these must cover a job).
  virtual std::int64_t free_chips(int pool) const = 0;
};

struct Choice {
  std::size_t candidate = 0;  // index into the candidates given
  int pool = -1;
  std::string reason;  // in words, when asked for (the service records it)
};

// A job's order of `pools` when it states none: by splitmix64(seed, job id, the pool's
// group), smallest first; pools of one group keep the caller's order. The simulator's
// groups are chip types (so a type's pools stay in the fleet's order, smaller nodes
// first where the fleet lists them so, which packs small jobs there) and its seed is
// --seed; the live service's groups are its pools and its seed 0, so a simulation with
// seed 0 and the service order a job's pools alike. `group_of[p]`: pool p's group (empty:
// every pool its own).
std::vector<int> tie_break_order(std::vector<int> pools, std::span<const int> group_of,
                                 std::uint64_t seed, std::int64_t job_id);

// The key of a waiting job under `policy`: higher priority first, then arrival rank (or,
// for sjf, its remaining run time on its fastest pool).
double order_key(Policy policy, std::int64_t priority, double arrival_rank, double best_seconds);

// The pool `candidate` would start on now under `policy`, or nullopt when no pool it may
// run on has room. `now` is the time deadlines are measured from; `explain` asks for the
// reason in words ("gpu-a: cheapest that meets the 6 h deadline; gpu-b 2.1x faster but
// 3.4x the price").
std::optional<Choice> choose_pool(Policy policy, const WaitingJob& candidate,
                                  std::span<const PoolTerms> pools, const Room& room, double now,
                                  bool explain);

// Which waiting job starts next, and where: the candidate first in key order that some
// pool has room for (fifo: the first candidate only, or nothing). `candidates` may be all
// waiting jobs, or any subset that contains, for every group of jobs that fit in the same
// places, its first in key order (the simulator passes such heads of its classes).
std::optional<Choice> choose_start(Policy policy, std::span<const WaitingJob* const> candidates,
                                   std::span<const PoolTerms> pools, const Room& room, double now,
                                   bool explain);

// A running job as preemption sees it.
struct RunningJob {
  std::size_t job = 0;
  int pool = -1;
  std::int64_t chips = 1, priority = 0;
  double started_s = 0;
};

struct PreemptionChoice {
  int pool = -1;
  std::vector<std::size_t> victims;  // indices into the running jobs given
  std::string reason;
};

// For a waiting candidate that no pool has room for: the running jobs of lower priority
// to preempt so that it can start, on the first of its pools (in choose_pool's order of
// the pools, all treated as having room) where preempting lower-priority jobs frees
// enough chips; the victims are the lowest priority first, the latest started first
// among equals (they lose the least work). nullopt when no pool can be freed that way.
std::optional<PreemptionChoice> choose_preemption(Policy policy, const WaitingJob& candidate,
                                                  std::span<const RunningJob> running,
                                                  std::span<const PoolTerms> pools,
                                                  const Room& room, double now);

}  // namespace loom::cluster
