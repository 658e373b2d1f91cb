#include "cli/engine/torch_report.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace loom::cli {
namespace {

using nlohmann::json;

// The report's format (python/loom_torch/__init__.py writes it): {"schema_version": 1,
// "torch": "2.15.0", "devices": ["cpu", ...], "ops": [{"op", "calls", "native",
// "decomposed", "loom_fallback", "pytorch_fallback", "seconds", "bytes_copied"}, ...]}.
constexpr int kSchemaVersion = 1;

[[noreturn]] void bad(const std::string& path, const std::string& field, const json& value,
                      const std::string& expected) {
  throw Error(path + ": field '" + field + "' is " + value.dump() + ", expected " + expected);
}

const json& member(const std::string& path, const json& object, const std::string& prefix,
                   const char* name) {
  if (!object.contains(name))
    throw Error(path + ": field '" + prefix + name + "' is missing");
  return object.at(name);
}

std::uint64_t count(const std::string& path, const json& object, const std::string& prefix,
                    const char* name) {
  const json& v = member(path, object, prefix, name);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
    bad(path, prefix + name, v, "a non-negative integer");
  return v.get<std::uint64_t>();
}

// An op's path, the worst one any of its calls took: 0 native, 1 decomposed, 2 Loom's
// fallback, 3 PyTorch's; named as `loom ops` names Loom's own.
int path_index(const TorchOpCoverage& c) {
  return c.pytorch_fallback > 0 ? 3 : c.loom_fallback > 0 ? 2 : c.decomposed > 0 ? 1 : 0;
}
const char* path_of(const TorchOpCoverage& c) {
  static constexpr const char* kNames[4] = {"native", "decomposed", "loom fallback",
                                            "pytorch fallback"};
  return kNames[path_index(c)];
}

}  // namespace

TorchReport read_torch_report(const std::string& path) {
  std::ifstream in(path);
  check(in.good(), [&] { return path + ": cannot open the report (LOOM_TORCH_REPORT's file)"; });
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::parse_error& e) {
    throw Error(path + ": not JSON (" + e.what() + ")");
  }
  if (!j.is_object())
    throw Error(path + ": expected a JSON object (a LOOM_TORCH_REPORT file), found " +
                std::string(j.type_name()));
  const json& version = member(path, j, "", "schema_version");
  if (version != kSchemaVersion)
    bad(path, "schema_version", version, std::to_string(kSchemaVersion));
  TorchReport report;
  const json& torch = member(path, j, "", "torch");
  if (!torch.is_string())
    bad(path, "torch", torch, "PyTorch's version, a string");
  report.torch_version = torch.get<std::string>();
  const json& devices = member(path, j, "", "devices");
  if (!devices.is_array())
    bad(path, "devices", devices, "a list of Loom device names");
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (!devices[i].is_string())
      bad(path, "devices[" + std::to_string(i) + "]", devices[i], "a Loom device name");
    report.devices.push_back(devices[i].get<std::string>());
  }
  const json& ops = member(path, j, "", "ops");
  if (!ops.is_array())
    bad(path, "ops", ops, "a list of ATen ops");
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const std::string prefix = "ops[" + std::to_string(i) + "].";
    const json& o = ops[i];
    if (!o.is_object())
      bad(path, "ops[" + std::to_string(i) + "]", o, "an object");
    TorchOpCoverage c;
    const json& name = member(path, o, prefix, "op");
    if (!name.is_string() || name.get<std::string>().empty())
      bad(path, prefix + "op", name, "an ATen op's name");
    c.op = name.get<std::string>();
    c.calls = count(path, o, prefix, "calls");
    c.native = count(path, o, prefix, "native");
    c.decomposed = count(path, o, prefix, "decomposed");
    c.loom_fallback = count(path, o, prefix, "loom_fallback");
    c.pytorch_fallback = count(path, o, prefix, "pytorch_fallback");
    c.bytes_copied = count(path, o, prefix, "bytes_copied");
    if (c.native + c.decomposed + c.loom_fallback + c.pytorch_fallback != c.calls)
      bad(path, prefix + "calls", o.at("calls"),
          "the sum of native, decomposed, loom_fallback and pytorch_fallback (" +
              std::to_string(c.native + c.decomposed + c.loom_fallback + c.pytorch_fallback) + ")");
    const json& seconds = member(path, o, prefix, "seconds");
    if (!seconds.is_number() || seconds.get<double>() < 0)
      bad(path, prefix + "seconds", seconds, "a non-negative number");
    c.seconds = seconds.get<double>();
    report.ops.push_back(std::move(c));
  }
  return report;
}

int print_torch_report(const std::string& path, bool as_json) {
  TorchReport report = read_torch_report(path);
  // Fallbacks first, then by time: what to map next is at the top.
  std::stable_sort(report.ops.begin(), report.ops.end(), [](const auto& a, const auto& b) {
    const bool fa = a.loom_fallback + a.pytorch_fallback > 0,
               fb = b.loom_fallback + b.pytorch_fallback > 0;
    return fa != fb ? fa : a.seconds > b.seconds;
  });
  if (as_json) {
    json ops = json::array();
    for (const TorchOpCoverage& c : report.ops)
      ops.push_back({{"op", c.op},
                     {"path", path_of(c)},
                     {"calls", c.calls},
                     {"native", c.native},
                     {"decomposed", c.decomposed},
                     {"loom_fallback", c.loom_fallback},
                     {"pytorch_fallback", c.pytorch_fallback},
                     {"seconds", c.seconds},
                     {"bytes_copied", c.bytes_copied}});
    std::printf("%s\n",
                json{{"torch", report.torch_version}, {"devices", report.devices}, {"ops", ops}}
                    .dump()
                    .c_str());
    return 0;
  }
  std::string devices;
  for (std::size_t i = 0; i < report.devices.size(); ++i)
    devices += (i ? ", loom:" : "loom:") + std::to_string(i) + " " + report.devices[i];
  std::printf("ATen ops of a PyTorch script on the loom device (%s; torch %s; %s)\n", path.c_str(),
              report.torch_version.c_str(), devices.c_str());
  std::printf("%-40s %-17s %8s %8s %10s %8s %8s %10s %10s\n", "op", "path", "calls", "native",
              "decomposed", "loom fb", "torch fb", "ms", "MB copied");
  std::uint64_t by_path[4] = {0, 0, 0, 0}, calls = 0, fallback_calls = 0;
  for (const TorchOpCoverage& c : report.ops) {
    std::printf("%-40s %-17s %8llu %8llu %10llu %8llu %8llu %10.2f %10.2f\n", c.op.c_str(),
                path_of(c), static_cast<unsigned long long>(c.calls),
                static_cast<unsigned long long>(c.native),
                static_cast<unsigned long long>(c.decomposed),
                static_cast<unsigned long long>(c.loom_fallback),
                static_cast<unsigned long long>(c.pytorch_fallback), c.seconds * 1e3,
                static_cast<double>(c.bytes_copied) / 1e6);
    ++by_path[path_index(c)];
    calls += c.calls;
    fallback_calls += c.loom_fallback + c.pytorch_fallback;
  }
  std::printf(
      "%zu ATen ops, %llu calls: %llu ops native, %llu by decomposition, %llu through Loom's CPU "
      "fallback, %llu through PyTorch's (%llu calls fell back)\n",
      report.ops.size(), static_cast<unsigned long long>(calls),
      static_cast<unsigned long long>(by_path[0]), static_cast<unsigned long long>(by_path[1]),
      static_cast<unsigned long long>(by_path[2]), static_cast<unsigned long long>(by_path[3]),
      static_cast<unsigned long long>(fallback_calls));
  return 0;
}

}  // namespace loom::cli
