// Reader: cluster::load_fleet (a fleet YAML file), and parse_fleet on the same bytes (the
// compact --fleet spec, "CHIP:NODESxCHIPS,..."), then what reports do with a fleet.
// Regressions: tests/fixtures/fuzz/fleet/ (the input file as it is).
#include "cluster/sched/fleet.h"
#include "core/error.h"
#include "fuzz_common.h"

namespace {

void use(const loom::cluster::Fleet& fleet) {
  (void)fleet.chips();
  (void)fleet.describe();
  for (std::size_t i = 0; i < fleet.pools.size(); ++i)
    (void)fleet.label(i);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes = loom::fuzz::bytes_of(data, size);
  const std::string path = loom::fuzz::write_scratch("fleet.yaml", bytes);
  try {
    use(loom::cluster::load_fleet(path));
  } catch (const loom::Error&) {
  }
  try {
    use(loom::cluster::parse_fleet(bytes));
  } catch (const loom::Error&) {
  }
  return 0;
}
