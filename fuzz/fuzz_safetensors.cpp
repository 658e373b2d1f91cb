// Reader: io::SafetensorsFile::read, then load_f32 of every floating-point entry (what a
// checkpoint load or `--init` does with each tensor).
// Regressions: tests/fixtures/fuzz/safetensors/ (the input file as it is).
#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "fuzz_common.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loom::fuzz::single_threaded();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path =
      loom::fuzz::write_scratch("input.safetensors", {reinterpret_cast<const char*>(data), size});
  try {
    loom::io::SafetensorsFile file = loom::io::SafetensorsFile::read(path);
    for (const loom::io::SafetensorsEntry& e : file.entries()) {
      try {
        loom::Tensor t = file.load_f32(e, loom::cpu::backend());
        (void)t.to_floats();
      } catch (const loom::Error&) {
        // integer entries: "expected a floating-point dtype"
      }
    }
  } catch (const loom::Error&) {
  }
  loom::cpu::backend().release_cached_memory();
  return 0;
}
