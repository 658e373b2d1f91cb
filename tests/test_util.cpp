#include "test_util.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_backend.h"
#include "backends/partial/partial_backend.h"
#include "core/error.h"
#include "dispatch/devices.h"

namespace loom::testing {

namespace {

// Each test process gets kernel caches of its own: $XDG_CACHE_HOME, where both PoCL's
// kernel cache (pocl/kcache) and Loom's OpenCL binaries (loom/opencl) live, is set to
// BUILD/tests/test-cache/EXE.FILTER (the folder of the test executable, then its name and
// its --gtest_filter: CTest runs each test as its own process with its own filter). Two
// tests running side by side never share a cache, so one cannot read what another is
// writing, nor find an entry a killed process left half-made.
// A new folder starts as links to the files of test-cache/seed, which the CTest fixture
// `opencl_kernel_cache_seed` fills before any test starts (tests/kernel_cache_seed.sh) and
// no test writes: without it each test process would compile Loom's OpenCL program again
// (about 4 s of PoCL's compiler; 0.2 s from the seed). The folder persists between runs of
// the same test, and gains links to the seed's new files at each start. Set before any static initializer of the executable runs (priority
// 101), as the test list itself may open the OpenCL devices (backend_names() in
// INSTANTIATE_TEST_SUITE_P).
__attribute__((constructor(101))) void use_a_kernel_cache_of_this_tests_own() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec)
    return;
  std::string args;
  if (std::ifstream cmdline{"/proc/self/cmdline", std::ios::binary})
    args.assign(std::istreambuf_iterator<char>(cmdline), std::istreambuf_iterator<char>());
  std::string which = "all";  // no filter: every test in one process
  std::size_t at = 0;
  for (std::size_t end; (end = args.find('\0', at)) != std::string::npos; at = end + 1) {
    const std::string arg = args.substr(at, end - at);
    if (arg.rfind("--gtest_filter=", 0) == 0)
      which = arg.substr(15);
    else if (arg == "--gtest_list_tests")
      which = "list";
  }
  // A readable name, and the filter's hash so two filters that read alike stay apart.
  std::string name = exe.filename().string() + ".";
  for (char c : which.substr(0, 120))
    name += std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.' ? c : '_';
  name += "." + std::to_string(std::hash<std::string>{}(which) % 1000003);
  const fs::path caches = exe.parent_path() / "test-cache";
  const fs::path dir = caches / name;
  if (!fs::exists(dir, ec)) {
    // Copied into a temporary folder, then renamed: a copy cut short is never taken for
    // a cache.
    const fs::path partial = caches / (name + ".copying." + std::to_string(::getpid()));
    fs::create_directories(partial, ec);
    // Hard links: the seed may hold the kernels of a whole earlier suite (tens of MB), and
    // its files are read-only (both caches replace a file by renaming a new one over it).
    if (fs::exists(caches / "seed", ec)) {
      fs::copy(caches / "seed", partial,
               fs::copy_options::recursive | fs::copy_options::create_hard_links, ec);
      if (ec)  // another file system: copies
        fs::copy(caches / "seed", partial,
                 fs::copy_options::recursive | fs::copy_options::overwrite_existing, ec);
    }
    fs::rename(partial, dir, ec);
    if (ec)
      fs::remove_all(partial, ec);
  } else if (fs::exists(caches / "seed", ec)) {
    // A folder from an earlier run: links to what the seed gained since (a changed OpenCL
    // program's kernels), so the test does not compile them again for itself.
    fs::copy(caches / "seed", dir,
             fs::copy_options::recursive | fs::copy_options::create_hard_links |
                 fs::copy_options::skip_existing,
             ec);
  }
  if (fs::is_directory(dir, ec))
    ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
}

}  // namespace

bool cuda_emulated(const std::string& device) {
  const char* emulator = std::getenv("LOOM_CUDA_EMULATOR");
  return device == "cuda" && emulator != nullptr && *emulator != '\0' &&
         std::string(emulator) != "0";
}

Backend& cpu() {
  return cpu::backend();
}

std::vector<Backend*> backends() {
  std::vector<Backend*> all;
  for (const std::string& name : dispatch::device_names())
    all.push_back(&dispatch::device(name));
  return all;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (Backend* b : backends()) {
    std::string name(b->name());
    names.push_back(name.substr(0, name.find(':')));
  }
  return names;
}

Backend& backend_named(const std::string& name) {
  for (Backend* b : backends())
    if (std::string(b->name()).rfind(name, 0) == 0)
      return *b;
  throw Error("no backend named " + name);
}

Tensor random(const Shape& shape, nn::Rng& rng, float lo, float hi) {
  std::vector<float> v(shape_numel(shape));
  for (float& x : v)
    x = lo + static_cast<float>(rng.uniform()) * (hi - lo);
  return Tensor::from_floats(shape, v, cpu());
}

Tensor random_ids(const Shape& shape, std::int64_t limit, nn::Rng& rng) {
  std::vector<std::int32_t> v(shape_numel(shape));
  for (auto& x : v)
    x = static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(limit));
  return Tensor::from_ints(shape, v, cpu());
}

Tensor non_contiguous(const Shape& shape, nn::Rng& rng) {
  if (shape.empty())
    return random(shape, rng);
  if (shape.size() == 1)
    return random({shape[0], 2}, rng).select(1, 0);  // stride 2
  Shape swapped = shape;
  std::swap(swapped[swapped.size() - 1], swapped[swapped.size() - 2]);
  return random(swapped, rng).transpose(-1, -2);
}

std::vector<double> values(const Tensor& t) {
  Tensor host = t.to(cpu());
  std::vector<double> out(host.numel());
  for (std::int64_t i = 0; i < host.numel(); ++i) {
    switch (host.dtype()) {
      case DType::f32:
        out[i] = host.data<float>()[i];
        break;
      case DType::bf16:
        out[i] = bf16_to_float(host.data<std::uint16_t>()[i]);
        break;
      case DType::f16:
        out[i] = f16_to_float(host.data<std::uint16_t>()[i]);
        break;
      case DType::i32:
        out[i] = host.data<std::int32_t>()[i];
        break;
      default:
        out[i] = NAN;
    }
  }
  return out;
}

double worst_ratio(const std::vector<double>& a, const std::vector<double>& b, double rtol,
                   double atol) {
  if (a.size() != b.size())
    return INFINITY;
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i]))
      return INFINITY;
    if (std::isnan(a[i]))
      continue;
    // Only the same infinity matches: against an infinite b the ratio below is inf / inf =
    // NaN, which std::max would drop, passing any value.
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i])
        return INFINITY;
      continue;
    }
    worst = std::max(worst, std::abs(a[i] - b[i]) / (atol + rtol * std::abs(b[i])));
  }
  return worst;
}

double nmse(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size())
    return INFINITY;
  double err = 0.0, ref = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err += (a[i] - b[i]) * (a[i] - b[i]);
    ref += b[i] * b[i];
  }
  return ref > 0 ? err / ref : err;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<double> metric_losses(const std::string& out) {
  std::vector<double> v;
  std::ifstream f(out + "/metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss"))
      v.push_back(j["loss"]);
  }
  return v;
}

std::string source_dir() {
  const char* dir = std::getenv("LOOM_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

std::vector<std::string> fuzz_inputs(const std::string& reader) {
  std::vector<std::string> paths;
  for (const auto& entry :
       std::filesystem::directory_iterator(source_dir() + "/tests/fixtures/fuzz/" + reader))
    paths.push_back(entry.path().string());
  std::sort(paths.begin(), paths.end());
  return paths;
}

std::string temp_dir(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path dir =
      fs::temp_directory_path() / ("loom-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

}  // namespace loom::testing
