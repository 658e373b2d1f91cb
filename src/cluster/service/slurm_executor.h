// cluster/service/slurm_executor — a pool that is a Slurm partition: each attempt is a
// batch job on the pool's cluster (its own slurm.conf: one service may route across several
// clusters, "sites"), asking for the pool's typed GRES (--gres=gpu:h100:1).
//
// - launch: `sbatch --parsable` of a script that execs `loom fleet supervise`, named
//   loom-JOB-ATTEMPT; before submitting, `squeue --name` looks for that name, so a launch
//   repeated after a crash finds the first submission instead of making a second.
// - probe: the job's state from `squeue -t all`; once it has ended, the supervisor's exit
//   record (the job's folder is shared) gives the status; a job Slurm no longer knows and
//   that left no record was lost.
// - stop: `scancel --signal=TERM --full` reaches the supervisor and the training process,
//   which checkpoints and exits 75.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cluster/service/executor.h"

namespace loom::service {

class SlurmExecutor : public Executor {
 public:
  explicit SlurmExecutor(std::string loom) : loom_(std::move(loom)) {}
  std::int64_t launch(const PoolSpec& pool, const AttemptFiles& files,
                      const std::vector<std::string>& command) override;
  AttemptStatus probe(const PoolSpec& pool, const AttemptFiles& files,
                      std::optional<std::int64_t> handle) override;
  void stop(const PoolSpec& pool, std::int64_t handle) override;

  // The batch job's name for an attempt: what finds it again after a crash.
  static std::string job_name(const AttemptFiles& files);

 private:
  std::string loom_;
};

// Runs `argv` (no shell) with `env` added to the environment; returns its exit status and
// fills `out` with its standard output (and `err` with its standard error).
int run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                std::string& out, std::string& err);

// One executor per kind, shared by the pools of that kind.
class Executors : public Executor {
 public:
  explicit Executors(const std::string& loom) : local_(loom), slurm_(loom) {}
  std::int64_t launch(const PoolSpec& pool, const AttemptFiles& files,
                      const std::vector<std::string>& command) override {
    return of(pool).launch(pool, files, command);
  }
  AttemptStatus probe(const PoolSpec& pool, const AttemptFiles& files,
                      std::optional<std::int64_t> handle) override {
    return of(pool).probe(pool, files, handle);
  }
  void stop(const PoolSpec& pool, std::int64_t handle) override { of(pool).stop(pool, handle); }

 private:
  Executor& of(const PoolSpec& pool) {
    return pool.executor == "slurm" ? static_cast<Executor&>(slurm_) : local_;
  }
  LocalExecutor local_;
  SlurmExecutor slurm_;
};

}  // namespace loom::service
