// cluster/sched/simulator — a discrete-event simulation of a fleet running a job list
// under a scheduling policy: when each job starts, where, and what that does to job
// completion times, waiting and utilisation. Plain data in, a report out; no I/O.
//
// Placement: a job runs on one pool (one chip type). A job that fits in a node goes to
// the node it fills best (best fit, so whole nodes stay free for big jobs); a larger job
// takes whole free nodes; a job asking for a share of a chip (Job::milli) goes to the
// shared chip it fills best, or makes a free chip shared. Which waiting job starts, and on which
// pool, is the policy core's decision (policy.h), the same call the live fleet service makes. Jobs
// run to completion, except under las (preemptive) and node failures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cluster/sched/fleet.h"
#include "cluster/sched/jobs.h"
#include "cluster/sched/policy.h"

namespace loom::cluster {

struct Placement {
  int pool = -1;                  // index into fleet.pools where the job finished; -1: never ran
  double start_s = 0, end_s = 0;  // first start, final end
  int interruptions = 0;
};

// Node failures: each node fails at random (exponential times between failures, mean
// node_mtbf_h) and is back after repair_h. A job holding chips on a failed node stops,
// loses the work since its last checkpoint (one every checkpoint_min of its run time),
// and waits again in its place in the queue; each restart costs restart_min first (loading
// the checkpoint). node_mtbf_h = 0: no failures. Llama 3's 405B run (Dubey et al. 2024,
// section 3.3.4) saw 419 unexpected interruptions in 54 days on 2,048 nodes of 8 H100s:
// one per 6,334 node-hours.
struct Failures {
  double node_mtbf_h = 0;
  double repair_h = 2;
  double checkpoint_min = 30;
  double restart_min = 10;  // also what resuming a preempted job costs (las)
  std::uint64_t seed = 1;
};

// How often the preemptive policy (las) reconsiders who runs, between events.
struct Preemption {
  double quantum_min = 10;
};

struct PoolUse {
  std::string chip;  // the pool's label (Fleet::label)
  std::int64_t chips = 0, jobs = 0;
  double utilization = 0;  // allocated chip-seconds / (chips x makespan)
};

struct SimReport {
  Policy policy = Policy::fifo;
  std::int64_t jobs = 0, finished = 0;
  std::vector<std::string> rejected;   // jobs no pool of the fleet can ever run, with why
  std::vector<std::string> abandoned;  // jobs failures kept from finishing (10,000 interruptions)
  double mean_jct_s = 0, median_jct_s = 0, p99_jct_s = 0, mean_wait_s = 0, makespan_s = 0;
  std::vector<PoolUse> pools;
  std::vector<Placement> placements;  // indexed like the job list
  std::int64_t events = 0;            // arrivals, completions, failures and repairs processed
  // With failures: interruptions of running jobs, node failures in all, chip-hours of work
  // lost (rolled back to a checkpoint, or spent restarting), and goodput: the share of
  // held chip-hours that went into work that was kept.
  std::int64_t interruptions = 0, node_failures = 0, preemptions = 0;
  double lost_chip_hours = 0, goodput = 1;
};

// `tie_seed`: the seed of each job's order of the pools it may run on (tie_break_order in
// policy.h): where the policy finds pools alike, the job goes to the first of them with
// room in that order, not to the first pool of the fleet.
SimReport simulate(const Fleet& fleet, const std::vector<Job>& jobs, Policy policy,
                   const Failures& failures = {}, const Preemption& preemption = {},
                   std::uint64_t tie_seed = 0);

}  // namespace loom::cluster
