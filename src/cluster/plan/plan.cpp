#include "cluster/plan/plan.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "core/error.h"

namespace loom::cluster {
namespace {

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

bool counts_as_feasible(const Candidate& c, bool enforce_memory) {
  return c.estimate.feasible || (!enforce_memory && c.estimate.step_time_s > 0);
}

}  // namespace

std::vector<Candidate> search(const Model& model, const Chip& chip, std::int64_t chips,
                              const Constraints& fixed, const Software& software,
                              SearchStats* stats) {
  check(chips >= 1, "chips = " + std::to_string(chips) + ", expected >= 1");
  std::int64_t seq = fixed.seq.value_or(model.seq);
  std::vector<Candidate> out;
  SearchStats local;
  for (std::int64_t tp : either(fixed.tp, divisors(model.heads, 64))) {
    for (std::int64_t pp : either(fixed.pp, divisors(model.layers, 1 << 20))) {
      for (std::int64_t cp : either(fixed.cp, std::vector<std::int64_t>{1, 2, 4, 8, 16})) {
        if (chips % (tp * pp * cp) != 0)
          continue;
        std::int64_t dp = chips / (tp * pp * cp);
        if (fixed.dp && *fixed.dp != dp)
          continue;
        for (std::int64_t v : either(fixed.interleave, pp > 1 ? divisors(model.layers / pp, 8)
                                                              : std::vector<std::int64_t>{1})) {
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
                for (int zero : either(fixed.zero, std::vector<int>{0, 1, 2, 3})) {
                  Layout l{tp, pp, dp, ep, cp, b, batch, seq, v, rc, zero, fixed.precision};
                  if (!check_layout(model, chip, l).empty())
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
  auto key = std::make_tuple(model.id, chip.id, chips, fixed_key);
  if (auto it = cache_.find(key); it != cache_.end())
    return it->second;
  std::vector<Candidate> found = search(model, chip, chips, fixed);
  double best =
      !found.empty() && found.front().estimate.feasible ? found.front().estimate.tokens_per_s : 0.0;
  cache_[key] = best;
  return best;
}

std::vector<Validation> validate(const Catalog& catalog, const std::string& runs_path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(runs_path);
  } catch (const YAML::Exception& e) {
    throw Error(runs_path + ": cannot read (" + e.msg + ")");
  }
  check(root["runs"] && root["runs"].IsSequence(), runs_path + ": expected a 'runs' list");
  std::map<std::string, Software> stacks;
  std::string software_path =
      (std::filesystem::path(runs_path).parent_path() / "software.yaml").string();
  if (std::filesystem::exists(software_path)) {
    YAML::Node sw = YAML::LoadFile(software_path)["software"];
    for (const auto& item : sw) {
      Software s;
      s.flash_attention = item.second["flash_attention"].as<bool>();
      s.sequence_parallel = item.second["sequence_parallel"].as<bool>();
      s.overlap_dp = item.second["overlap_dp"].as<bool>();
      stacks[item.first.as<std::string>()] = s;
    }
  }
  std::vector<Validation> out;
  for (const auto& run : root["runs"]) {
    std::string id = run["id"].as<std::string>();
    std::string where = runs_path + ": run '" + id + "'";
    auto need = [&](const char* field) {
      check(run[field].IsDefined(), where + ": field '" + field + "' is missing");
      return run[field];
    };
    std::string chip_id = need("chip").as<std::string>();
    const Chip& chip = catalog.chip(chip_id);
    Model model;
    if (run["model"]) {
      model = catalog.model(run["model"].as<std::string>());
    } else {
      model.id = id;
      model.layers = need("layers").as<std::int64_t>();
      model.hidden = need("hidden").as<std::int64_t>();
      model.heads = need("heads").as<std::int64_t>();
      model.kv_heads = model.heads;
      model.ffn = 4 * model.hidden;
      model.vocab = need("vocab").as<std::int64_t>();
      model.validate(where);
    }
    Constraints c;
    c.tp = need("tp").as<std::int64_t>();
    c.pp = need("pp").as<std::int64_t>();
    c.cp = run["cp"] ? run["cp"].as<std::int64_t>() : 1;
    c.seq = need("seq").as<std::int64_t>();
    std::int64_t chips = need("chips").as<std::int64_t>();
    std::int64_t dp = run["dp"] ? run["dp"].as<std::int64_t>() : chips / (*c.tp * *c.pp * *c.cp);
    c.dp = dp;
    c.global_batch = run["global_batch"] ? run["global_batch"].as<std::int64_t>()
                                         : dp * need("sequences_per_dp_rank").as<std::int64_t>();
    if (run["recompute"])
      c.recompute = parse_recompute(run["recompute"].as<std::string>());
    c.zero = 1;
    c.enforce_memory = false;  // the run happened, so it fit
    std::string source = need("source").as<std::string>();
    Software sw = stacks.count(source) ? stacks[source] : Software{};
    // Uneven pipelines (Llama 3 405B: 126 layers on 16 stages) are modelled with the
    // layer count rounded to the nearest multiple of pp, keeping the per-stage average.
    Model modelled = model;
    if (modelled.layers % *c.pp != 0)
      modelled.layers =
          std::max<std::int64_t>(*c.pp, (modelled.layers + *c.pp / 2) / *c.pp * *c.pp);
    std::vector<Candidate> found = search(modelled, chip, chips, c, sw);
    check(!found.empty(), where + ": no valid layout matches the published one");
    const Candidate& best = found.front();
    Validation v;
    v.id = id;
    v.chip = chip_id;
    v.counts = need("counts").as<std::string>();
    v.published = need("tflops_per_chip").as<double>();
    // Count FLOPs the way the source does (recomputation included or not).
    const Layout& l = best.layout;
    const Estimate& e = best.estimate;
    double flops = v.counts == "hardware" ? e.hardware_flops : e.model_flops;
    v.predicted = flops / e.step_time_s / static_cast<double>(l.chips()) / 1e12;
    v.error = (v.predicted - v.published) / v.published;
    v.layout = l;
    v.memory_gb = e.memory.total_gb;
    v.hbm_gb = *chip.hbm_gb.value;
    out.push_back(v);
  }
  return out;
}

}  // namespace loom::cluster
