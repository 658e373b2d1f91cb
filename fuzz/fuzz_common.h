// fuzz/fuzz_common.h — what every libFuzzer harness shares.
//
// A harness hands its input to one of Loom's readers. The readers take paths, so the
// input is written to a temporary file (one folder per process, reused every run) and the
// reader opens it. Every loom::Error is an expected outcome: a reader that refuses a
// hostile file with a named error is doing its job. Anything else is a finding: another
// exception type (it has no handler here, so it terminates *at its throw point* and the
// stack trace shows where it was thrown), a crash, a sanitizer report, a timeout, or an
// allocation past -rss_limit_mb / -malloc_limit_mb.
//
// Inputs that stand for several files (a catalog folder, an IDX image/label pair) hold
// them one after the other, separated by kFileSeparator; fuzz/unpack splits such an input
// back into files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::fuzz {

// Between the files of a multi-file input: a line no YAML/JSON/IDX file of the corpus
// holds (the fuzzer learns it from the comparisons and may create or break it).
inline constexpr std::string_view kFileSeparator = "\n--8<-- loom-fuzz-next-file --8<--\n";

// The input as a string.
inline std::string bytes_of(const std::uint8_t* data, std::size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// The parts of a multi-file input (at least one; an input without a separator is one part).
std::vector<std::string> split_files(std::string_view input);

// This process's scratch folder (created on first use, removed at exit).
const std::string& scratch_dir();

// Writes `bytes` to scratch_dir()/name and returns the path (the same path every run).
std::string write_scratch(const std::string& name, std::string_view bytes);

// Removes scratch_dir()/name if it exists (an optional file left out of this input).
void remove_scratch(const std::string& name);

// The repository root, for the fixed inputs some readers need beside the fuzzed one (the
// catalog, Gavel's throughput table): $LOOM_SOURCE_DIR, else the source tree this
// harness was built from.
std::string source_dir();

// Single-threaded kernels (OMP_NUM_THREADS=1 unless the caller set it): deterministic,
// and the fuzzer's one core is not shared with a thread pool.
void single_threaded();

}  // namespace loom::fuzz
