#include "core/planned_layout.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace loom::contract {

std::string PlannedLayout::describe() const {
  return "tp " + std::to_string(tp) + " x pp " + std::to_string(pp) + " x dp " +
         std::to_string(dp) + (cp > 1 ? " x cp " + std::to_string(cp) : "");
}

PlannedLayout parse_planned_layout(std::string_view text, const std::string& source) {
  std::string_view line;
  while (!text.empty()) {
    const std::size_t end = std::min(text.find('\n'), text.size());
    line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    if (line.find_first_not_of(" \t\r") != std::string_view::npos)
      break;
    line = {};
  }
  check(!line.empty(), source + ": no layout (expected a line of `loom plan --json`)");
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  check(!j.is_discarded() && j.is_object(),
        source + ": the first line is not a JSON object (expected a line of `loom plan --json`)");
  auto count = [&](const char* field, bool required, std::int64_t fallback) -> std::int64_t {
    if (!j.contains(field)) {
      check(!required,
            source + ": field '" + field + "' is missing (a layout of `loom plan --json` has it)");
      return fallback;
    }
    const nlohmann::json& v = j[field];
    check(v.is_number_integer() &&
              v.get<std::int64_t>() >= (std::string_view(field) == "zero" ? 0 : 1),
          source + ": field '" + field + "' = " + v.dump() +
              ", expected a whole number of at least " +
              (std::string_view(field) == "zero" ? "0" : "1"));
    return v.get<std::int64_t>();
  };
  PlannedLayout l;
  l.tp = count("tp", true, 1);
  l.pp = count("pp", true, 1);
  l.dp = count("dp", true, 1);
  l.ep = count("ep", false, 1);
  l.cp = count("cp", false, 1);
  l.micro_batch = count("micro_batch", true, 1);
  l.global_batch = count("global_batch", true, 1);
  l.seq = count("seq", true, 1);
  l.interleave = count("interleave", false, 1);
  l.zero = static_cast<int>(count("zero", false, 0));
  if (j.contains("recompute")) {
    check(j["recompute"].is_string(), source + ": field 'recompute' = " + j["recompute"].dump() +
                                          ", expected none, selective or full");
    l.recompute = j["recompute"].get<std::string>();
  }
  if (j.contains("stage_layers") && !j["stage_layers"].is_null()) {
    const nlohmann::json& s = j["stage_layers"];
    bool valid = s.is_array();
    for (const nlohmann::json& n : valid ? s : nlohmann::json::array())
      valid = valid && n.is_number_integer() && n.get<std::int64_t>() >= 0;
    check(valid, source + ": field 'stage_layers' = " + s.dump() +
                     ", expected a list of layer counts, one per stage");
    l.stage_layers = s.get<std::vector<std::int64_t>>();
  }
  return l;
}

std::string engine_refusal(const PlannedLayout& l, std::int64_t kv_heads) {
  auto n = [](std::int64_t v) { return std::to_string(v); };
  if (l.ep > 1)
    return "ep = " + n(l.ep) + ": expert parallelism is not built in loom train";
  if (l.cp > 1)
    return "cp = " + n(l.cp) + ": context parallelism is not built in loom train";
  if (l.interleave > 1)
    return "interleave = " + n(l.interleave) +
           ": the interleaved pipeline schedule (virtual stages) is not built in loom train";
  if (l.recompute != "none")
    return "recompute = " + l.recompute + ": activation recomputation is not built in loom train";
  if (l.zero >= 2)
    return "zero = " + n(l.zero) +
           ": ZeRO stages 2 and 3 are not built in loom train (1: the sharded optimizer state)";
  if (kv_heads % l.tp != 0 && l.tp % kv_heads != 0)
    return "tp = " + n(l.tp) + ": the model's " + n(kv_heads) +
           " key/value heads do not divide among the ranks, nor the ranks among the heads (each "
           "head replicated on tp / kv_heads ranks)";
  if (l.global_batch % (l.dp * l.micro_batch) != 0)
    return "global_batch = " + n(l.global_batch) + " does not divide into dp = " + n(l.dp) +
           " x micro_batch = " + n(l.micro_batch);
  if (l.pp == 1 && l.global_batch != l.dp * l.micro_batch)
    return "micro_batch = " + n(l.micro_batch) + " with pp = 1 and dp = " + n(l.dp) +
           ": several micro-batches without pipeline stages (gradient accumulation) are not built "
           "in loom train; expected micro_batch = global_batch / dp = " +
           n(l.global_batch / l.dp);
  if (l.pp > 1 && !l.stage_layers.empty() &&
      l.stage_layers.size() != static_cast<std::size_t>(l.pp))
    return "stage_layers lists " + n(static_cast<std::int64_t>(l.stage_layers.size())) +
           " stages for pp = " + n(l.pp);
  return "";
}

}  // namespace loom::contract
