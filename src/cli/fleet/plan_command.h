// cli/fleet/plan_command — `loom plan`: a thin layer over cluster/plan.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

namespace loom::cli {

struct PlanOptions {
  std::string profile;
  std::vector<std::string> leave_one_source_out;  // runs files to pool
  std::vector<std::string> measured;  // a user's measured runs: the chips' rates are refitted
  std::string model, chip, system, compare, tokens = "15T", validate, catalog, models_file,
                                            precision = "bf16";
  std::optional<std::int64_t> chips, tp, pp, dp, ep, cp, micro_batch, global_batch, seq, interleave,
      zero;
  std::optional<std::string> recompute;
  std::vector<std::int64_t> stages;  // layers per virtual pipeline stage (empty: balanced)
  std::optional<std::int64_t> layers, hidden, heads, kv_heads, ffn, vocab, experts, top_k;
  std::optional<double> budget, deadline;
  // --price: USD per chip-hour for every chip ("2.5"), or per chip ("910c=1.2,b200=5"); a
  // chip not named keeps the catalog's default.
  std::string price;
  int top = 10;
  bool json = false;
  bool gated = false;   // custom model: a gated (SwiGLU) MLP
  bool engine = false;  // only the layouts `loom train` runs (contract::engine_refusal)
};

CLI::App* add_plan_command(CLI::App& app, PlanOptions& options);
int run_plan(const PlanOptions& options);

}  // namespace loom::cli
