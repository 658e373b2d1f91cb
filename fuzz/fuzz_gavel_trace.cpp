// Reader: cluster::load_gavel_trace (a Gavel trace, TSV), with a fixed small throughput
// table: data/traces/gavel/simulation_throughputs.json reduced, at start-up, to each
// consolidated worker's "null" (alone) throughput per (job type, scale factor) -- the only
// figures the reader uses -- so each run parses 16 KB of JSON instead of 1.2 MB.
// Regressions: tests/fixtures/fuzz/gavel/ (the input file as it is; the replay test uses
// the full table, which gives the same rates).
#include <fstream>
#include <nlohmann/json.hpp>

#include "cluster/sched/jobs.h"
#include "core/error.h"
#include "fuzz_common.h"

namespace {

std::string throughputs_path;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string full =
      loom::fuzz::source_dir() + "/data/traces/gavel/simulation_throughputs.json";
  std::ifstream in(full);
  nlohmann::json table = nlohmann::json::parse(in);  // a setup error terminates, loudly
  nlohmann::json small = nlohmann::json::object();
  for (const auto& [worker, entries] : table.items()) {
    if (worker.find("_unconsolidated") != std::string::npos)
      continue;
    for (const auto& [key, value] : entries.items())
      if (value.contains("null"))
        small[worker][key] = {{"null", value["null"]}};
  }
  throughputs_path = loom::fuzz::write_scratch("throughputs.json", small.dump(1));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path =
      loom::fuzz::write_scratch("input.trace", {reinterpret_cast<const char*>(data), size});
  try {
    std::int64_t extrapolated = 0;
    (void)loom::cluster::load_gavel_trace(path, throughputs_path, &extrapolated);
  } catch (const loom::Error&) {
  }
  return 0;
}
