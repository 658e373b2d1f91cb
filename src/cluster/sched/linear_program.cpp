#include "cluster/sched/linear_program.h"

#include <glpk.h>

#include <cmath>
#include <string>

#include "core/error.h"

namespace loom::cluster {

namespace {
// GLPK's bound type for lo <= x <= hi with infinite ends meaning "none".
int bound_type(double lo, double hi) {
  const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  if (has_lo && has_hi)
    return lo == hi ? GLP_FX : GLP_DB;
  if (has_lo)
    return GLP_LO;
  if (has_hi)
    return GLP_UP;
  return GLP_FR;
}
double finite_or_zero(double v) {
  return std::isfinite(v) ? v : 0.0;
}
}  // namespace

struct LinearProgram::Problem {
  glp_prob* lp = glp_create_prob();
  ~Problem() { glp_delete_prob(lp); }
  Problem() = default;
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;
};

LinearProgram::LinearProgram() : problem_(std::make_unique<Problem>()) {
  glp_set_obj_dir(problem_->lp, GLP_MAX);
}
LinearProgram::~LinearProgram() = default;
LinearProgram::LinearProgram(LinearProgram&&) noexcept = default;
LinearProgram& LinearProgram::operator=(LinearProgram&&) noexcept = default;

std::size_t LinearProgram::add_variable(double lo, double hi, double objective) {
  check(!(lo > hi) && !std::isnan(lo) && !std::isnan(hi) && std::isfinite(objective),
        "linear program: variable bounds [" + std::to_string(lo) + ", " + std::to_string(hi) +
            "] or objective " + std::to_string(objective) + " are not usable");
  const int column = glp_add_cols(problem_->lp, 1);
  glp_set_col_bnds(problem_->lp, column, bound_type(lo, hi), finite_or_zero(lo),
                   finite_or_zero(hi));
  glp_set_obj_coef(problem_->lp, column, objective);
  return variables_++;
}

std::size_t LinearProgram::add_row(const std::vector<std::pair<std::size_t, double>>& terms,
                                   double lo, double hi) {
  glp_add_rows(problem_->lp, 1);
  ++rows_;
  set_row(rows_ - 1, terms, lo, hi);
  return rows_ - 1;
}

void LinearProgram::set_row(std::size_t row,
                            const std::vector<std::pair<std::size_t, double>>& terms, double lo,
                            double hi) {
  check(row < rows_, "linear program: no row " + std::to_string(row));
  check(!(lo > hi) && !std::isnan(lo) && !std::isnan(hi),
        "linear program: row bounds [" + std::to_string(lo) + ", " + std::to_string(hi) +
            "] are not usable");
  const int index_of_row = static_cast<int>(row) + 1;  // GLPK counts from 1
  glp_set_row_bnds(problem_->lp, index_of_row, bound_type(lo, hi), finite_or_zero(lo),
                   finite_or_zero(hi));
  // GLPK's arrays are 1-based: element 0 is unused.
  std::vector<int> index(terms.size() + 1);
  std::vector<double> value(terms.size() + 1);
  for (std::size_t i = 0; i < terms.size(); ++i) {
    check(terms[i].first < variables_ && std::isfinite(terms[i].second),
          "linear program: row term " + std::to_string(i) + " names variable " +
              std::to_string(terms[i].first) + " of " + std::to_string(variables_) +
              " or has a coefficient that is not finite");
    index[i + 1] = static_cast<int>(terms[i].first) + 1;
    value[i + 1] = terms[i].second;
  }
  glp_set_mat_row(problem_->lp, index_of_row, static_cast<int>(terms.size()), index.data(),
                  value.data());
}

std::optional<std::vector<double>> LinearProgram::maximize() {
  glp_smcp options;
  glp_init_smcp(&options);
  options.msg_lev = GLP_MSG_OFF;
  int status = 1;
  if (solved_) {  // warm start from the last optimal basis
    options.presolve = GLP_OFF;
    status = glp_simplex(problem_->lp, &options);
  }
  if (status != 0) {            // the first solve, or the old basis would not do
    options.presolve = GLP_ON;  // also answers infeasible or unbounded without a basis
    status = glp_simplex(problem_->lp, &options);
  }
  if (status == GLP_ENOPFS || status == GLP_ENODFS)
    return std::nullopt;  // presolve: no primal (infeasible) or no dual (unbounded) solution
  check(status == 0, "linear program: GLPK's simplex failed (code " + std::to_string(status) +
                         ") on " + std::to_string(variables_) + " variables and " +
                         std::to_string(rows_) + " rows");
  if (glp_get_status(problem_->lp) != GLP_OPT)
    return std::nullopt;
  std::vector<double> x(variables_);
  for (std::size_t i = 0; i < variables_; ++i)
    x[i] = glp_get_col_prim(problem_->lp, static_cast<int>(i) + 1);
  solved_ = true;
  duals_.resize(rows_);
  for (std::size_t i = 0; i < rows_; ++i)
    duals_[i] = glp_get_row_dual(problem_->lp, static_cast<int>(i) + 1);
  return x;
}

std::optional<std::vector<double>> LinearProgram::maximize_interior() {
  glp_iptcp options;
  glp_init_iptcp(&options);
  options.msg_lev = GLP_MSG_OFF;
  // The method is sensitive to badly scaled rows (GLPK scales only for the simplex);
  // glp_scale_prob reports on the terminal whatever msg_lev says, so that is off meanwhile.
  const int terminal = glp_term_out(GLP_OFF);
  glp_scale_prob(problem_->lp, GLP_SF_AUTO);
  glp_term_out(terminal);
  const int status = glp_interior(problem_->lp, &options);
  if (status == GLP_EFAIL || status == GLP_ENOCVG || status == GLP_EOBJLL || status == GLP_EOBJUL ||
      status == GLP_EITLIM || status == GLP_EINSTAB)
    return std::nullopt;  // no optimum found (infeasible, unbounded or numerically stuck)
  check(status == 0, "linear program: GLPK's interior-point method failed (code " +
                         std::to_string(status) + ") on " + std::to_string(variables_) +
                         " variables and " + std::to_string(rows_) + " rows");
  if (glp_ipt_status(problem_->lp) != GLP_OPT)
    return std::nullopt;
  std::vector<double> x(variables_);
  for (std::size_t i = 0; i < variables_; ++i)
    x[i] = glp_ipt_col_prim(problem_->lp, static_cast<int>(i) + 1);
  duals_.resize(rows_);
  for (std::size_t i = 0; i < rows_; ++i)
    duals_[i] = glp_ipt_row_dual(problem_->lp, static_cast<int>(i) + 1);
  return x;
}

double LinearProgram::dual(std::size_t row) const {
  check(row < duals_.size(),
        "linear program: no dual value for row " + std::to_string(row) + " (solve first)");
  return duals_[row];
}

}  // namespace loom::cluster
