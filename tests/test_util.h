// Helpers shared by the test suites: random tensors, comparisons, the backends to test.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/init.h"

namespace loom::testing {

// True in the AddressSanitizer/UndefinedBehaviorSanitizer build. Tests that train for many
// steps take fewer there: the sanitizers check memory and undefined behaviour, which a few
// steps exercise as fully as fifty, while the release build checks the numbers at length.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
#else
inline constexpr bool kSanitizedBuild = false;
#endif
// `release_steps`, or `sanitized_steps` in the sanitizer build.
constexpr int steps_for_build(int release_steps, int sanitized_steps) {
  return kSanitizedBuild ? sanitized_steps : release_steps;
}

// True when `device` is "cuda" and LOOM_CUDA_EMULATOR selects the CPU emulator. Its
// kernels run each GPU thread's code on the CPU, many times slower than the device: long
// runs there check the backend's host code, and take fewer steps or models.
bool cuda_emulated(const std::string& device);

Backend& cpu();
// Every backend available in this build and on this machine (the conformance suite
// runs each of them unchanged).
std::vector<Backend*> backends();
// Their names without the device index ("opencl:0" -> "opencl"), for parameterised tests,
// and the backend with that name.
std::vector<std::string> backend_names();
Backend& backend_named(const std::string& name);

Tensor random(const Shape& shape, nn::Rng& rng, float lo = -1.0f, float hi = 1.0f);
Tensor random_ids(const Shape& shape, std::int64_t limit, nn::Rng& rng);
// A tensor with `shape` whose storage is not contiguous (a transposed view).
Tensor non_contiguous(const Shape& shape, nn::Rng& rng);
// Values of any f32/bf16/f16/i32 tensor as doubles, in row-major order.
std::vector<double> values(const Tensor& t);

// Largest |a-b| / (atol + rtol |b|); <= 1 means within tolerance.
double worst_ratio(const std::vector<double>& a, const std::vector<double>& b, double rtol,
                   double atol);
// Normalised mean squared error sum (a-b)^2 / sum b^2 (ggml's measure for GEMM/reductions).
double nmse(const std::vector<double>& a, const std::vector<double>& b);

// The message of the loom::Error that f throws, or "" when it throws none.
std::string error_of(const std::function<void()>& f);
// The training losses recorded in OUT/metrics.jsonl, in step order.
std::vector<double> metric_losses(const std::string& out);

std::string source_dir();  // the repository root (tests read data/ and tests/fixtures/)
std::string temp_dir(const std::string& name);  // a fresh empty folder
// The hostile inputs kept for `reader` (the entries of tests/fixtures/fuzz/READER, files
// or folders, sorted): each one once crashed or misled a reader, and each must now give
// a named loom::Error.
std::vector<std::string> fuzz_inputs(const std::string& reader);

}  // namespace loom::testing
