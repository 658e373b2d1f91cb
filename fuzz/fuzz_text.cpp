// Reader: data::TextDataset::load (a UTF-8 text file, tokenised by character), then what
// training does with it: random windows (sample), the evaluation windows, and decoding.
// Regressions: tests/fixtures/fuzz/text/ (the input file as it is; that folder has no
// replay test yet -- see fuzz/README.md).
#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "data/text.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loom::fuzz::single_threaded();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path =
      loom::fuzz::write_scratch("input.txt", {reinterpret_cast<const char*>(data), size});
  try {
    const loom::data::TextDataset ds = loom::data::TextDataset::load(path);
    auto& cpu = loom::cpu::backend();
    constexpr std::int64_t kContext = 4, kBatch = 2;
    if (static_cast<std::int64_t>(ds.train().size()) > kContext)
      (void)ds.sample(ds.train(), kBatch, kContext, 7, cpu);
    (void)loom::data::eval_windows(ds.val(), kContext, kBatch, cpu);
    (void)ds.tokenizer().decode(ds.train());
    (void)ds.tokenizer().alphabet_utf8();
  } catch (const loom::Error&) {
  }
  loom::cpu::backend().release_cached_memory();
  return 0;
}
