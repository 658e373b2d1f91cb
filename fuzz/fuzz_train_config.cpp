// Reader: train::TrainConfig::load_yaml, then finalize() (the cross-field checks `loom
// train CONFIG` runs next) and to_json() (which every training run records).
// Regressions: tests/fixtures/fuzz/train_config/ (the input file as it is).
#include "core/error.h"
#include "fuzz_common.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path =
      loom::fuzz::write_scratch("config.yaml", {reinterpret_cast<const char*>(data), size});
  try {
    loom::train::TrainConfig config;
    config.load_yaml(path);
    config.finalize();
    (void)config.to_json();
  } catch (const loom::Error&) {
  }
  return 0;
}
