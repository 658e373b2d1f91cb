// Reader: io::read_onnx_tensor (a serialised TensorProto: the input_N.pb / output_N.pb of
// an ONNX test folder, read by `loom onnx --test` and run_onnx_backend_test).
// Regressions: tests/fixtures/fuzz/onnx_tensor/ (the input file as it is).
#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "fuzz_common.h"
#include "io/onnx.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loom::fuzz::single_threaded();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path =
      loom::fuzz::write_scratch("input.pb", {reinterpret_cast<const char*>(data), size});
  try {
    loom::Tensor t = loom::io::read_onnx_tensor(path, loom::cpu::backend());
    (void)t.describe();
  } catch (const loom::Error&) {
  }
  loom::cpu::backend().release_cached_memory();
  return 0;
}
