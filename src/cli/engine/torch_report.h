// cli/engine/torch_report — `loom ops --torch_report FILE`: the coverage report a PyTorch
// script on the loom device writes at exit (LOOM_TORCH_REPORT=FILE, docs/pytorch.md), read
// back and shown as a table: every ATen op the script called, how many times, and how each
// call ran (natively on Loom's kernels, by decomposition, through Loom's CPU fallback or
// PyTorch's), with the time and the bytes copied.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::cli {

struct TorchOpCoverage {
  std::string op;  // "mm.out"
  std::uint64_t calls = 0, native = 0, decomposed = 0, loom_fallback = 0, pytorch_fallback = 0;
  double seconds = 0;
  std::uint64_t bytes_copied = 0;
};

struct TorchReport {
  std::string torch_version;
  std::vector<std::string> devices;  // Loom's devices, loom:0 first
  std::vector<TorchOpCoverage> ops;
};

// Reads and checks a report; a bad one is an error naming the file, the field, its value
// and what was expected.
TorchReport read_torch_report(const std::string& path);

// The table (or, with json, one object: the report's ops with each one's path) on stdout.
int print_torch_report(const std::string& path, bool json);

}  // namespace loom::cli
