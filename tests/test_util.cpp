#include "test_util.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_backend.h"
#include "backends/partial/partial_backend.h"
#include "core/error.h"
#include "dispatch/devices.h"

namespace loom::testing {

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
