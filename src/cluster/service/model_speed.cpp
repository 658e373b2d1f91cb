#include "cluster/service/model_speed.h"

#include <algorithm>
#include <cstdio>

#include "cluster/perf/perf.h"
#include "core/job_contract.h"

namespace loom::service {

namespace {
// A positive integer field of the description, or nullopt.
std::optional<std::int64_t> whole(const nlohmann::json& described, const char* field) {
  auto it = described.find(field);
  if (it == described.end() || !it->is_number_integer())
    return std::nullopt;
  const auto v = it->get<std::int64_t>();
  return v > 0 ? std::optional(v) : std::nullopt;
}
}  // namespace

ModelSpeed model_step_time(const nlohmann::json& described, std::uint64_t launches,
                           const cluster::Chip& chip) {
  ModelSpeed out;
  if (!described.is_object()) {
    out.basis = "not a transformer: the performance model does not apply";
    return out;
  }
  const std::string precision = described.value(contract::record::kPrecision, "");
  if (precision != "bf16") {
    out.basis = "performance model of " + chip.id + " does not apply to " + precision +
                " products (the catalog gives bf16 and fp8 rates)";
    return out;
  }
  cluster::Model m;
  m.id = "job";
  namespace record = contract::record;
  const auto layers = whole(described, record::kLayers), hidden = whole(described, record::kHidden),
             heads = whole(described, record::kHeads), ffn = whole(described, record::kFfn),
             vocab = whole(described, record::kVocab), seq = whole(described, record::kSeq),
             batch = whole(described, record::kBatch);
  if (!layers || !hidden || !heads || !ffn || !vocab || !seq || !batch) {
    out.basis = "the probe's transformer description is incomplete";
    return out;
  }
  m.layers = *layers;
  m.hidden = *hidden;
  m.heads = m.kv_heads = *heads;
  m.ffn = *ffn;
  m.vocab = *vocab;
  m.seq = *seq;
  cluster::Layout layout;
  layout.micro_batch = layout.global_batch = *batch;
  layout.seq = *seq;
  layout.recompute = cluster::Recompute::none;
  layout.zero = 0;
  cluster::Software software;
  software.flash_attention = false;  // Loom's attention writes the score matrices
  software.sequence_parallel = false;
  software.overlap_dp = false;
  if (std::string bad = cluster::check_layout(m, chip, layout); !bad.empty()) {
    out.basis = "performance model of " + chip.id + ": " + bad;
    return out;
  }
  const cluster::Estimate e = cluster::estimate(m, chip, layout, software);
  if (!e.feasible) {
    out.basis = "performance model of " + chip.id + ": " + e.reason;
    return out;
  }
  const double floor = static_cast<double>(launches) * kOpLaunchSeconds;
  out.step_s = std::max(e.step_time_s, floor);
  out.basis = "performance model of " + chip.id;
  if (floor > e.step_time_s) {
    char text[96];
    std::snprintf(text, sizeof text, " (launch-bound: %llu op launches x %.0f us)",
                  static_cast<unsigned long long>(launches), kOpLaunchSeconds * 1e6);
    out.basis += text;
  }
  return out;
}

}  // namespace loom::service
