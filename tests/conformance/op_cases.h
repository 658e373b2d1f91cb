// The op conformance cases: for every catalog op, inputs that exercise odd sizes, size 1,
// broadcasting and non-contiguous views, with the error measure that fits the op.
#pragma once

#include <string>
#include <vector>

#include "core/op_catalog.h"

namespace loom::testing {

enum class Measure { elementwise, nmse };

struct OpCase {
  std::string label;
  OpId op;
  std::vector<Tensor> inputs;  // on the CPU; the harness copies them to each backend
  Attrs attrs;
  Measure measure = Measure::elementwise;
  double tolerance = 1e-4;  // rtol for elementwise (atol = tolerance / 10), bound for nmse
};

// All cases for all ops (deterministic: fixed seeds).
std::vector<OpCase> all_op_cases();

// Runs the reference kernel on contiguous CPU copies of `inputs`.
std::vector<Tensor> run_reference(OpId op, const std::vector<Tensor>& inputs, const Attrs& attrs);

}  // namespace loom::testing
