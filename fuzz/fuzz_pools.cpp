// Reader: service::load_pools (the fleet service's pools.yaml).
// Regressions: tests/fixtures/fuzz/pools/ (the input file as it is; that folder has no
// replay test yet -- see fuzz/README.md).
#include "cluster/service/pools.h"
#include "core/error.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path =
      loom::fuzz::write_scratch("pools.yaml", {reinterpret_cast<const char*>(data), size});
  try {
    (void)loom::service::load_pools(path);
  } catch (const loom::Error&) {
  }
  return 0;
}
