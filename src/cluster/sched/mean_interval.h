// cluster/sched/mean_interval — the mean of results over seeds with a 95% confidence interval
// (Student's t), as the fleet commands report them.
#pragma once

#include <cmath>
#include <cstddef>
#include <iterator>
#include <vector>

namespace loom::cluster {

struct MeanInterval {
  double mean = 0;
  double half = 0;  // half-width of the two-sided 95% interval; 0 for fewer than 2 values
};

// Student's t for a two-sided 95% interval with n - 1 degrees of freedom (n <= 31; the
// normal 1.96 beyond).
inline double student_t95(std::size_t n) {
  static const double table[] = {0,     12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365,
                                 2.306, 2.262,  2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
                                 2.120, 2.110,  2.101, 2.093, 2.086, 2.080, 2.074, 2.069,
                                 2.064, 2.060,  2.056, 2.052, 2.048, 2.045, 2.042};
  return n >= 1 && n - 1 < std::size(table) ? table[n - 1] : 1.96;
}

// mean +/- t * s / sqrt(n), s the sample standard deviation.
inline MeanInterval mean_interval(const std::vector<double>& values) {
  MeanInterval m;
  if (values.empty())
    return m;
  for (double v : values)
    m.mean += v / static_cast<double>(values.size());
  if (values.size() < 2)
    return m;
  double var = 0;
  for (double v : values)
    var += (v - m.mean) * (v - m.mean) / static_cast<double>(values.size() - 1);
  m.half = student_t95(values.size()) * std::sqrt(var / static_cast<double>(values.size()));
  return m;
}

}  // namespace loom::cluster
