// Reader: data::load_idx (an MNIST images file and its labels file, plain or gzip), then
// what training does with the set: normalisation and a batch of the first samples.
//
// One input holds both files, separated by kFileSeparator (fuzz_common.h): images first,
// labels second (an input without the separator is the images file, with an empty labels
// file).
// Regressions (split the input with fuzz/unpack idx INPUT DIR): the pair becomes
// tests/fixtures/fuzz/idx/NAME-images.idx and NAME-labels.idx.
#include <algorithm>
#include <numeric>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "data/idx.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loom::fuzz::single_threaded();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<std::string> parts =
      loom::fuzz::split_files({reinterpret_cast<const char*>(data), size});
  const std::string images = loom::fuzz::write_scratch("input-images.idx", parts[0]);
  const std::string labels =
      loom::fuzz::write_scratch("input-labels.idx", parts.size() > 1 ? parts[1] : "");
  try {
    loom::data::ImageSet set = loom::data::load_idx(images, labels);
    loom::data::normalize_mnist(set);
    const std::int64_t n = std::min<std::int64_t>(set.count, 4);
    std::vector<std::int64_t> order(static_cast<std::size_t>(set.count > 0 ? n : 0));
    std::iota(order.begin(), order.end(), 0);
    if (n > 0)
      (void)loom::data::image_batch(set, order, 0, n, loom::cpu::backend());
  } catch (const loom::Error&) {
  }
  loom::cpu::backend().release_cached_memory();
  return 0;
}
