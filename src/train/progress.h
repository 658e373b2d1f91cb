// train/progress.h — one status line: a redrawn progress bar on a terminal, plain log
// lines otherwise (CI logs, pipes).
#pragma once

#include <cstdint>
#include <string>

namespace loom::train {

class Progress {
 public:
  // `visible` false: prints nothing (the other ranks of a data-parallel job).
  Progress(std::int64_t total_steps, bool enabled, std::int64_t log_every, bool visible = true);
  // Reports a finished step: loss, tokens (or samples) per second, seconds per step.
  void update(std::int64_t step, double loss, double items_per_s, double step_seconds,
              const std::string& unit);
  // Prints a line that must not be overwritten (validation results).
  void message(const std::string& line);
  void finish();

 private:
  std::int64_t total_;
  bool terminal_;
  bool visible_ = true;
  std::int64_t log_every_;
  bool line_open_ = false;
};

std::string format_duration(double seconds);  // "1m23s"

}  // namespace loom::train
