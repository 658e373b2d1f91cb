// Reader: train::ShardedCheckpoint::open on a folder holding index.json and up to two shard
// files, then the load of every tensor it lists (what resuming from a sharded checkpoint
// does). A multi-file input: index.json, shard-00000.safetensors, shard-00001.safetensors
// (kFileSeparator between them; a part left out is no file).
// Regressions: tests/fixtures/fuzz/sharded_index/ (none yet).
#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "fuzz_common.h"
#include "train/sharded_checkpoint.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loom::fuzz::single_threaded();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const char* const kNames[] = {"index.json", "shard-00000.safetensors",
                                       "shard-00001.safetensors"};
  const std::vector<std::string> parts =
      loom::fuzz::split_files(loom::fuzz::bytes_of(data, size));
  for (std::size_t k = 0; k < 3; ++k)
    if (k < parts.size())
      loom::fuzz::write_scratch(kNames[k], parts[k]);
    else
      loom::fuzz::remove_scratch(kNames[k]);
  try {
    const loom::train::ShardedCheckpoint checkpoint =
        loom::train::ShardedCheckpoint::open(loom::fuzz::scratch_dir());
    for (const std::string& name : checkpoint.names())
      (void)checkpoint.load(name, loom::cpu::backend()).to_floats();
  } catch (const loom::Error&) {
  }
  loom::cpu::backend().release_cached_memory();
  return 0;
}
