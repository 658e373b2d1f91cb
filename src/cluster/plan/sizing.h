// cluster/plan/sizing.h — how many chips a plan needs: the chip count chosen for a
// deadline or a budget, and why no layout exists when the fixed parts pin one down.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cluster/plan/plan.h"

namespace loom::cluster {

// The best feasible layout on `chips` chips (search's first), if any.
std::optional<Candidate> best_on(const Model& model, const Chip& chip, std::int64_t chips,
                                 const Constraints& fixed);

// What a plan without a chip count must meet: a deadline (the smallest count that trains
// the tokens within it), or a budget (the largest count whose cost stays within it:
// larger counts finish sooner). With both: the first count that meets the deadline, else
// the largest within the budget.
struct SizingTarget {
  std::optional<double> deadline_days, budget_usd;
};

// The best layout at the chip count that meets `target` for `tokens` tokens, trying
// multiples of the chip's scale-up domain (8 chips when the catalog does not give it),
// doubling up to 262,144; nothing when no count meets it. `price_per_hour` < 0: the
// catalog's price (a budget needs one: counts without a known cost never meet it).
std::optional<Candidate> size_for(const Model& model, const Chip& chip, const Constraints& fixed,
                                  double tokens, double price_per_hour, const SizingTarget& target);

// Why search found no layout on `chips` chips: the rule that the layout the fixed parts
// describe breaks (check_layout; free degrees at 1, dp from the count), or, where it
// breaks none, the rules to check. A whole sentence after "no valid layout of M on N C
// chips".
std::string why_no_layout(const Model& model, const Chip& chip, std::int64_t chips,
                          const Constraints& fixed);

}  // namespace loom::cluster
