// cluster/sched/gavel — Gavel's workloads (Narayanan et al., OSDI 2020;
// stanford-futuredata/gavel), as its simulator draws them, so that Loom's simulator can be
// held against Gavel's published figures:
//   - PythonRandom: CPython's random.Random, bit for bit (Gavel draws with it, so a seed
//     gives Gavel's very jobs);
//   - GavelThroughputs: the measured throughput table (simulation_throughputs.json);
//   - GavelContinuousJobs: the "continuous" workload (scheduler/utils.py generate_job and
//     scheduler.py's Poisson arrivals), an endless stream.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cluster/sched/jobs.h"

namespace loom::cluster {

// CPython's random.Random (Modules/_randommodule.c, Lib/random.py): MT19937 seeded with
// init_by_array over the seed's 32-bit words; random() takes 27 + 26 bits of two draws;
// randbelow(n) draws bit_length(n) bits until below n.
class PythonRandom {
 public:
  explicit PythonRandom(std::uint32_t seed);
  std::uint32_t next_u32();  // genrand_uint32
  double random();           // [0, 1), 53 bits
  double uniform(double a, double b) { return a + (b - a) * random(); }
  std::uint32_t randbelow(std::uint32_t n);  // [0, n); n >= 1
  template <class T>
  void shuffle(std::vector<T>& items) {  // random.shuffle
    for (std::size_t i = items.size(); i-- > 1;)
      std::swap(items[i], items[randbelow(static_cast<std::uint32_t>(i + 1))]);
  }

 private:
  std::array<std::uint32_t, 624> state_{};
  std::size_t index_ = 624;
};

// Gavel's throughput table: for each (job type, scale factor), the steps per second the
// whole job runs alone on each worker type (the "null" entries of the consolidated
// worker types; the _unconsolidated ones and co-location pairs are not read).
struct GavelThroughputs {
  std::vector<std::string> worker_types;  // sorted
  std::map<std::pair<std::string, std::int64_t>, std::map<std::string, double>> steps_per_s;
  static GavelThroughputs load(const std::string& path);  // errors name file, key, value
  // The rates of (type, scale factor); nullptr when the table has none.
  const std::map<std::string, double>* find(const std::string& type, std::int64_t scale) const;
};

// Gavel's job table (scheduler/job_table.py), in its order: 26 job types; only ResNet-18,
// ResNet-50, Transformer and LM run distributed (scale factors 2, 4, 8).
struct GavelJobType {
  std::string name;
  bool distributed = false;
};
const std::vector<GavelJobType>& gavel_job_table();

// Gavel's continuous workload. Per job, from the job generator (Python random seeded
// seed + 2), in this order: the scale factor (uniform(0,1): [0.7, 0.8] -> 2, (0.8, 0.95]
// -> 4, above -> 8, else 1; drawn and ignored when multi_gpu is false), the duration on
// scale-factor V100s (random() >= 0.8: 60 x 10^uniform(3,4) s, else 60 x 10^uniform(1.5,3)
// s), and the type (choice over the table until one that may run at that scale factor).
// Steps = duration x the V100 throughput. Arrivals: the first at 0, then gaps of
// -ln(1 - random()) x 3600 / jobs_per_hour s, from a second generator (seed + 3).
struct GavelContinuousOptions {
  double jobs_per_hour = 1;
  bool multi_gpu = true;  // Gavel's continuous-multiple; false: continuous-single
  std::uint32_t seed = 0;
  std::string reference_worker = "v100";
};

class GavelContinuousJobs {
 public:
  GavelContinuousJobs(const GavelThroughputs& table, GavelContinuousOptions options);
  Job next();  // ids 0, 1, 2, ... in arrival order

 private:
  const GavelThroughputs& table_;
  GavelContinuousOptions options_;
  PythonRandom jobs_, arrivals_;
  double last_arrival_s_ = 0;
  std::int64_t next_id_ = 0;
};

}  // namespace loom::cluster
