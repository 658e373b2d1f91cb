// Reader: cluster::load_training_jobs, with the repository's catalog and the fleet the
// replay test uses (h100-sxm:16x8): each job's run time comes from the planner.
// Regressions: tests/fixtures/fuzz/training_jobs/ (the input file as it is; replayed by
// Jobs.FuzzFixturesGiveNamedErrors with the same catalog and fleet).
#include <optional>

#include "cluster/catalog/catalog.h"
#include "cluster/sched/fleet.h"
#include "cluster/sched/jobs.h"
#include "core/error.h"
#include "fuzz_common.h"

namespace {

std::optional<loom::cluster::Catalog> catalog;
std::optional<loom::cluster::Fleet> fleet;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Errors here are the setup's, not findings: let them terminate with their message.
  catalog = loom::cluster::Catalog::load(loom::fuzz::source_dir() + "/catalog");
  fleet = loom::cluster::parse_fleet("h100-sxm:16x8");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path =
      loom::fuzz::write_scratch("jobs.yaml", {reinterpret_cast<const char*>(data), size});
  try {
    (void)loom::cluster::load_training_jobs(path, *catalog, *fleet);
  } catch (const loom::Error&) {
  }
  return 0;
}
