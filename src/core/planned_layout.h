// core/planned_layout.h — a parallel layout as `loom plan --json` prints it (one JSON object
// a line) and `loom train --layout FILE` runs it: the contract between the planner and the
// engine (docs/parallel.md, "One way to say a layout"), in core because both halves read it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::contract {

struct PlannedLayout {
  std::int64_t tp = 1, pp = 1, dp = 1, ep = 1, cp = 1;
  std::int64_t micro_batch = 1;   // sequences per micro-batch
  std::int64_t global_batch = 1;  // sequences per optimizer step
  std::int64_t seq = 1;           // tokens per sequence
  std::int64_t interleave = 1;    // virtual pipeline stages per rank
  int zero = 0;                   // 0 replicated optimizer, 1 sharded, 2 and 3 more
  std::string recompute = "none";
  std::vector<std::int64_t> stage_layers;  // layers per (virtual) stage; empty: balanced
  std::int64_t processes() const { return tp * pp * dp * cp; }
  std::string describe() const;  // "tp 2 x pp 1 x dp 2"
};

// The first non-empty line of `text`, one object of `loom plan --json`. Errors name `source`,
// the field, its value and what was expected (a missing field, a wrong type, a degree < 1).
PlannedLayout parse_planned_layout(std::string_view text, const std::string& source);

// Why `loom train` cannot run `layout` on a model with `kv_heads` key/value heads, naming the
// field; empty when it can. Run: tp, pp (stages as listed), dp, ZeRO 0 or 1,
// a pipeline's micro-batches; not yet: ep, cp, interleaved stages, recomputation, ZeRO 2
// and 3, micro-batches without a pipeline (gradient accumulation), key/value heads
// that tp neither divides nor is a multiple of. `loom plan --engine` searches only the layouts this
// admits.
std::string engine_refusal(const PlannedLayout& layout, std::int64_t kv_heads);

}  // namespace loom::contract
