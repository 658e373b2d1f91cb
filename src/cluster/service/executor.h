// cluster/service/executor — how a pool runs an attempt of a job: launch it, tell whether
// it is alive, exited (with its status) or lost, and ask it to stop (SIGTERM: it
// checkpoints and exits 75). The local executor runs processes on this machine
// (attempts.h); tests drive the scheduler with an executor of their own.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cluster/service/attempts.h"
#include "cluster/service/pools.h"

namespace loom::service {

class Executor {
 public:
  virtual ~Executor() = default;
  // Starts the attempt; returns its handle (the local executor: the supervisor's pid).
  virtual std::int64_t launch(const PoolSpec& pool, const AttemptFiles& files,
                              const std::vector<std::string>& command) = 0;
  // `handle`: what launch() returned, when the store kept it.
  virtual AttemptStatus probe(const PoolSpec& pool, const AttemptFiles& files,
                              std::optional<std::int64_t> handle) = 0;
  virtual void stop(const PoolSpec& pool, std::int64_t handle) = 0;
};

// Processes on this machine: `loom fleet supervise` in its own session (attempts.h).
class LocalExecutor : public Executor {
 public:
  explicit LocalExecutor(std::string loom) : loom_(std::move(loom)) {}
  std::int64_t launch(const PoolSpec&, const AttemptFiles& files,
                      const std::vector<std::string>& command) override {
    return launch_attempt(loom_, files, command);
  }
  AttemptStatus probe(const PoolSpec&, const AttemptFiles& files,
                      std::optional<std::int64_t>) override {
    return probe_attempt(files);
  }
  void stop(const PoolSpec&, std::int64_t handle) override;

 private:
  std::string loom_;
};

}  // namespace loom::service
