// cluster/plan — search the valid layouts for (model, chip, count) and rank them;
// validate the performance model against published runs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cluster/perf/perf.h"

namespace loom::cluster {

// Fixed parts of the layout; anything left empty is searched over.
struct Constraints {
  std::optional<std::int64_t> tp, pp, dp, ep, cp, micro_batch, global_batch, seq, interleave;
  std::optional<Recompute> recompute;
  std::optional<int> zero;
  Precision precision = Precision::bf16;
  // Layers per virtual pipeline stage, as published (Layout::stages); empty: balanced.
  std::vector<std::int64_t> stages;
  double default_batch_tokens = 4.0 * 1024 * 1024;  // global batch (tokens) when none is given
  // false: rank layouts that fail only the memory check as if they fit (validation of
  // runs that are known to have fit; the memory estimate is still reported).
  bool enforce_memory = true;
  // A further test of each valid layout (e.g. the layouts `loom train` runs); empty: all.
  std::function<bool(const Layout&)> admit;
};

struct Candidate {
  Layout layout;
  Estimate estimate;
};

struct SearchStats {
  std::int64_t evaluated = 0, feasible = 0;
};

// Every valid layout on `chips` chips, feasible first, fastest first. Exhaustive over
// tp (divisors of the heads), pp (divisors of the chips per tp group, at most the layers;
// stages need not hold equal layer counts: stage_layers), interleave (1-8), cp, ep,
// micro-batch, recompute and ZeRO stage; dp follows from the chip count.
std::vector<Candidate> search(const Model& model, const Chip& chip, std::int64_t chips,
                              const Constraints& fixed, const Software& software = {},
                              SearchStats* stats = nullptr);

// Tokens/s of the best feasible layout of (model, chip, chips), 0 when none fits;
// memoised, for schedulers that ask the same questions many times a second.
class ThroughputCache {
 public:
  double tokens_per_s(const Model& model, const Chip& chip, std::int64_t chips,
                      const Constraints& fixed = {});
  std::size_t size() const { return cache_.size(); }

 private:
  std::map<std::tuple<std::string, std::string, std::int64_t, std::string>, double> cache_;
};

// A published run and the model's prediction of it. Runs publish throughput as tokens/s
// per chip, an iteration time, GPU-hours per trillion tokens (all compared as tokens/s
// per chip: no FLOP-counting convention enters) or TFLOP/s per chip (counted as the
// source counts: recomputation included or not; an MFU with the peak it assumes is
// converted to that).
struct Validation {
  std::string id, chip, counts;                    // counts: hardware | model | tokens
  std::string metric;                              // "tokens/s/chip" or "TFLOP/s/chip"
  std::string set;                                 // the file's `set:` (calibration, validation)
  std::string source;                              // the run's `source:` (a paper, a table)
  double published = 0, predicted = 0, error = 0;  // in `metric`; error = (pred - pub) / pub
  double memory_gb = 0, capacity_gb = 0;  // the model's memory estimate and what the chip holds
  bool fits = true;                       // some layout matching the published one fits in memory
  bool known_fit = false;                 // the file lists the run as having run (so it must fit)
  std::string memory_reason;              // when it does not fit: the memory by component
  Layout layout;
};

// The software stacks (software.yaml beside a runs file): name -> facts.
std::map<std::string, Software> read_software(const std::string& path);

// Reads a published-runs file (catalog/calibration/*.yaml, catalog/validation/*.yaml) and
// the software facts beside it (software.yaml, or the calibration folder's), predicts each
// run with its published layout fixed and the unpublished parts (micro-batch, interleaving,
// recomputation where not given) searched: the fastest layout that fits in memory, else
// the fastest one, reported as not fitting.
// `include` (when set) picks the runs to predict by catalog chip id and source, before any
// search; `gemm_efficiency` replaces the catalog's rate of the chips it names (a refit).
struct ValidateOptions {
  std::function<bool(const std::string& chip, const std::string& source)> include;
  std::map<std::string, double> gemm_efficiency;
};
std::vector<Validation> validate(const Catalog& catalog, const std::string& runs_path,
                                 const ValidateOptions& options = {});

// The median and the largest |error| of a set of predicted runs (0 for none).
double median_abs_error(const std::vector<Validation>& rows);
double max_abs_error(const std::vector<Validation>& rows);

// Leave one source out: how far each source's runs are predicted when nothing was fitted on
// them. For each source S and each chip S has runs on, the chip's gemm_efficiency is refitted
// on the other sources' runs on that chip (all files pooled) so that their median signed
// error is 0 (throughput rises with the rate, so a bisection finds it), and S's runs are
// predicted with the refitted rate. A chip no other source has runs on cannot be tested:
// it is listed in `untested`, and its runs are not counted held out. The catalog is not
// changed; this is a diagnostic of transfer, not a calibration.
struct SourceTransfer {
  std::string source;
  std::size_t runs = 0, held_out_runs = 0;
  double in_sample_median = 0, in_sample_max = 0;  // |error| with the catalog's rates
  double held_out_median = 0, held_out_max = 0;    // |error| with the refitted rates
  struct Refit {
    std::string chip;
    double catalog = 0, refitted = 0;
    std::size_t from_runs = 0, from_sources = 0;
  };
  std::vector<Refit> refits;
  std::vector<std::string> untested;  // chips that only S has runs on
  std::vector<Validation> held_out;   // S's runs predicted with the refitted rates
};
std::vector<SourceTransfer> leave_one_source_out(const Catalog& catalog,
                                                 const std::vector<std::string>& runs_paths);

// A chip's gemm_efficiency fitted on runs: the rate at which the runs on `chip` in
// `runs_paths` (pooled; those `include` keeps, by source) have a median signed error of 0.
// Throughput rises with the rate, so a bisection of log(rate) over [0.05, 1] finds it.
// `loom plan --measured FILE` recalibrates a chip on a user's own measured runs this way,
// and leave_one_source_out refits with it. nullopt when no run is on the chip.
struct RateFit {
  std::string chip;
  double catalog = 0, fitted = 0;  // gemm_efficiency: the catalog's, and fitted
  std::size_t runs = 0;
  std::vector<std::string> sources;
  double median_error_at_catalog = 0;  // signed: how far the catalog's rate put the runs
};
std::optional<RateFit> fit_gemm_efficiency(
    const Catalog& catalog, const std::vector<std::string>& runs_paths, const std::string& chip,
    const std::function<bool(const std::string& source)>& include = {});

}  // namespace loom::cluster
