#include "cluster/sched/gavel.h"

#include <bit>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace loom::cluster {

namespace {
constexpr std::size_t kN = 624, kM = 397;
constexpr std::uint32_t kMatrixA = 0x9908b0dfU, kUpper = 0x80000000U, kLower = 0x7fffffffU;
}  // namespace

PythonRandom::PythonRandom(std::uint32_t seed) {
  // init_genrand(19650218), then init_by_array({seed}): CPython's seeding of an int below 2^32.
  auto& mt = state_;
  mt[0] = 19650218U;
  for (std::size_t i = 1; i < kN; ++i)
    mt[i] = 1812433253U * (mt[i - 1] ^ (mt[i - 1] >> 30)) + static_cast<std::uint32_t>(i);
  const std::uint32_t key[1] = {seed};
  const std::size_t key_length = 1;
  std::size_t i = 1, j = 0;
  for (std::size_t k = kN > key_length ? kN : key_length; k; --k) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525U)) + key[j] +
            static_cast<std::uint32_t>(j);
    ++i;
    ++j;
    if (i >= kN) {
      mt[0] = mt[kN - 1];
      i = 1;
    }
    if (j >= key_length)
      j = 0;
  }
  for (std::size_t k = kN - 1; k; --k) {
    mt[i] =
        (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941U)) - static_cast<std::uint32_t>(i);
    ++i;
    if (i >= kN) {
      mt[0] = mt[kN - 1];
      i = 1;
    }
  }
  mt[0] = 0x80000000U;  // a non-zero initial state
  index_ = kN;
}

std::uint32_t PythonRandom::next_u32() {
  auto& mt = state_;
  auto twist = [&](std::size_t a, std::size_t b, std::size_t c) {
    const std::uint32_t y = (mt[a] & kUpper) | (mt[b] & kLower);
    mt[a] = mt[c] ^ (y >> 1) ^ ((y & 1U) ? kMatrixA : 0U);
  };
  if (index_ >= kN) {
    std::size_t k = 0;
    for (; k < kN - kM; ++k)
      twist(k, k + 1, k + kM);
    for (; k < kN - 1; ++k)
      twist(k, k + 1, k + kM - kN);
    twist(kN - 1, 0, kM - 1);
    index_ = 0;
  }
  std::uint32_t y = mt[index_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U;
  y ^= y >> 18;
  return y;
}

double PythonRandom::random() {
  const std::uint32_t a = next_u32() >> 5, b = next_u32() >> 6;  // 27 and 26 bits
  return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

std::uint32_t PythonRandom::randbelow(std::uint32_t n) {
  check(n >= 1, "PythonRandom::randbelow: n must be at least 1");
  const int bits = std::bit_width(n);  // n.bit_length()
  std::uint32_t r = next_u32() >> (32 - bits);
  while (r >= n)
    r = next_u32() >> (32 - bits);
  return r;
}

namespace {
// Gavel's key "('ResNet-18 (batch size 16)', 1)" -> (job type, scale factor).
bool parse_key(const std::string& key, std::string& type, std::int64_t& scale) {
  const std::size_t close = key.rfind("', ");
  if (key.rfind("('", 0) != 0 || close == std::string::npos || close < 2 || key.back() != ')')
    return false;
  type = key.substr(2, close - 2);
  const std::string digits = key.substr(close + 3, key.size() - close - 4);
  if (digits.empty() || digits.size() > 6 ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    return false;
  scale = std::stoll(digits);
  return scale > 0;
}
}  // namespace

GavelThroughputs GavelThroughputs::load(const std::string& path) {
  std::ifstream file(path);
  check(file.good(), path + ": cannot open the throughput table");
  nlohmann::json table;
  try {
    table = nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": malformed JSON: " + e.what());
  }
  check(table.is_object(), path + ": expected an object of worker types");
  GavelThroughputs t;
  for (const auto& [worker, entries] : table.items()) {
    if (worker.find("_unconsolidated") != std::string::npos)
      continue;
    check(entries.is_object(), path + ": worker '" + worker + "': expected an object of jobs");
    t.worker_types.push_back(worker);
    for (const auto& [key, value] : entries.items()) {
      std::string type;
      std::int64_t scale = 0;
      check(parse_key(key, type, scale), path + ": worker '" + worker + "': key '" + key +
                                             "' is not ('<job type>', <scale factor>)");
      if (value.is_object() && value.contains("null") && value["null"].is_number()) {
        const double rate = value["null"].get<double>();
        check(std::isfinite(rate) && rate >= 0, path + ": worker '" + worker + "': " + key +
                                                    ": 'null' is " + value["null"].dump() +
                                                    ", expected steps/s >= 0");
        if (rate > 0)
          t.steps_per_s[{type, scale}][worker] = rate;
      }
    }
  }
  return t;
}

const std::map<std::string, double>* GavelThroughputs::find(const std::string& type,
                                                            std::int64_t scale) const {
  auto it = steps_per_s.find({type, scale});
  return it == steps_per_s.end() ? nullptr : &it->second;
}

const std::vector<GavelJobType>& gavel_job_table() {
  static const std::vector<GavelJobType> table = [] {
    std::vector<GavelJobType> t;
    for (int batch : {16, 32, 64, 128, 256})
      t.push_back({"ResNet-18 (batch size " + std::to_string(batch) + ")", true});
    for (int batch : {16, 32, 64, 128})
      t.push_back({"ResNet-50 (batch size " + std::to_string(batch) + ")", true});
    for (int batch : {16, 32, 64, 128, 256})
      t.push_back({"Transformer (batch size " + std::to_string(batch) + ")", true});
    for (int batch : {5, 10, 20, 40, 80})
      t.push_back({"LM (batch size " + std::to_string(batch) + ")", true});
    for (int batch : {512, 1024, 2048, 4096, 8192})
      t.push_back({"Recommendation (batch size " + std::to_string(batch) + ")", false});
    t.push_back({"A3C", false});
    t.push_back({"CycleGAN", false});
    return t;
  }();
  return table;
}

GavelContinuousJobs::GavelContinuousJobs(const GavelThroughputs& table,
                                         GavelContinuousOptions options)
    : table_(table),
      options_(std::move(options)),
      jobs_(options_.seed + 2),
      arrivals_(options_.seed + 3) {
  check(std::isfinite(options_.jobs_per_hour) && options_.jobs_per_hour > 0,
        "Gavel continuous workload: the input rate must be positive jobs/hour");
  for (const GavelJobType& type : gavel_job_table())
    for (std::int64_t scale : {1, 2, 4, 8})
      if (scale == 1 || (type.distributed && options_.multi_gpu)) {
        const auto* rates = table_.find(type.name, scale);
        check(rates && rates->count(options_.reference_worker),
              "Gavel continuous workload: the throughput table has no " +
                  options_.reference_worker + " rate for ('" + type.name + "', " +
                  std::to_string(scale) + ")");
      }
}

Job GavelContinuousJobs::next() {
  Job job;
  job.id = next_id_++;
  if (job.id > 0)
    last_arrival_s_ += -std::log(1.0 - arrivals_.random()) * 3600.0 / options_.jobs_per_hour;
  job.arrival_s = last_arrival_s_;
  const double r = jobs_.uniform(0, 1);
  std::int64_t scale = 1;
  if (r >= 0.7 && r <= 0.8)
    scale = 2;
  else if (r >= 0.8 && r <= 0.95)
    scale = 4;
  else if (r >= 0.95)
    scale = 8;
  if (!options_.multi_gpu)
    scale = 1;
  const double duration_s = jobs_.random() >= 0.8 ? 60 * std::pow(10.0, jobs_.uniform(3, 4))
                                                  : 60 * std::pow(10.0, jobs_.uniform(1.5, 3));
  const std::vector<GavelJobType>& types = gavel_job_table();
  const GavelJobType* type = nullptr;
  do
    type = &types[jobs_.randbelow(static_cast<std::uint32_t>(types.size()))];
  while (scale > 1 && !type->distributed);
  job.name = type->name;
  job.chips = scale;
  const std::map<std::string, double>& rates = *table_.find(type->name, scale);
  job.steps = duration_s * rates.at(options_.reference_worker);
  for (const auto& [worker, rate] : rates)
    job.seconds_on[worker] = job.steps / rate;
  return job;
}

}  // namespace loom::cluster
