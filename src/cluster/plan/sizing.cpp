#include "cluster/plan/sizing.h"

#include <algorithm>
#include <cmath>

namespace loom::cluster {

std::optional<Candidate> best_on(const Model& model, const Chip& chip, std::int64_t chips,
                                 const Constraints& fixed) {
  std::vector<Candidate> found = search(model, chip, chips, fixed);
  if (found.empty() || !found.front().estimate.feasible)
    return std::nullopt;
  return found.front();
}

std::optional<Candidate> size_for(const Model& model, const Chip& chip, const Constraints& fixed,
                                  double tokens, double price_per_hour,
                                  const SizingTarget& target) {
  const std::int64_t domain = chip.scaleup_domain.known() ? scaleup_domain_chips(chip) : 8;
  std::optional<Candidate> pick;
  for (std::int64_t n = domain; n <= 262144; n *= 2) {
    std::optional<Candidate> best = best_on(model, chip, n, fixed);
    if (!best)
      continue;
    const Totals t = totals(best->estimate, chip, best->layout, tokens, price_per_hour);
    if (target.deadline_days && t.days <= *target.deadline_days)
      return best;
    if (target.budget_usd && t.cost_known && t.cost_usd <= *target.budget_usd)
      pick = best;  // larger counts finish sooner
  }
  return pick;
}

std::string why_no_layout(const Model& model, const Chip& chip, std::int64_t chips,
                          const Constraints& fixed) {
  const std::int64_t tp = fixed.tp.value_or(1), pp = fixed.pp.value_or(1),
                     cp = fixed.cp.value_or(1);
  // search() has checked each fixed degree (1..chips): divided one at a time, as their
  // product can overflow.
  const std::int64_t dp = fixed.dp.value_or(std::max<std::int64_t>(1, chips / tp / pp / cp));
  const std::int64_t seq = fixed.seq.value_or(model.seq);
  const std::int64_t batch = fixed.global_batch.value_or(
      std::llround(fixed.default_batch_tokens / static_cast<double>(seq)));
  const Layout layout{tp,
                      pp,
                      dp,
                      fixed.ep.value_or(1),
                      cp,
                      fixed.micro_batch.value_or(1),
                      batch,
                      seq,
                      fixed.interleave.value_or(1),
                      Recompute::full,
                      1,
                      fixed.precision,
                      fixed.stages};
  const std::string why = check_layout(model, chip, layout);
  return why.empty() ? " (check that tp divides the heads, pp is at most the layers, and "
                       "chips = tp*pp*dp*cp)"
                     : ": " + why;
}

}  // namespace loom::cluster
