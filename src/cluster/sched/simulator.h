// cluster/sched/simulator — a discrete-event simulation of a fleet running a job list
// under a scheduling policy: when each job starts, where, and what that does to job
// completion times, waiting and utilisation. Plain data in, a report out; no I/O.
//
// Placement: a job runs on one pool (one chip type). A job that fits in a node goes to
// the node it fills best (best fit, so whole nodes stay free for big jobs); a larger job
// takes whole free nodes. Jobs run to completion (no preemption, no migration).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cluster/sched/fleet.h"
#include "cluster/sched/jobs.h"

namespace loom::cluster {

enum class Policy {
  fifo,      // arrival order; the first job waits until some pool has room (head-of-line blocking)
  backfill,  // arrival order, but a job that does not fit yet lets later ones start
  sjf,       // shortest job first (its run time on its fastest chip type), skipping as backfill
  fastest,   // arrival order with skipping; each job on the chip type, among those with room,
             // where it finishes soonest (heterogeneity-aware)
};
Policy parse_policy(const std::string& text);  // throws listing the policies
const char* policy_name(Policy policy);
std::vector<Policy> all_policies();

struct Placement {
  int pool = -1;  // index into fleet.pools; -1: never ran
  double start_s = 0, end_s = 0;
};

struct PoolUse {
  std::string chip;
  std::int64_t chips = 0, jobs = 0;
  double utilization = 0;  // allocated chip-seconds / (chips x makespan)
};

struct SimReport {
  Policy policy = Policy::fifo;
  std::int64_t jobs = 0, finished = 0;
  std::vector<std::string> rejected;  // jobs no pool of the fleet can ever run, with why
  double mean_jct_s = 0, median_jct_s = 0, p99_jct_s = 0, mean_wait_s = 0, makespan_s = 0;
  std::vector<PoolUse> pools;
  std::vector<Placement> placements;  // indexed like the job list
  std::int64_t events = 0;            // arrivals and completions processed
};

SimReport simulate(const Fleet& fleet, const std::vector<Job>& jobs, Policy policy);

}  // namespace loom::cluster
