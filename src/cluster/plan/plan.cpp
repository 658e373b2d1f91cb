#include "cluster/plan/plan.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "core/checked.h"
#include "core/error.h"

namespace loom::cluster {
namespace {

// The fields of a published run besides an inline model's (model_field_names()).
// params_b and tokens_per_batch are the source's own figures, kept for the reader.
const std::set<std::string>& run_field_names() {
  // clang-format off
  static const std::set<std::string> names{
      "id", "source", "software", "confidence", "chip", "chips", "system", "model",
      "tp", "pp", "dp", "cp", "ep", "interleave", "stages", "global_batch", "micro_batch",
      "sequences_per_dp_rank", "recompute", "zero", "precision", "known_fit", "counts",
      "tflops_per_chip", "mfu", "peak_tflops", "tokens_per_s_per_chip", "iter_time_s",
      "gpu_hours_per_trillion_tokens", "params_b", "tokens_per_batch"};
  // clang-format on
  return names;
}

std::vector<std::int64_t> divisors(std::int64_t n, std::int64_t limit) {
  std::vector<std::int64_t> out;
  for (std::int64_t d = 1; d <= std::min(n, limit); ++d)
    if (n % d == 0)
      out.push_back(d);
  return out;
}

template <class T>
std::vector<T> either(const std::optional<T>& fixed, std::vector<T> options) {
  return fixed ? std::vector<T>{*fixed} : options;
}

// The most chips a plan may have, and the largest batch, sequence or interleave.
constexpr std::int64_t kMaxChips = std::int64_t{1} << 31;
constexpr std::int64_t kMaxSize = std::int64_t{1} << 31;

bool counts_as_feasible(const Candidate& c, bool enforce_memory) {
  return c.estimate.feasible || (!enforce_memory && c.estimate.step_time_s > 0);
}

}  // namespace

std::vector<Candidate> search(const Model& model, const Chip& chip, std::int64_t chips,
                              const Constraints& fixed, const Software& software,
                              SearchStats* stats) {
  check(chips >= 1 && chips <= kMaxChips,
        "chips = " + std::to_string(chips) + ", expected 1.." + std::to_string(kMaxChips));
  // Fixed degrees come from flags and files: 0 was a division by zero below, and their
  // products could overflow. Each parallel degree is at most the chip count, the sizes at
  // most 2^31, so every product of two of them fits int64.
  for (auto [name, value] :
       {std::pair{"tp", fixed.tp}, std::pair{"pp", fixed.pp}, std::pair{"dp", fixed.dp},
        std::pair{"cp", fixed.cp}, std::pair{"ep", fixed.ep}})
    check(!value || (*value >= 1 && *value <= chips), std::string(name) + " = " +
                                                          std::to_string(value.value_or(0)) +
                                                          ", expected 1.." + std::to_string(chips));
  for (auto [name, value] :
       {std::pair{"micro_batch", fixed.micro_batch}, std::pair{"global_batch", fixed.global_batch},
        std::pair{"seq", fixed.seq}, std::pair{"interleave", fixed.interleave}})
    check(!value || (*value >= 1 && *value <= kMaxSize),
          std::string(name) + " = " + std::to_string(value.value_or(0)) + ", expected 1.." +
              std::to_string(kMaxSize));
  std::int64_t seq = fixed.seq.value_or(model.seq);
  std::vector<Candidate> out;
  SearchStats local;
  for (std::int64_t tp : either(fixed.tp, divisors(model.heads, 64))) {
    if (chips % tp != 0)
      continue;
    // Any pipeline depth that divides the chips left per tp group, up to one layer a stage.
    for (std::int64_t pp : either(fixed.pp, divisors(chips / tp, model.layers))) {
      for (std::int64_t cp : either(fixed.cp, std::vector<std::int64_t>{1, 2, 4, 8, 16})) {
        // chips divisible by tp x pp x cp, tested one factor at a time (the product of
        // fixed degrees can overflow).
        if (chips % tp != 0 || (chips / tp) % pp != 0 || (chips / tp / pp) % cp != 0)
          continue;
        std::int64_t dp = chips / tp / pp / cp;
        if (fixed.dp && *fixed.dp != dp)
          continue;
        // Virtual stages as frameworks run them: equal, or equal once the embedding and
        // the loss count as a layer each (Megatron-Core's account_for_embedding/loss_in_
        // pipeline_split; Llama 3 405B's 126 layers); any split when the stages are given.
        std::vector<std::int64_t> interleaves{1};
        for (std::int64_t v = 2;
             software.interleaved_schedule && pp > 1 && v <= 8 && pp * v <= model.layers + 2; ++v)
          if (model.layers % (pp * v) == 0 || (model.layers + 2) % (pp * v) == 0 ||
              !fixed.stages.empty())
            interleaves.push_back(v);
        for (std::int64_t v : either(fixed.interleave, interleaves)) {
          for (std::int64_t ep :
               either(fixed.ep, model.moe() ? divisors(std::min(model.experts, dp), 1 << 20)
                                            : std::vector<std::int64_t>{1})) {
            for (std::int64_t b :
                 either(fixed.micro_batch, std::vector<std::int64_t>{1, 2, 4, 8, 16})) {
              // The global batch belongs to the training recipe, not the layout: fixed
              // (default ~default_batch_tokens), and dp x micro-batch must divide it.
              std::int64_t batch = fixed.global_batch.value_or(std::max<std::int64_t>(
                  1, static_cast<std::int64_t>(
                         std::llround(fixed.default_batch_tokens / static_cast<double>(seq)))));
              if (batch % (dp * b) != 0)
                continue;
              for (Recompute rc : either(fixed.recompute, std::vector<Recompute>{
                                                              Recompute::none, Recompute::selective,
                                                              Recompute::full})) {
                if (rc == Recompute::selective && !software.selective_recompute && !fixed.recompute)
                  continue;  // the stack has no selective recomputation
                for (int zero : either(fixed.zero, std::vector<int>{0, 1, 2, 3})) {
                  Layout l{tp,          pp, dp, ep, cp, b, batch, seq, v, rc, zero, fixed.precision,
                           fixed.stages};
                  if (!check_layout(model, chip, l).empty() || (fixed.admit && !fixed.admit(l)))
                    continue;
                  Candidate c{l, estimate(model, chip, l, software)};
                  ++local.evaluated;
                  local.feasible += c.estimate.feasible;
                  out.push_back(std::move(c));
                }
              }
            }
          }
        }
      }
    }
  }
  // Feasible first, then the highest throughput (time per sequence).
  std::sort(out.begin(), out.end(), [&](const Candidate& a, const Candidate& b) {
    bool fa = counts_as_feasible(a, fixed.enforce_memory),
         fb = counts_as_feasible(b, fixed.enforce_memory);
    if (fa != fb)
      return fa;
    return a.estimate.step_time_s / static_cast<double>(a.layout.global_batch) <
           b.estimate.step_time_s / static_cast<double>(b.layout.global_batch);
  });
  if (stats)
    *stats = local;
  return out;
}

double ThroughputCache::tokens_per_s(const Model& model, const Chip& chip, std::int64_t chips,
                                     const Constraints& fixed) {
  // Every fixed part of the layout is part of the question.
  std::string fixed_key;
  auto add = [&](const auto& value) {
    if (value)
      fixed_key += std::to_string(static_cast<long long>(*value));
    fixed_key += '/';
  };
  for (const auto* v : {&fixed.tp, &fixed.pp, &fixed.dp, &fixed.ep, &fixed.cp, &fixed.micro_batch,
                        &fixed.global_batch, &fixed.seq, &fixed.interleave})
    add(*v);
  add(fixed.zero);
  fixed_key += std::to_string(fixed.recompute ? static_cast<int>(*fixed.recompute) : -1) + "/" +
               std::to_string(static_cast<int>(fixed.precision)) + "/" +
               std::to_string(fixed.default_batch_tokens) + "/" + (fixed.enforce_memory ? "m" : "");
  for (std::int64_t layers : fixed.stages)  // the pipeline split, when given
    fixed_key += "/" + std::to_string(layers);
  auto key = std::make_tuple(model.id, chip.id, chips, fixed_key);
  if (auto it = cache_.find(key); it != cache_.end())
    return it->second;
  std::vector<Candidate> found = search(model, chip, chips, fixed);
  double best =
      !found.empty() && found.front().estimate.feasible ? found.front().estimate.tokens_per_s : 0.0;
  cache_[key] = best;
  return best;
}

std::map<std::string, Software> read_software(const std::string& software_path) {
  std::map<std::string, Software> stacks;
  const YAML::Node sw = read_yaml_file(software_path)["software"];
  check(!sw || sw.IsMap(), software_path + ": field 'software' must be a mapping of stacks");
  for (const auto& item : sw) {
    check(item.first.IsScalar(),
          software_path + ": a software stack's name must be a single value");
    const std::string name = item.first.Scalar();
    const std::string where = software_path + ": software '" + name + "'";
    check(item.second.IsMap(), where + " must be a mapping of flags");
    static const std::set<std::string> known{"flash_attention",
                                             "sequence_parallel",
                                             "overlap_dp",
                                             "overlap_ep",
                                             "selective_recompute",
                                             "interleaved_schedule",
                                             "dualpipe",
                                             "comm_sm_fraction",
                                             "moe_imbalance",
                                             "moe_efficiency",
                                             "recompute_norms",
                                             "recompute_mla_up_projection",
                                             "recompute_moe_activation"};
    check_known_fields(item.second, known, where, "a software stack");
    auto flag = [&](const char* field, bool fallback, bool required) {
      const YAML::Node v = item.second[field];
      if (!v.IsDefined()) {
        check(!required, where + ": field '" + field + "' is missing (true or false)");
        return fallback;
      }
      check(v.IsScalar() && (v.Scalar() == "true" || v.Scalar() == "false"),
            where + ": field '" + field + "' must be true or false");
      return v.Scalar() == "true";
    };
    auto fraction = [&](const char* field, double fallback, double lo, double hi) {
      const YAML::Node v = item.second[field];
      if (!v.IsDefined())
        return fallback;
      double x = 0;
      try {
        x = v.as<double>();
      } catch (const YAML::Exception&) {
        throw Error(where + ": field '" + field + "' is '" +
                    (v.IsScalar() ? v.Scalar() : "(not a scalar)") + "', expected a number");
      }
      check(std::isfinite(x) && x >= lo && x <= hi,
            where + ": field '" + field + "' is " + v.Scalar() + ", expected " +
                std::to_string(lo) + ".." + std::to_string(hi));
      return x;
    };
    Software s;
    s.flash_attention = flag("flash_attention", true, true);
    s.sequence_parallel = flag("sequence_parallel", true, true);
    s.overlap_dp = flag("overlap_dp", true, true);
    s.overlap_ep = flag("overlap_ep", false, false);
    s.selective_recompute = flag("selective_recompute", true, false);
    s.dualpipe = flag("dualpipe", false, false);
    s.comm_sm_fraction = fraction("comm_sm_fraction", 0.0, 0.0, 0.9);
    s.moe_imbalance = fraction("moe_imbalance", 1.0, 1.0, 100.0);
    s.moe_efficiency = fraction("moe_efficiency", 1.0, 0.01, 1.0);
    s.interleaved_schedule = flag("interleaved_schedule", true, false);
    s.recompute_norms = flag("recompute_norms", false, false);
    s.recompute_mla_up_projection = flag("recompute_mla_up_projection", false, false);
    s.recompute_moe_activation = flag("recompute_moe_activation", false, false);
    stacks[name] = s;
  }
  return stacks;
}

std::vector<Validation> validate(const Catalog& catalog, const std::string& runs_path,
                                 const ValidateOptions& options) {
  return with_yaml_errors(runs_path, [&] {
    const YAML::Node root = read_yaml_file(runs_path);
    check(root["runs"] && root["runs"].IsSequence(), runs_path + ": expected a 'runs' list");
    check(!root["set"] || root["set"].IsScalar(),
          runs_path + ": field 'set' must be a single name (calibration, validation)");
    const std::string set = root["set"] ? root["set"].Scalar() : "runs";
    // The stacks beside the file, else the calibration folder's (the validation folder
    // shares them).
    std::map<std::string, Software> stacks;
    const std::filesystem::path folder = std::filesystem::path(runs_path).parent_path();
    for (const std::filesystem::path& candidate :
         {folder / "software.yaml", folder.parent_path() / "calibration" / "software.yaml"}) {
      if (std::error_code ec; std::filesystem::exists(candidate, ec)) {
        stacks = read_software(candidate.string());
        break;
      }
    }
    std::vector<Validation> out;
    const YAML::Node runs = root["runs"];
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const YAML::Node run = runs[i];
      const std::string entry = runs_path + ": runs[" + std::to_string(i) + "]";
      check(run.IsMap(), entry + " must be a mapping of fields");
      auto text = [&](const std::string& where, const char* field) {
        check(run[field].IsDefined() && !run[field].IsNull(),
              where + ": field '" + field + "' is missing");
        check(run[field].IsScalar(),
              where + ": field '" + field + "' must be a single value, not a list or mapping");
        return run[field].Scalar();
      };
      const std::string id = text(entry, "id");
      const std::string where = runs_path + ": run '" + id + "'";
      // Every field must be one this reader knows: a misspelt one ("micro_bacth") would
      // otherwise be searched over instead of fixed, and the error blamed on the model.
      check_known_fields(run, run_field_names(), where,
                         "a published run (docs/published-runs.md lists them)",
                         model_field_names());
      // A whole number in [lo, hi]; the file's numbers were read with yaml-cpp's as<int64_t>,
      // whose exceptions ("bad conversion") were an "internal error".
      auto count = [&](const char* field, std::int64_t lo, std::int64_t hi) {
        const std::string value = text(where, field);
        double number = 0;
        try {
          number = run[field].as<double>();
        } catch (const YAML::Exception&) {
          throw Error(where + ": field '" + field + "' is '" + value + "', expected a number");
        }
        return whole_number(number, lo, hi, where + ": field '" + field + "'");
      };
      auto positive = [&](const char* field) {
        double v = 0;
        try {
          v = run[field].as<double>();
        } catch (const YAML::Exception&) {
          throw Error(where + ": field '" + field + "' is '" + text(where, field) +
                      "', expected a number");
        }
        check(std::isfinite(v) && v > 0, where + ": field '" + field + "' is " +
                                             text(where, field) + ", expected a positive number");
        return v;
      };
      // Catalog look-ups name the unknown id; the file and run are added here.
      auto in_run = [&](const char* field, auto lookup) -> decltype(lookup()) {
        try {
          return lookup();
        } catch (const Error& e) {
          throw Error(where + ": field '" + field + "': " + e.what());
        }
      };
      std::string chip_id = text(where, "chip");
      Chip chip = in_run("chip", [&]() -> Chip {
        return run["system"] ? catalog.chip_in_system(text(where, "system"))
                             : catalog.chip(chip_id);
      });
      check(chip.hbm_gb.known(), where + ": chip '" + chip_id + "' has no hbm_gb figure (" +
                                     (chip.hbm_gb.unsupported ? "unsupported" : "unknown") +
                                     "), which the validation reports against");
      Model model;
      if (run["model"]) {
        const std::string model_id = text(where, "model");
        model = in_run("model", [&]() -> const Model& { return catalog.model(model_id); });
      } else {
        model = model_from_yaml(run, where);
        model.id = id;
      }
      const std::int64_t chips = count("chips", 1, kMaxChips);
      Constraints c;
      c.tp = count("tp", 1, chips);
      c.pp = count("pp", 1, chips);
      c.cp = run["cp"] ? count("cp", 1, chips) : 1;
      if (run["ep"])
        c.ep = count("ep", 1, chips);
      c.seq = count("seq", 1, kMaxSize);
      if (run["micro_batch"])
        c.micro_batch = count("micro_batch", 1, kMaxSize);
      if (run["interleave"])
        c.interleave = count("interleave", 1, kMaxSize);
      if (run["precision"])
        c.precision = parse_precision(text(where, "precision"));
      std::int64_t dp = 0;
      if (run["dp"]) {
        dp = count("dp", 1, chips);
      } else {
        // chips / (tp x pp x cp), one factor at a time: the product can overflow.
        check(chips % *c.tp == 0 && (chips / *c.tp) % *c.pp == 0 &&
                  (chips / *c.tp / *c.pp) % *c.cp == 0,
              where + ": tp x pp x cp = " + std::to_string(*c.tp) + " x " + std::to_string(*c.pp) +
                  " x " + std::to_string(*c.cp) + " does not divide chips " +
                  std::to_string(chips));
        dp = chips / *c.tp / *c.pp / *c.cp;
      }
      c.dp = dp;
      c.global_batch = run["global_batch"]
                           ? count("global_batch", 1, kMaxSize)
                           : checked_mul(dp, count("sequences_per_dp_rank", 1, kMaxSize),
                                         where + ": dp x sequences_per_dp_rank");
      if (run["recompute"])
        c.recompute = parse_recompute(text(where, "recompute"));
      c.zero = run["zero"] ? static_cast<int>(count("zero", 0, 3)) : 1;
      const std::string source = text(where, "source");
      if (options.include && !options.include(chip_id, source))
        continue;
      if (auto refit = options.gemm_efficiency.find(chip_id);
          refit != options.gemm_efficiency.end())
        chip.gemm_efficiency.value = refit->second;
      const std::string stack = run["software"] ? text(where, "software") : source;
      check(!run["software"] || stacks.count(stack), where + ": field 'software' names stack '" +
                                                         stack +
                                                         "', which software.yaml does not define");
      Software sw = stacks.count(stack) ? stacks[stack] : Software{};
      // Uneven pipelines (Llama 3 405B: 126 layers on 16 stages) as published: the run's
      // `stages` (layers per virtual stage) when it lists them, else the balanced split.
      if (run["stages"]) {
        check(run["stages"].IsSequence(),
              where + ": field 'stages' must be a list of layer counts, one per pipeline stage");
        for (std::size_t k = 0; k < run["stages"].size(); ++k) {
          const std::string field = "stages[" + std::to_string(k) + "]";
          std::int64_t n = 0;
          try {
            n = run["stages"][k].as<std::int64_t>();
          } catch (const YAML::Exception&) {
            throw Error(where + ": field '" + field + "' is not a whole number of layers");
          }
          check(n >= 1 && n <= model.layers, where + ": field '" + field + "' is " +
                                                 std::to_string(n) + ", expected 1.." +
                                                 std::to_string(model.layers) + " layers");
          c.stages.push_back(n);
        }
        if (!c.interleave)
          c.interleave = static_cast<std::int64_t>(c.stages.size()) / *c.pp;
      }
      // The fastest layout that fits; a run that happened fit, so when none does the
      // fastest is still timed and the miss reported.
      c.enforce_memory = true;
      std::vector<Candidate> found = search(model, chip, chips, c, sw);
      const Candidate* best = nullptr;
      for (const Candidate& candidate : found)
        if (candidate.estimate.step_time_s > 0) {
          best = &candidate;
          break;
        }
      if (!best) {  // name the rule the published layout breaks, when one does
        Layout published{c.tp.value_or(1),
                         *c.pp,
                         dp,
                         c.ep.value_or(1),
                         c.cp.value_or(1),
                         c.micro_batch.value_or(1),
                         *c.global_batch,
                         c.seq.value_or(model.seq),
                         c.interleave.value_or(1),
                         c.recompute.value_or(Recompute::full),
                         *c.zero,
                         c.precision,
                         c.stages};
        std::string why = check_layout(model, chip, published);
        if (why.empty() && !found.empty())
          why = found.front().estimate.reason;
        throw Error(where + ": no valid layout matches the published one" +
                    (why.empty() ? "" : ": " + why));
      }
      Validation v;
      v.id = id;
      v.chip = chip_id;
      v.set = set;
      v.source = source;
      if (run["known_fit"]) {
        const std::string known = text(where, "known_fit");
        check(known == "true" || known == "false",
              where + ": field 'known_fit' is '" + known + "', expected true or false");
        v.known_fit = known == "true";
      }
      const Layout& l = best->layout;
      const Estimate& e = best->estimate;
      const double tokens_per_chip = e.tokens_per_s / static_cast<double>(l.chips());
      if (run["tokens_per_s_per_chip"] || run["iter_time_s"] ||
          run["gpu_hours_per_trillion_tokens"]) {
        v.metric = "tokens/s/chip";
        v.counts = "tokens";
        const double tokens_step = static_cast<double>(l.global_batch) * static_cast<double>(l.seq);
        v.published = run["tokens_per_s_per_chip"] ? positive("tokens_per_s_per_chip")
                      : run["iter_time_s"]
                          ? tokens_step / positive("iter_time_s") / static_cast<double>(chips)
                          : 1e12 / (positive("gpu_hours_per_trillion_tokens") * 3600.0);
        v.predicted = tokens_per_chip;
      } else {
        v.metric = "TFLOP/s/chip";
        v.counts = text(where, "counts");
        check(v.counts == "hardware" || v.counts == "model",
              where + ": field 'counts' is '" + v.counts + "', expected hardware or model");
        v.published = run["tflops_per_chip"] ? positive("tflops_per_chip")
                                             : positive("mfu") * positive("peak_tflops");
        // Count FLOPs the way the source does (recomputation included or not).
        const double flops = v.counts == "hardware" ? e.hardware_flops : e.model_flops;
        v.predicted = flops / e.step_time_s / static_cast<double>(l.chips()) / 1e12;
      }
      v.error = (v.predicted - v.published) / v.published;
      v.layout = l;
      v.memory_gb = e.memory.total_gb;
      v.capacity_gb = e.memory.capacity_gb;
      v.fits = e.feasible;
      if (!v.fits)
        v.memory_reason = e.reason;
      out.push_back(v);
    }
    return out;
  });
}

namespace {

double median_of(std::vector<double> values) {
  if (values.empty())
    return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::vector<Validation> validate_all(const Catalog& catalog, const std::vector<std::string>& paths,
                                     const ValidateOptions& options) {
  std::vector<Validation> rows;
  for (const std::string& path : paths) {
    std::vector<Validation> part = validate(catalog, path, options);
    rows.insert(rows.end(), part.begin(), part.end());
  }
  return rows;
}

}  // namespace

double max_abs_error(const std::vector<Validation>& rows) {
  double worst = 0;
  for (const Validation& v : rows)
    worst = std::max(worst, std::abs(v.error));
  return worst;
}

double median_abs_error(const std::vector<Validation>& rows) {
  std::vector<double> errors;
  for (const Validation& v : rows)
    errors.push_back(std::abs(v.error));
  return median_of(errors);
}

std::vector<SourceTransfer> leave_one_source_out(const Catalog& catalog,
                                                 const std::vector<std::string>& runs_paths) {
  check(!runs_paths.empty(), "leave one source out: give at least one runs file");
  const std::vector<Validation> all = validate_all(catalog, runs_paths, {});
  // Runs are grouped, filtered and refitted by their `chip:` field (Validation::chip).
  std::vector<std::string> sources;
  for (const Validation& v : all)
    if (std::find(sources.begin(), sources.end(), v.source) == sources.end())
      sources.push_back(v.source);
  std::vector<SourceTransfer> out;
  for (const std::string& source : sources) {
    SourceTransfer t;
    t.source = source;
    std::vector<Validation> own;
    std::vector<std::string> chips;
    for (const Validation& v : all)
      if (v.source == source) {
        own.push_back(v);
        if (std::find(chips.begin(), chips.end(), v.chip) == chips.end())
          chips.push_back(v.chip);
      }
    t.runs = own.size();
    t.in_sample_median = median_abs_error(own);
    t.in_sample_max = max_abs_error(own);
    for (const std::string& chip : chips) {
      const std::optional<RateFit> fit = fit_gemm_efficiency(
          catalog, runs_paths, chip, [&](const std::string& s) { return s != source; });
      if (!fit) {
        t.untested.push_back(chip);
        continue;
      }
      t.refits.push_back({chip, fit->catalog, fit->fitted, fit->runs, fit->sources.size()});
      ValidateOptions held;
      held.include = [&](const std::string& c, const std::string& s) {
        return c == chip && s == source;
      };
      held.gemm_efficiency[chip] = fit->fitted;
      for (const Validation& v : validate_all(catalog, runs_paths, held))
        t.held_out.push_back(v);
    }
    t.held_out_runs = t.held_out.size();
    t.held_out_median = median_abs_error(t.held_out);
    t.held_out_max = max_abs_error(t.held_out);
    out.push_back(std::move(t));
  }
  return out;
}

std::optional<RateFit> fit_gemm_efficiency(const Catalog& catalog,
                                           const std::vector<std::string>& runs_paths,
                                           const std::string& chip,
                                           const std::function<bool(const std::string&)>& include) {
  ValidateOptions on_chip;
  on_chip.include = [&](const std::string& c, const std::string& s) {
    return c == chip && (!include || include(s));
  };
  const std::vector<Validation> at_catalog = validate_all(catalog, runs_paths, on_chip);
  if (at_catalog.empty())
    return std::nullopt;
  RateFit fit;
  fit.chip = chip;
  fit.catalog = catalog.chip(chip).gemm_efficiency.value.value_or(0);
  fit.runs = at_catalog.size();
  std::vector<double> errors;
  for (const Validation& v : at_catalog) {
    errors.push_back(v.error);
    if (std::find(fit.sources.begin(), fit.sources.end(), v.source) == fit.sources.end())
      fit.sources.push_back(v.source);
  }
  fit.median_error_at_catalog = median_of(errors);
  // The runs' median signed error at `rate`; it rises with the rate.
  auto median_error = [&](double rate) {
    ValidateOptions refit = on_chip;
    refit.gemm_efficiency[chip] = rate;
    std::vector<double> e;
    for (const Validation& v : validate_all(catalog, runs_paths, refit))
      e.push_back(v.error);
    return median_of(e);
  };
  double lo = std::log(0.05), hi = std::log(1.0);
  for (int step = 0; step < 16; ++step) {  // 2^-16 of the log range: < 0.01% in rate
    const double mid = 0.5 * (lo + hi);
    (median_error(std::exp(mid)) < 0 ? lo : hi) = mid;
  }
  fit.fitted = std::exp(0.5 * (lo + hi));
  return fit;
}

}  // namespace loom::cluster
