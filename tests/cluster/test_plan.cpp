// The planner: catalog validation, Megatron's memory formula, layout errors, search,
// and the calibration against published runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>

#include "cluster/plan/plan.h"
#include "core/error.h"
#include "test_util.h"

namespace loom::testing {
namespace {

using namespace loom::cluster;

Catalog catalog() { return Catalog::load(source_dir() + "/catalog"); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Catalog, EveryChipFigureHasASourceAndUnknownsStayUnknown) {
  Catalog c = catalog();
  for (const char* id : {"a100-80gb", "h100-sxm", "h800", "h20", "h200", "b200", "gb200", "b300", "mi300x", "910b",
                         "910c", "950", "p800", "ppu"})
    EXPECT_NO_THROW(c.chip(id)) << id;
  for (const Chip& chip : c.chips()) {
    for (const Figure* f : {&chip.bf16_tflops, &chip.hbm_gb, &chip.scaleup_gbps, &chip.tdp_w, &chip.price_per_hour}) {
      EXPECT_FALSE(f->source.empty()) << chip.id;
      EXPECT_FALSE(f->confidence.empty()) << chip.id;
    }
  }
  EXPECT_FALSE(c.chip("p800").bf16_tflops.known());      // not public: unknown, not invented
  EXPECT_TRUE(c.chip("a100-80gb").fp8_tflops.unsupported);
  EXPECT_EQ(c.chip("950").status, "roadmap");
  EXPECT_NEAR(c.model("llama3-405b").total_params() / 1e9, 405, 10);
  EXPECT_NEAR(c.model("deepseek-v3").total_params() / 1e9, 671, 40);   // MLA approximated
  EXPECT_NEAR(c.model("deepseek-v3").active_params() / 1e9, 37, 6);
}

TEST(Catalog, MalformedFilesNameFileFieldAndValue) {
  std::string dir = temp_dir("catalog");
  std::ofstream(dir + "/chips.yaml") << "chips:\n  - id: x\n    bf16_tflops: {value: fast, source: me, confidence: high}\n";
  std::ofstream(dir + "/models.yaml") << "models: []\n";
  std::string e = error_of([&] { Catalog::load(dir); });
  EXPECT_NE(e.find("chips.yaml: chip 'x': field 'bf16_tflops': value 'fast' is not a number"), std::string::npos) << e;
  std::ofstream(dir + "/chips.yaml") << "chips:\n  - id: x\n    bf16_tflops: {value: 3}\n";
  e = error_of([&] { Catalog::load(dir); });
  EXPECT_NE(e.find("field 'bf16_tflops' must be {value, source, confidence}"), std::string::npos) << e;
  std::ofstream(dir + "/models.yaml") << "models:\n  - {id: m, layers: 2, hidden: 10, heads: 3, vocab: 5}\n";
  std::ofstream(dir + "/chips.yaml") << "chips: []\n";
  e = error_of([&] { Catalog::load(dir); });
  EXPECT_NE(e.find("model 'm': hidden 10 is not divisible by heads 3"), std::string::npos) << e;
  e = error_of([&] { catalog().chip("h1000"); });
  EXPECT_NE(e.find("unknown chip 'h1000'"), std::string::npos) << e;
}

TEST(Perf, MemoryMatchesMegatronsTheoreticalFormula) {
  // GPT-3 175B, tp 8, pp 8, dp 16, micro-batch 1, seq 2048, sequence parallel + selective
  // recompute, distributed optimizer (Megatron-LM's theoretical_memory_usage.py terms):
  //   weights+optimizer = params_first_stage * (6 + 12/dp)
  //   activations = s b h L (34/t) * (in-flight = L layers for 1F1B)
  Catalog c = catalog();
  const Model& m = c.model("gpt3-175b");
  Layout l{8, 8, 16, 1, 1, 1, 1536, 2048, 1, Recompute::selective, 1};
  Memory mem = memory_per_chip(m, l);
  double h = 12288, layers_stage = 96.0 / 8;
  double per_layer = 12 * h * h;  // 4h^2 attention + 8h^2 MLP
  double params = (layers_stage * per_layer + 50257 * h) / 8;
  double weights_gb = params * (6 + 12.0 / 16) / 1e9;
  double act_gb = 2048.0 * 1 * h * (34.0 / 8) * 96 / 1e9;
  EXPECT_NEAR(mem.weights_and_optimizer_gb, weights_gb, 0.05 * weights_gb);
  EXPECT_NEAR(mem.activations_gb, act_gb, 0.05 * act_gb);
}

TEST(Perf, ImpossibleLayoutsSayWhy) {
  Catalog c = catalog();
  const Model& m = c.model("llama3-70b");
  const Chip& h100 = c.chip("h100-sxm");
  Layout l{3, 1, 1, 1, 1, 1, 1, 8192, 1, Recompute::full, 1};
  EXPECT_NE(check_layout(m, h100, l).find("tp 3 does not divide the heads"), std::string::npos);
  l.tp = 8;
  l.pp = 3;
  EXPECT_NE(check_layout(m, h100, l).find("pp 3 does not divide the 80 layers"), std::string::npos);
  l.pp = 1;
  Estimate e = estimate(m, h100, l);  // 70B on 8 chips without sharding: does not fit
  l.zero = 0;
  e = estimate(m, h100, l);
  EXPECT_FALSE(e.feasible);
  EXPECT_NE(e.reason.find("GB per chip"), std::string::npos) << e.reason;
  Estimate unknown = estimate(m, c.chip("p800"), Layout{8, 1, 1, 1, 1, 1, 1, 8192, 1, Recompute::full, 1});
  EXPECT_FALSE(unknown.feasible);
  EXPECT_NE(unknown.reason.find("unknown"), std::string::npos) << unknown.reason;
}

TEST(Perf, MoreChipsGoFasterAndSlowerLinksHurt) {
  Catalog c = catalog();
  const Model& m = c.model("llama3-70b");
  Constraints fixed;
  fixed.global_batch = 1024;
  auto best = [&](const char* chip, std::int64_t n) { return search(m, c.chip(chip), n, fixed).front().estimate; };
  EXPECT_LT(best("h100-sxm", 1024).step_time_s, best("h100-sxm", 256).step_time_s);
  // H800 has H100's compute with less than half its NVLink bandwidth: with tensor
  // parallelism over NVLink fixed, it is slower; left free, the planner avoids the cost.
  fixed.tp = 8;
  EXPECT_LT(best("h100-sxm", 256).step_time_s, best("h800", 256).step_time_s);
  fixed.tp.reset();
  EXPECT_LE(best("h100-sxm", 256).step_time_s, best("h800", 256).step_time_s * 1.0001);
}

TEST(Plan, ValidatesAgainstPublishedRuns) {
  std::vector<Validation> rows = validate(catalog(), source_dir() + "/catalog/calibration/published-runs.yaml");
  ASSERT_EQ(rows.size(), 11u);
  std::vector<double> errors;
  for (const auto& v : rows) errors.push_back(std::abs(v.error));
  std::sort(errors.begin(), errors.end());
  EXPECT_LE(errors[errors.size() / 2], 0.10);  // median |error|
  EXPECT_LE(errors.back(), 0.20);              // max |error|
}

TEST(Plan, SearchIsExhaustiveOverTheGivenFreedom) {
  Catalog c = catalog();
  Constraints fixed;
  fixed.tp = 8;
  fixed.pp = 9;
  SearchStats stats;
  auto found = search(c.model("llama3-405b"), c.chip("h100-sxm"), 16384 / 8 * 9 / 9, fixed, {}, &stats);
  for (const auto& cand : found) {
    EXPECT_EQ(cand.layout.tp, 8);
    EXPECT_EQ(cand.layout.pp, 9);
  }
  EXPECT_EQ(static_cast<std::size_t>(stats.evaluated), found.size());
}

}  // namespace
}  // namespace loom::testing
