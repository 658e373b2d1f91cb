#include "train/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace loom::train {

Progress::Progress(std::int64_t total_steps, bool enabled, std::int64_t log_every, bool visible)
    : total_(total_steps),
      terminal_(enabled && isatty(STDOUT_FILENO)),
      visible_(visible),
      log_every_(log_every) {}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0)
    return "?";
  auto s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%llds", s);
  return buf;
}

void Progress::update(std::int64_t step, double loss, double items_per_s, double step_seconds,
                      const std::string& unit) {
  if (!visible_)
    return;
  std::int64_t done = step + 1;
  double eta = static_cast<double>(total_ - done) * step_seconds;
  if (terminal_) {
    constexpr int kWidth = 24;
    int filled = static_cast<int>(kWidth * done / std::max<std::int64_t>(total_, 1));
    std::string bar(filled, '=');
    if (filled < kWidth)
      bar += '>' + std::string(kWidth - filled - 1, ' ');
    std::printf("\r\033[Kstep %lld/%lld [%s] loss %.4f | %.0f %s/s | ETA %s",
                static_cast<long long>(done), static_cast<long long>(total_), bar.c_str(), loss,
                items_per_s, unit.c_str(), format_duration(eta).c_str());
    std::fflush(stdout);
    line_open_ = true;
  } else if (done % log_every_ == 0 || done == total_ || step == 0) {
    std::printf("step %lld/%lld loss %.4f %.0f %s/s %.1f ms/step eta %s\n",
                static_cast<long long>(done), static_cast<long long>(total_), loss, items_per_s,
                unit.c_str(), step_seconds * 1e3, format_duration(eta).c_str());
    std::fflush(stdout);
  }
}

void Progress::message(const std::string& line) {
  if (!visible_)
    return;
  if (line_open_)
    std::printf("\r\033[K");
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  line_open_ = false;
}

void Progress::finish() {
  if (line_open_)
    std::printf("\n");
  line_open_ = false;
  std::fflush(stdout);
}

}  // namespace loom::train
