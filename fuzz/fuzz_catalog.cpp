// Readers: cluster::Catalog::load (a catalog folder: chips.yaml, models.yaml and the
// optional systems.yaml) and cluster::validate (a published-runs file -- the calibration
// runs, catalog/calibration/calibration-runs.yaml -- with the optional software.yaml
// beside it).
//
// One input holds up to five files, separated by kFileSeparator (fuzz_common.h), in this
// order: chips.yaml, models.yaml, systems.yaml, calibration-runs.yaml, software.yaml. An
// optional file that is absent or empty is not written. The catalog is loaded from the
// first three, then asked what the planner asks of it (each system's chip, each chip's
// scale-up domain, each model's parameter counts). The runs file, when present, is
// validated against the repository's catalog (as the replay test does), so a finding in
// either reader replays on its own.
// Regressions (split the input with fuzz/unpack catalog INPUT DIR):
//   catalog files  -> a folder tests/fixtures/fuzz/catalog/NAME/ with chips.yaml, models.yaml
//                     (and systems.yaml);
//   runs file      -> tests/fixtures/fuzz/plan_runs/NAME.yaml (software.yaml beside a runs
//                     file is not replayed there: a software.yaml finding needs a test).
#include <filesystem>
#include <optional>

#include "cluster/catalog/catalog.h"
#include "cluster/plan/plan.h"
#include "core/error.h"
#include "fuzz_common.h"

namespace {

std::optional<loom::cluster::Catalog> repo_catalog;

void write_or_remove(const std::string& name, const std::vector<std::string>& parts,
                     std::size_t index) {
  if (index < parts.size() && !parts[index].empty())
    loom::fuzz::write_scratch(name, parts[index]);
  else
    loom::fuzz::remove_scratch(name);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::filesystem::create_directories(loom::fuzz::scratch_dir() + "/catalog");
  std::filesystem::create_directories(loom::fuzz::scratch_dir() + "/runs");
  repo_catalog = loom::cluster::Catalog::load(loom::fuzz::source_dir() + "/catalog");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<std::string> parts =
      loom::fuzz::split_files({reinterpret_cast<const char*>(data), size});
  // chips.yaml and models.yaml are always written (empty when the input has no such part).
  loom::fuzz::write_scratch("catalog/chips.yaml", parts[0]);
  loom::fuzz::write_scratch("catalog/models.yaml", parts.size() > 1 ? parts[1] : "");
  write_or_remove("catalog/systems.yaml", parts, 2);
  try {
    loom::cluster::Catalog catalog =
        loom::cluster::Catalog::load(loom::fuzz::scratch_dir() + "/catalog");
    for (const loom::cluster::System& system : catalog.systems()) {
      try {
        (void)loom::cluster::scaleup_domain_chips(catalog.chip_in_system(system.id));
      } catch (const loom::Error&) {
      }
    }
    for (const loom::cluster::Chip& chip : catalog.chips()) {
      try {
        (void)loom::cluster::scaleup_domain_chips(chip);
      } catch (const loom::Error&) {
      }
    }
    for (const loom::cluster::Model& model : catalog.models()) {
      (void)model.total_params();
      (void)model.active_params();
    }
  } catch (const loom::Error&) {
  }
  if (parts.size() > 3 && !parts[3].empty()) {
    const std::string runs = loom::fuzz::write_scratch("runs/calibration-runs.yaml", parts[3]);
    write_or_remove("runs/software.yaml", parts, 4);
    try {
      (void)loom::cluster::validate(*repo_catalog, runs);
    } catch (const loom::Error&) {
    }
  }
  return 0;
}
