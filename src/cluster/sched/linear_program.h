// cluster/sched/linear_program — a linear program solved by GLPK's simplex (Debian's
// libglpk-dev): what the round-based policies (rounds.h) solve to share the chip types
// among jobs. Variables and rows are added one at a time; bounds use +/-infinity for
// "none".
#pragma once

#include <cstddef>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace loom::cluster {

class LinearProgram {
 public:
  static constexpr double kInf = std::numeric_limits<double>::infinity();

  LinearProgram();
  ~LinearProgram();
  LinearProgram(LinearProgram&&) noexcept;
  LinearProgram& operator=(LinearProgram&&) noexcept;

  // A variable lo <= x <= hi whose coefficient in the objective is `objective`; returns
  // its index (0, 1, ...).
  std::size_t add_variable(double lo, double hi, double objective);
  // A row lo <= sum(coefficient x variable) <= hi; returns its index.
  std::size_t add_row(const std::vector<std::pair<std::size_t, double>>& terms, double lo,
                      double hi);
  // Replaces row `row` (its terms and bounds). The next maximize() starts from the last
  // optimal basis (a warm start), which is what makes a sequence of related programs cheap.
  void set_row(std::size_t row, const std::vector<std::pair<std::size_t, double>>& terms, double lo,
               double hi);
  std::size_t variables() const { return variables_; }

  // The values of the variables at a maximum of the objective; nullopt when the program
  // is infeasible or unbounded. Throws loom::Error when the solver fails otherwise.
  std::optional<std::vector<double>> maximize();
  // The same by GLPK's primal-dual interior-point method, without a crossover to a vertex:
  // where the maximum is not unique, a point inside the set of maxima (near its centre),
  // as interior-point solvers such as ECOS return.
  std::optional<std::vector<double>> maximize_interior();
  // After a maximize() that found a solution: the dual value (shadow price) of a row, how
  // much the objective would grow per unit the row's binding bound is relaxed.
  double dual(std::size_t row) const;

 private:
  struct Problem;
  std::unique_ptr<Problem> problem_;
  std::size_t variables_ = 0, rows_ = 0;
  std::vector<double> duals_;
  bool solved_ = false;  // a basis from an earlier maximize() to start from
};

}  // namespace loom::cluster
