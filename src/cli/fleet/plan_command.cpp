#include "cli/fleet/plan_command.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "cluster/plan/plan.h"
#include "cluster/plan/sizing.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/planned_layout.h"

namespace loom::cli {
namespace {

using namespace loom::cluster;

// Limits on the --validate errors, in percent (absent: report only). Bound by
// add_plan_command's parser and read by run_validate: one parse per process.
struct ValidationLimits {
  std::optional<double> max_median_error_pct, max_error_pct;
};
ValidationLimits& validation_limits() {
  static ValidationLimits limits;
  return limits;
}

double parse_count(const std::string& text) {  // "15.6T", "2e12", "800B"
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::logic_error&) {
    throw Error("--tokens '" + text + "' is not a number (e.g. 15.6T, 800B, 2e12)");
  }
  std::string suffix = text.substr(used);
  if (suffix == "K")
    v *= 1e3;
  else if (suffix == "M")
    v *= 1e6;
  else if (suffix == "B" || suffix == "G")
    v *= 1e9;
  else if (suffix == "T")
    v *= 1e12;
  else
    check(suffix.empty(), "--tokens '" + text + "': unknown suffix '" + suffix + "' (K, M, B, T)");
  check(v > 0, "--tokens '" + text + "' must be > 0");
  return v;
}

std::string format_fixed(double v, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, v);
  return text;
}

// --price: one price for every chip ("2.5") or a price per chip id ("910c=1.2,b200=5").
struct Prices {
  std::optional<double> every_chip;
  std::map<std::string, double> per_chip;
  // The price to charge for `chip_id`, if --price gave one (else the catalog's default).
  std::optional<double> of(const std::string& chip_id) const {
    if (auto found = per_chip.find(chip_id); found != per_chip.end())
      return found->second;
    return every_chip;
  }
};

// A price in USD per chip-hour: the text is one finite number >= 0, else an error naming it.
double parse_price(const std::string& text, const std::string& what) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  check(
      !text.empty() && ec == std::errc() && end == text.data() + text.size() && std::isfinite(v) &&
          v >= 0,
      [&] { return what + ": '" + text + "' is not a price (USD per chip-hour, a number >= 0)"; });
  return v;
}

Prices parse_prices(const std::string& text) {
  Prices prices;
  if (text.empty())
    return prices;
  if (text.find('=') == std::string::npos) {
    prices.every_chip = parse_price(text, "--price");
    return prices;
  }
  for (std::size_t at = 0; at <= text.size();) {
    std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string entry = text.substr(at, comma - at);
    const std::size_t equals = entry.find('=');
    check(equals != std::string::npos && equals > 0, [&] {
      return "--price '" + text + "': entry '" + entry + "' is not chip=USD (e.g. 910c=1.2,b200=5)";
    });
    const std::string chip = entry.substr(0, equals);
    check(prices.per_chip.count(chip) == 0,
          [&] { return "--price '" + text + "': chip '" + chip + "' is priced twice"; });
    prices.per_chip[chip] = parse_price(entry.substr(equals + 1), "--price " + chip);
    at = comma + 1;
  }
  return prices;
}

Model resolve_model(const Catalog& catalog, const PlanOptions& o) {
  Model m;
  if (!o.model.empty()) {
    m = catalog.model(o.model);
  } else {
    check(o.layers && o.hidden && o.heads && o.vocab,
          "give --model ID, or a custom model with at least --layers --hidden --heads --vocab");
    m.id = "custom";
  }
  if (o.layers)
    m.layers = *o.layers;
  if (o.hidden)
    m.hidden = *o.hidden;
  if (o.heads)
    m.heads = *o.heads;
  if (o.heads && !o.kv_heads && o.model.empty())
    m.kv_heads = *o.heads;
  if (o.kv_heads)
    m.kv_heads = *o.kv_heads;
  if (o.ffn)
    m.ffn = *o.ffn;
  else if (o.model.empty())
    m.ffn = 4 * m.hidden;
  if (o.vocab)
    m.vocab = *o.vocab;
  if (o.experts)
    m.experts = *o.experts;
  if (o.top_k)
    m.top_k = *o.top_k;
  if (o.gated)
    m.gated = true;
  if (m.experts > 0 && m.expert_ffn == 0)
    m.expert_ffn = m.ffn;
  m.validate("model '" + m.id + "'");
  return m;
}

Constraints constraints_of(const PlanOptions& o) {
  Constraints c;
  c.tp = o.tp;
  c.pp = o.pp;
  c.dp = o.dp;
  c.ep = o.ep;
  c.cp = o.cp;
  c.micro_batch = o.micro_batch;
  c.global_batch = o.global_batch;
  c.seq = o.seq;
  c.interleave = o.interleave;
  c.stages = o.stages;
  if (!o.stages.empty()) {
    check(o.pp.has_value(), "--stages needs --pp: the stages are pp x interleave virtual stages");
    check(static_cast<std::int64_t>(o.stages.size()) % *o.pp == 0,
          "--stages lists " + std::to_string(o.stages.size()) +
              " stages, expected a multiple of --pp " + std::to_string(*o.pp) +
              " (pp x interleave)");
    if (!c.interleave)
      c.interleave = static_cast<std::int64_t>(o.stages.size()) / *o.pp;
  }
  if (o.recompute)
    c.recompute = parse_recompute(*o.recompute);
  if (o.zero) {
    check(*o.zero >= 0 && *o.zero <= 3, "--zero " + std::to_string(*o.zero) + ", expected 0..3");
    c.zero = static_cast<int>(*o.zero);
  }
  c.precision = parse_precision(o.precision);
  return c;
}

nlohmann::ordered_json layout_json(const Model& m, const Chip& chip, const Candidate& c,
                                   double tokens, std::optional<double> price) {
  const Layout& l = c.layout;
  const Estimate& e = c.estimate;
  Totals t = totals(e, chip, l, tokens, price.value_or(-1));
  nlohmann::ordered_json j{
      {"model", m.id},
      {"chip", chip.id},
      {"chips", l.chips()},
      {"tp", l.tp},
      {"pp", l.pp},
      {"dp", l.dp},
      {"ep", l.ep},
      {"cp", l.cp},
      {"micro_batch", l.micro_batch},
      {"global_batch", l.global_batch},
      {"seq", l.seq},
      {"interleave", l.interleave},
      {"stage_layers", c.estimate.step_time_s > 0 || check_layout(m, chip, l).empty()
                           ? nlohmann::json(stage_layers(m, l))
                           : nlohmann::json()},
      {"recompute", recompute_name(l.recompute)},
      {"zero", l.zero},
      {"feasible", e.feasible},
      {"reason", e.reason}};
  if (e.step_time_s > 0) {
    j.update({{"step_time_s", e.step_time_s},
              {"compute_s", e.compute_s},
              {"exposed_comm_s", e.exposed_comm_s},
              {"bubble_s", e.bubble_s},
              {"mfu", e.mfu},
              {"tflops_per_chip", e.tflops_per_chip},
              {"hw_tflops_per_chip", e.hw_tflops_per_chip},
              {"memory_per_chip_gb", e.memory.total_gb},
              {"tokens_per_s", e.tokens_per_s},
              {"days", t.days},
              {"chip_hours", t.chip_hours}});
    j["energy_kwh"] = t.energy_known ? nlohmann::json(t.energy_kwh) : nlohmann::json("unknown");
    j["cost_usd"] = t.cost_known ? nlohmann::json(t.cost_usd) : nlohmann::json("unknown");
  }
  return j;
}

// --measured: the chip's gemm_efficiency refitted on the user's runs on it (by the base chip
// id, as the runs name it), replacing the catalog's; the change is printed (text) or carried
// in each layout's JSON. Without a run on the chip the catalog's rate stays, and that is said.
std::optional<RateFit> recalibrate(const Catalog& catalog, const std::vector<std::string>& files,
                                   Chip& chip, bool json) {
  const std::string base = chip.id.substr(0, chip.id.find('@'));
  std::string names;
  for (const std::string& f : files)
    names += (names.empty() ? "" : ", ") + f;
  std::optional<RateFit> fit = fit_gemm_efficiency(catalog, files, base);
  if (!fit) {
    std::fprintf(json ? stderr : stdout,
                 "%s: no measured run in %s; gemm_efficiency stays at the catalog's %.3f\n",
                 base.c_str(), names.c_str(), chip.gemm_efficiency.value.value_or(0));
    return fit;
  }
  chip.gemm_efficiency =
      Figure{fit->fitted,
             {},
             {},
             false,
             "fitted on " + std::to_string(fit->runs) + " measured run(s) in " + names,
             "measured"};
  if (!json)
    std::printf(
        "%s: gemm_efficiency %.3f (catalog) -> %.3f, fitted on %zu measured run(s) in %s, which "
        "the "
        "catalog's rate predicted at %+.1f%% (median)\n",
        base.c_str(), fit->catalog, fit->fitted, fit->runs, names.c_str(),
        100.0 * fit->median_error_at_catalog);
  return fit;
}

void print_table_header() {
  std::printf("%-10s %6s %4s %4s %6s %3s %3s %3s %2s %-9s %4s %9s %6s %9s %7s %8s %8s %12s\n",
              "chip", "chips", "tp", "pp", "dp", "cp", "ep", "mb", "v", "recompute", "zero",
              "step s", "MFU", "tok/s", "mem GB", "days", "kMWh", "cost $M");
}

void print_row(const Chip& chip, const Candidate& c, double tokens, std::optional<double> price) {
  const Layout& l = c.layout;
  const Estimate& e = c.estimate;
  if (e.step_time_s <= 0) {
    std::printf("%-10s %6lld  infeasible: %s\n", chip.id.c_str(), static_cast<long long>(l.chips()),
                e.reason.c_str());
    return;
  }
  Totals t = totals(e, chip, l, tokens, price.value_or(-1));
  char energy[32], cost[32];
  if (t.energy_known)
    std::snprintf(energy, sizeof energy, "%8.1f", t.energy_kwh / 1e6);
  else
    std::snprintf(energy, sizeof energy, "%8s", "unknown");
  if (t.cost_known)
    std::snprintf(cost, sizeof cost, "%12.2f", t.cost_usd / 1e6);
  else
    std::snprintf(cost, sizeof cost, "%12s", "unknown");
  std::printf(
      "%-10s %6lld %4lld %4lld %6lld %3lld %3lld %3lld %2lld %-9s %4d %9.3f %5.1f%% %9.0f %7.1f "
      "%8.1f %s %s%s\n",
      chip.id.c_str(), static_cast<long long>(l.chips()), static_cast<long long>(l.tp),
      static_cast<long long>(l.pp), static_cast<long long>(l.dp), static_cast<long long>(l.cp),
      static_cast<long long>(l.ep), static_cast<long long>(l.micro_batch),
      static_cast<long long>(l.interleave), recompute_name(l.recompute), l.zero, e.step_time_s,
      100 * e.mfu, e.tokens_per_s, e.memory.total_gb, t.days, energy, cost,
      e.feasible ? "" : ("  infeasible: " + e.reason).c_str());
}

int run_validate(const Catalog& catalog, const PlanOptions& o) {
  std::vector<Validation> rows = validate(catalog, o.validate);
  if (!o.json)
    std::printf("%-30s %-10s %-13s %10s %10s %8s  layout\n", "run", "chip", "metric", "published",
                "predicted", "error");
  std::size_t known_fit_misses = 0;
  for (const Validation& v : rows) {
    known_fit_misses += v.known_fit && !v.fits;
    const Layout& l = v.layout;
    if (o.json) {
      std::printf("%s\n", nlohmann::ordered_json{{"id", v.id},
                                                 {"set", v.set},
                                                 {"chip", v.chip},
                                                 {"metric", v.metric},
                                                 {"counts", v.counts},
                                                 {"published", v.published},
                                                 {"predicted", v.predicted},
                                                 {"error", v.error},
                                                 {"micro_batch", l.micro_batch},
                                                 {"interleave", l.interleave},
                                                 {"recompute", recompute_name(l.recompute)},
                                                 {"zero", l.zero},
                                                 {"memory_per_chip_gb", v.memory_gb},
                                                 {"capacity_gb", v.capacity_gb},
                                                 {"fits", v.fits},
                                                 {"known_fit", v.known_fit},
                                                 {"memory", v.memory_reason}}
                              .dump()
                              .c_str());
    } else {
      std::printf(
          "%-30s %-10s %-13s %10.1f %10.1f %+7.1f%%  tp%lld pp%lld dp%lld ep%lld cp%lld mb%lld "
          "v%lld %s z%d, %.0f of %.0f GB%s\n",
          v.id.c_str(), v.chip.c_str(), v.metric.c_str(), v.published, v.predicted, 100 * v.error,
          static_cast<long long>(l.tp), static_cast<long long>(l.pp), static_cast<long long>(l.dp),
          static_cast<long long>(l.ep), static_cast<long long>(l.cp),
          static_cast<long long>(l.micro_batch), static_cast<long long>(l.interleave),
          recompute_name(l.recompute), l.zero, v.memory_gb, v.capacity_gb,
          v.fits ? "" : (v.known_fit ? " (DOES NOT FIT, but ran)" : " (does not fit)"));
    }
  }
  const double median = median_abs_error(rows), worst = max_abs_error(rows);
  if (o.json) {
    std::printf("%s\n", nlohmann::ordered_json{{"set", rows.empty() ? "" : rows.front().set},
                                               {"runs", rows.size()},
                                               {"median_abs_error", median},
                                               {"max_abs_error", worst},
                                               {"known_fit_misses", known_fit_misses}}
                            .dump()
                            .c_str());
  } else {
    std::printf(
        "%s: %zu runs: median |error| %.1f%%, max |error| %.1f%%; %zu known to have fit predicted "
        "not to\n",
        rows.empty() ? "runs" : rows.front().set.c_str(), rows.size(), 100 * median, 100 * worst,
        known_fit_misses);
  }
  // With limits, a model that drifted from the published runs fails (exit 1), so a test
  // of `plan --validate` checks the calibration, not only that the command runs.
  std::string exceeded;
  auto limit = [&](const char* what, const char* flag, double error,
                   std::optional<double> max_pct) {
    if (!max_pct || 100 * error <= *max_pct)
      return;
    char line[160];
    std::snprintf(line, sizeof line, "%s |error| %.1f%% exceeds %s %g by %.1f points", what,
                  100 * error, flag, *max_pct, 100 * error - *max_pct);
    exceeded += (exceeded.empty() ? "" : "; ") + std::string(line);
  };
  limit("median", "--max-median-error", median, validation_limits().max_median_error_pct);
  limit("max", "--max-error", worst, validation_limits().max_error_pct);
  check(exceeded.empty(), o.validate + ": " + exceeded);
  return 0;
}

// Each source's runs predicted with the catalog's rates and with each chip's rate refitted
// on the other sources (leave_one_source_out): how much a source's fit transfers.
int run_leave_one_source_out(const Catalog& catalog, const PlanOptions& o) {
  const std::vector<SourceTransfer> report = leave_one_source_out(catalog, o.leave_one_source_out);
  if (!o.json)
    std::printf(
        "%-22s %5s %17s %21s  refitted gemm_efficiency (catalog -> refit, from runs/sources)\n",
        "source", "runs", "in-sample med/max", "held-out runs med/max");
  for (const SourceTransfer& t : report) {
    if (o.json) {
      nlohmann::ordered_json refits = nlohmann::ordered_json::array();
      for (const SourceTransfer::Refit& r : t.refits)
        refits.push_back({{"chip", r.chip},
                          {"catalog", r.catalog},
                          {"refitted", r.refitted},
                          {"from_runs", r.from_runs},
                          {"from_sources", r.from_sources}});
      nlohmann::ordered_json held = nlohmann::ordered_json::array();
      for (const Validation& v : t.held_out)
        held.push_back({{"id", v.id},
                        {"chip", v.chip},
                        {"published", v.published},
                        {"predicted", v.predicted},
                        {"error", v.error}});
      std::printf("%s\n", nlohmann::ordered_json{{"source", t.source},
                                                 {"runs", t.runs},
                                                 {"in_sample_median_abs_error", t.in_sample_median},
                                                 {"in_sample_max_abs_error", t.in_sample_max},
                                                 {"held_out_runs", t.held_out_runs},
                                                 {"held_out_median_abs_error", t.held_out_median},
                                                 {"held_out_max_abs_error", t.held_out_max},
                                                 {"refits", refits},
                                                 {"untested", t.untested},
                                                 {"held_out", held}}
                              .dump()
                              .c_str());
      continue;
    }
    std::string refits;
    for (const SourceTransfer::Refit& r : t.refits) {
      char part[160];
      std::snprintf(part, sizeof part, "%s%s %.3f -> %.3f (%zu/%zu)", refits.empty() ? "" : "; ",
                    r.chip.c_str(), r.catalog, r.refitted, r.from_runs, r.from_sources);
      refits += part;
    }
    for (const std::string& chip : t.untested)
      refits += (refits.empty() ? "" : "; ") + chip + ": no other source, untested";
    char held[64] = "-";
    if (t.held_out_runs)
      std::snprintf(held, sizeof held, "%zu %5.1f%% %5.1f%%", t.held_out_runs,
                    100 * t.held_out_median, 100 * t.held_out_max);
    std::printf("%-22s %5zu %8.1f%% %7.1f%% %21s  %s\n", t.source.c_str(), t.runs,
                100 * t.in_sample_median, 100 * t.in_sample_max, held, refits.c_str());
  }
  return 0;
}

// The chips --compare, --system or --chip plans on: "id" or "id:count" each (a per-chip count,
// e.g. 910c:100000,b200:36000); a system is "@id".
std::vector<std::string> planned_entries(const PlanOptions& o) {
  std::vector<std::string> entries;
  if (!o.compare.empty()) {
    const std::string& list = o.compare;
    for (std::size_t at = 0; at <= list.size();) {
      std::size_t comma = list.find(',', at);
      if (comma == std::string::npos)
        comma = list.size();
      if (comma > at)
        entries.push_back(list.substr(at, comma - at));
      at = comma + 1;
    }
  } else if (!o.system.empty()) {
    entries.push_back("@" + o.system);
  } else {
    check(!o.chip.empty(), "give --chip ID, --system ID or --compare a,b,c");
    entries.push_back(o.chip);
  }
  return entries;
}

// --chips with every one of --tp, --pp and --dp: the product (times --cp) must be the count.
void check_layout_product(const PlanOptions& o) {
  if (!(o.chips && o.tp && o.pp && o.dp))
    return;
  const std::string what = "--tp x --pp x --dp x --cp";
  std::int64_t product = checked_mul(checked_mul(checked_mul(*o.tp, *o.pp, what), *o.dp, what),
                                     o.cp.value_or(1), what);
  check(product == *o.chips,
        "chips " + std::to_string(*o.chips) + " != tp*pp*dp*cp = " + std::to_string(*o.tp) + "*" +
            std::to_string(*o.pp) + "*" + std::to_string(*o.dp) + "*" +
            std::to_string(o.cp.value_or(1)) + " = " + std::to_string(product));
}

// A chip --price names must be one planned here (a misspelt id would silently price nothing).
void check_priced_chips_are_planned(const Catalog& catalog, const Prices& prices,
                                    const std::vector<std::string>& entries) {
  for (const auto& named : prices.per_chip) {
    std::string planned;
    bool found = false;
    for (const std::string& entry : entries) {
      const std::string id = entry.substr(0, entry.find(':'));
      const std::string chip_id = id[0] == '@' ? catalog.chip_in_system(id.substr(1)).id : id;
      found = found || chip_id == named.first;
      planned += (planned.empty() ? "" : ", ") + chip_id;
    }
    check(found, [&] {
      return "--price names chip '" + named.first +
             "', which is not planned here (planned: " + planned + ")";
    });
  }
}

struct PlannedChip {
  std::string id;  // as given: a chip id or "@system"
  std::optional<std::int64_t> count;
};

PlannedChip parse_entry(const std::string& entry, std::optional<std::int64_t> chips) {
  const std::size_t colon = entry.find(':');
  if (colon == std::string::npos)
    return {entry, chips};
  const std::string n = entry.substr(colon + 1);
  std::int64_t parsed = 0;
  const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), parsed);
  check(ec == std::errc() && end == n.data() + n.size() && parsed > 0,
        "--compare '" + entry + "': count '" + n + "' is not a positive integer");
  return {entry.substr(0, colon), parsed};
}

// The layouts shown for one chip: the best --top of a search at a given count, or the
// smallest count that meets --deadline or --budget (none: said in the table).
std::vector<Candidate> layouts_for(const PlanOptions& o, const Model& m, const Chip& chip,
                                   const PlannedChip& planned, const Constraints& c, double tokens,
                                   std::optional<double> price) {
  std::vector<Candidate> shown;
  if (planned.count) {
    auto start = std::chrono::steady_clock::now();
    SearchStats stats;
    std::vector<Candidate> found = search(m, chip, *planned.count, c, {}, &stats);
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    check(!found.empty(), [&] {
      return "no valid layout of " + m.id + " on " + std::to_string(*planned.count) + " " +
             planned.id + " chips" + why_no_layout(m, chip, *planned.count, c);
    });
    std::size_t n = o.compare.empty()
                        ? std::min<std::size_t>(found.size(), static_cast<std::size_t>(o.top))
                        : 1;
    shown.assign(found.begin(), found.begin() + static_cast<std::ptrdiff_t>(n));
    if (!o.json && o.compare.empty())
      std::fprintf(stderr, "searched %lld layouts (%lld feasible) in %.3f s\n",
                   static_cast<long long>(stats.evaluated), static_cast<long long>(stats.feasible),
                   seconds);
    return shown;
  }
  check(o.budget || o.deadline, "give --chips N, --budget USD or --deadline DAYS");
  std::optional<Candidate> pick =
      size_for(m, chip, c, tokens, price.value_or(-1), {o.deadline, o.budget});
  if (pick)
    shown.push_back(*pick);
  else if (!o.json)
    std::printf("%-10s no plan meets the %s\n", planned.id.c_str(),
                o.deadline ? "deadline" : "budget");
  return shown;
}

// On a chip with estimated figures the answer is a range: the same layout with every
// estimate at the bound that makes it slowest (slow) and at the one that makes it fastest.
struct Bound {
  Estimate estimate;
  Totals totals;
};
struct Range {
  Bound slow, fast;
};

std::optional<Range> range_of(const Model& m, const Chip& chip, const Candidate& cand,
                              double tokens, std::optional<double> price) {
  if (!has_estimates(chip) || cand.estimate.step_time_s <= 0)
    return std::nullopt;
  auto at = [&](bool optimistic) {
    const Chip bounded = chip_at_bounds(chip, optimistic);
    Estimate e = estimate(m, bounded, cand.layout);
    return Bound{e, totals(e, bounded, cand.layout, tokens, price.value_or(-1))};
  };
  return Range{at(false), at(true)};
}

void print_layout_json(const Model& m, const Chip& chip, const Candidate& cand, double tokens,
                       std::optional<double> price, const std::optional<RateFit>& fit,
                       const std::optional<Range>& range) {
  nlohmann::ordered_json j = layout_json(m, chip, cand, tokens, price);
  if (fit)
    j["gemm_efficiency_fit"] = {{"catalog", fit->catalog},
                                {"fitted", fit->fitted},
                                {"runs", fit->runs},
                                {"sources", fit->sources},
                                {"median_error_at_catalog", fit->median_error_at_catalog}};
  if (range) {
    const Totals& fast = range->fast.totals;
    const Totals& slow = range->slow.totals;
    j["range"] = {
        {"tokens_per_s", {range->slow.estimate.tokens_per_s, range->fast.estimate.tokens_per_s}},
        {"days", {fast.days, slow.days}},
        {"rests_on", "estimated chip figures at their catalog bounds"}};
    if (slow.energy_known && fast.energy_known)
      j["range"]["energy_kwh"] = {fast.energy_kwh, slow.energy_kwh};
    if (slow.cost_known && fast.cost_known)
      j["range"]["cost_usd"] = {fast.cost_usd, slow.cost_usd};
  }
  std::printf("%s\n", j.dump().c_str());
}

// The range's line under its row: the slow end takes the longest and, at its power bound,
// draws the most.
void print_range_line(const Range& range) {
  const Totals& fast = range.fast.totals;
  const Totals& slow = range.slow.totals;
  std::string energy, cost;
  if (fast.energy_known && slow.energy_known)
    energy = ", " + format_fixed(fast.energy_kwh / 1e6, 1) + ".." +
             format_fixed(slow.energy_kwh / 1e6, 1) + " kMWh";
  if (fast.cost_known && slow.cost_known)
    cost = ", $" + format_fixed(fast.cost_usd / 1e6, 2) + "M..$" +
           format_fixed(slow.cost_usd / 1e6, 2) + "M";
  std::printf("%-10s   range from estimated figures: %.0f..%.0f tok/s, %.1f..%.1f days%s%s\n", "",
              range.slow.estimate.tokens_per_s, range.fast.estimate.tokens_per_s, fast.days,
              slow.days, energy.c_str(), cost.c_str());
}

// --compare: where every figure behind the comparison comes from.
void print_chip_figures(const std::vector<Chip>& compared) {
  std::printf("\nchip figures (value [low..high] source, confidence):\n");
  for (const Chip& chip : compared) {
    std::printf("  %s (%s)\n", chip.id.c_str(), chip.name.c_str());
    const std::pair<const char*, const Figure*> figures[] = {
        {"bf16_tflops", &chip.bf16_tflops},
        {"fp8_tflops", &chip.fp8_tflops},
        {"hbm_gb", &chip.hbm_gb},
        {"hbm_tbps", &chip.hbm_tbps},
        {"scaleup_gbps", &chip.scaleup_gbps},
        {"scaleup_domain", &chip.scaleup_domain},
        {"scaleout_gbits", &chip.scaleout_gbits},
        {"tdp_w", &chip.tdp_w},
        {"price_per_hour", &chip.price_per_hour},
        {"gemm_efficiency", &chip.gemm_efficiency},
        {"attention_efficiency", &chip.attention_efficiency}};
    for (const auto& [name, f] : figures) {
      char value[64];
      if (!f->known())
        std::snprintf(value, sizeof value, "%s", f->unsupported ? "unsupported" : "unknown");
      else if (f->ranged())
        std::snprintf(value, sizeof value, "%g [%g..%g]", *f->value, *f->low, *f->high);
      else
        std::snprintf(value, sizeof value, "%g", *f->value);
      std::printf("    %-20s %-20s %s, %s\n", name, value, f->source.c_str(),
                  f->confidence.c_str());
    }
  }
}

}  // namespace

CLI::App* add_plan_command(CLI::App& app, PlanOptions& o) {
  CLI::App* plan =
      app.add_subcommand("plan", "plan chips and parallel layouts for training a model");
  plan->add_option("--model", o.model, "model id from catalog/models.yaml");
  plan->add_option("--chip", o.chip, "chip id from catalog/chips.yaml");
  plan->add_option("--system", o.system,
                   "system id from catalog/systems.yaml (a chip in its domain and fabric)");
  plan->add_option("--chips", o.chips, "number of chips")->check(CLI::PositiveNumber);
  plan->add_option("--precision", o.precision, "bf16 | fp8 (GEMM inputs)");
  plan->add_option(
      "--profile", o.profile,
      "a Loom device profile (docs/device-profile.md): measured GEMM rate and bandwidth");
  plan->add_option("--measured", o.measured,
                   "your own measured runs (the published-runs format, docs/published-runs.md): "
                   "each planned chip's "
                   "gemm_efficiency is refitted on its runs there, and the change printed");
  plan->add_option("--tokens", o.tokens, "training tokens (e.g. 15.6T)");
  plan->add_option("--compare", o.compare,
                   "chip ids to compare side by side: a,b,c or a:count,b:count");
  plan->add_option("--budget", o.budget, "USD: with --compare, the fastest plan within this cost");
  plan->add_option("--deadline", o.deadline,
                   "days: with --compare, the fewest chips that finish in time");
  plan->add_option("--price", o.price,
                   "USD per chip-hour, for every chip (2.5) or per chip (910c=1.2,b200=5); "
                   "overrides the catalog "
                   "default");
  plan->add_option("--tp", o.tp, "tensor parallel (searched when absent)");
  plan->add_option("--pp", o.pp, "pipeline parallel");
  plan->add_option("--dp", o.dp, "data parallel");
  plan->add_option("--ep", o.ep, "expert parallel (MoE)");
  plan->add_option("--cp", o.cp, "context parallel");
  plan->add_option("--micro-batch", o.micro_batch, "sequences per micro-batch");
  plan->add_option("--global-batch", o.global_batch, "sequences per step");
  plan->add_option("--seq", o.seq, "sequence length");
  plan->add_option("--interleave", o.interleave, "virtual pipeline stages per chip");
  plan->add_option("--stages", o.stages,
                   "layers per virtual pipeline stage, in order (e.g. 7,8,8,...,7: Llama 3 405B's "
                   "126 layers "
                   "on 16 stages); default: the balanced split, the first and last stages shortest")
      ->delimiter(',');
  plan->add_option("--recompute", o.recompute, "none | selective | full");
  plan->add_option("--zero", o.zero, "ZeRO stage 0-3 (1 = distributed optimizer)");
  plan->add_option("--layers", o.layers, "custom model: layers");
  plan->add_option("--hidden", o.hidden, "custom model: hidden width");
  plan->add_option("--heads", o.heads, "custom model: attention heads");
  plan->add_option("--kv-heads", o.kv_heads, "custom model: key/value heads (GQA)");
  plan->add_option("--ffn", o.ffn, "custom model: MLP width");
  plan->add_option("--vocab", o.vocab, "custom model: vocabulary");
  plan->add_option("--experts", o.experts, "custom model: MoE experts");
  plan->add_option("--top-k", o.top_k, "custom model: experts per token");
  plan->add_flag("--gated", o.gated,
                 "custom model: a gated MLP (SwiGLU: three matrices of hidden x ffn)");
  plan->add_option("--models-file", o.models_file,
                   "a YAML file of extra models (catalog/models.yaml format)");
  plan->add_option("--catalog", o.catalog, "catalog folder (default: the repository's catalog/)");
  plan->add_option("--top", o.top, "layouts to show");
  plan->add_option("--validate", o.validate,
                   "predict the published runs in FILE and print the errors");
  plan->add_option("--max-median-error", validation_limits().max_median_error_pct,
                   "PCT: with --validate, fail when the median |error| exceeds PCT percent")
      ->check(CLI::NonNegativeNumber);
  plan->add_option("--max-error", validation_limits().max_error_pct,
                   "PCT: with --validate, fail when any run's |error| exceeds PCT percent")
      ->check(CLI::NonNegativeNumber);
  plan->add_option("--leave-one-source-out", o.leave_one_source_out,
                   "runs FILES pooled: each source's runs predicted with each chip's "
                   "gemm_efficiency refitted on "
                   "the other sources' runs (a transfer report; the catalog is not changed)")
      ->expected(1, -1);
  plan->add_flag("--json", o.json, "one JSON object per layout");
  plan->add_flag("--engine", o.engine,
                 "only the layouts loom train runs (its --layout takes a line of --json): no ep, "
                 "cp, interleaving or recomputation; ZeRO 0 or 1");
  return plan;
}

int run_plan(const PlanOptions& o) {
  Catalog catalog = Catalog::load(o.catalog.empty() ? default_catalog_dir() : o.catalog);
  if (!o.models_file.empty())
    catalog.add_models_from(o.models_file);
  if (!o.validate.empty())
    return run_validate(catalog, o);
  if (!o.leave_one_source_out.empty())
    return run_leave_one_source_out(catalog, o);
  const Model m = resolve_model(catalog, o);
  Constraints c = constraints_of(o);
  if (o.engine) {  // the layouts `loom train --layout` runs: the rest are not searched
    c.cp = c.cp.value_or(1);
    c.ep = c.ep.value_or(1);
    c.interleave = c.interleave.value_or(1);
    c.recompute = c.recompute.value_or(Recompute::none);
    c.admit = [&m](const Layout& l) {
      contract::PlannedLayout planned{l.tp,
                                      l.pp,
                                      l.dp,
                                      l.ep,
                                      l.cp,
                                      l.micro_batch,
                                      l.global_batch,
                                      l.seq,
                                      l.interleave,
                                      l.zero,
                                      recompute_name(l.recompute),
                                      stage_layers(m, l)};
      return contract::engine_refusal(planned, m.kv_heads).empty();
    };
  }
  const double tokens = parse_count(o.tokens);
  const Prices prices = parse_prices(o.price);
  const std::vector<std::string> entries = planned_entries(o);
  check_layout_product(o);
  check_priced_chips_are_planned(catalog, prices, entries);

  // The header comes before the first row, after what --measured prints about the first chip.
  bool header_printed = o.json;
  std::vector<Chip> compared;
  for (const std::string& entry : entries) {
    const PlannedChip planned = parse_entry(entry, o.chips);
    const bool system = planned.id[0] == '@';
    Chip chip = system ? catalog.chip_in_system(planned.id.substr(1)) : catalog.chip(planned.id);
    const std::optional<double> price = prices.of(system ? chip.id : planned.id);
    if (!o.profile.empty())
      apply_device_profile(chip, o.profile, o.precision);
    std::optional<RateFit> fit;
    if (!o.measured.empty())
      fit = recalibrate(catalog, o.measured, chip, o.json);
    for (const Candidate& cand : layouts_for(o, m, chip, planned, c, tokens, price)) {
      const std::optional<Range> range = range_of(m, chip, cand, tokens, price);
      if (o.json) {
        print_layout_json(m, chip, cand, tokens, price, fit, range);
        continue;
      }
      if (!header_printed) {
        print_table_header();
        header_printed = true;
      }
      print_row(chip, cand, tokens, price);
      if (range)
        print_range_line(*range);
    }
    if (!o.compare.empty())
      compared.push_back(chip);
  }
  if (!o.json && !compared.empty())
    print_chip_figures(compared);
  return 0;
}

}  // namespace loom::cli
