// core/fused_elementwise.h — a chain of elementwise ops run as one catalog op.
//
// The graph's fusion pass (graph/fusion.h) replaces a chain of elementwise nodes whose
// intermediates nobody else reads with one `fused_elementwise` node. Its program is the
// chain itself, op by op, so the op has what every catalog op has:
//   - a reference kernel: each step run by that op's own reference kernel, on inputs
//     first broadcast to the output shape;
//   - a decomposition: each step dispatched as the op it was (a backend without a fused
//     kernel runs exactly the unfused chain, on its own device, counted as decomposed);
//   - fast kernels where written (the CPU's evaluates the whole chain per cache-sized
//     block of the output, one pass over memory instead of one per step).
// It has no autograd rule of its own: fusion runs on a captured step, after autograd has
// recorded both passes, so a backward chain is fused like any other chain.
//
// Semantics: every step's value has the output's shape (attrs.shape); an operand that is
// one of the op's inputs is broadcast to it (numpy rules). Because the steps are
// elementwise, this equals running each step on its operands as given. Each output is one
// step's value (ElementwiseProgram::outputs), all of that shape.
//
// Row reductions. A step may also be `sum` or `mean` over the last axis of attrs.shape
// (keeping it, as size 1): a chain that ends in a reduction, and the elementwise steps
// after it that use the reduced value (a layer norm or its backward written in
// primitives), are one program too. Such a program has two kinds of value: full ones,
// of attrs.shape S, and row ones, of S with its last dimension 1 (one value per row). An
// input is a row value when its shape broadcasts to that row shape; a reduction's value
// is a row value; expand's is full; any other step's is a row value when all its
// operands are. An output has its register's shape. Kernels compute one row at a time,
// each reduction in the order the backend's own `sum` kernel adds a row, so a fused
// program gives the unfused graph's bits on every backend.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/op_catalog.h"

namespace loom {

struct ElementwiseStep {
  OpId op;
  // Registers: [0, num_inputs) are the fused op's inputs, num_inputs + k is step k's value.
  std::array<int, 2> args{-1, -1};
  double alpha = 1.0;  // scale's factor
};

// At most this many outputs per fused node (a CUDA launch carries their addresses).
inline constexpr int kMaxFusedOutputs = 8;

struct ElementwiseProgram {
  int num_inputs = 0;
  std::vector<ElementwiseStep> steps;
  // Registers the op writes, in the order of its outputs. Empty: the last step's value
  // alone. A chain whose intermediate is also read after the chain writes it too.
  std::vector<int> outputs;

  // The registers written (outputs, or the last step's when outputs is empty).
  std::vector<int> output_registers() const;
  // e.g. "mul(x0, add(erf(div(x0, x1)), x2))": each output as an expression of the
  // inputs; several are separated by "; ".
  std::string describe() const;
  bool reduces() const;  // has a row reduction step
};

// Ops a fused_elementwise program may hold: unary and binary f32 ops that compute each
// output element from the same element of their (broadcast) operands.
bool fusable_elementwise(OpId op);
// sum and mean: as a program's step, a reduction over the last axis of the program's shape.
bool row_reduction(OpId op);
// Their operand count (1 or 2).
int elementwise_arity(OpId op);

// Which registers (inputs, then steps) of `program` over inputs of `input_shapes` hold
// row values (one per row of `shape`, see above). All false without reductions.
std::vector<bool> row_registers(const ElementwiseProgram& program,
                                std::span<const Shape> input_shapes, const Shape& shape);
// `shape` with its last dimension 1: the shape of a row value.
Shape row_shape(const Shape& shape);
// The shape of each output of the op: attrs.shape, or the row shape for a row value.
std::vector<Shape> fused_output_shapes(const ElementwiseProgram& program,
                                       std::span<const Shape> input_shapes, const Shape& shape);

// The output's index space with adjacent dimensions merged wherever every input steps
// through both alike (size-1 dimensions dropped first), so that a kernel walks few
// dimensions: usually one or two remain. dims is never empty (a single element: {1}).
struct BroadcastSpace {
  std::vector<std::int64_t> dims;                  // outer ..., inner
  std::vector<std::vector<std::int64_t>> strides;  // per input, per dim (0: repeated)
};
BroadcastSpace collapse_broadcast(const Shape& out, std::span<const Tensor> inputs);

// How a kernel reads input k of a collapsed space: at the output's index (same layout),
// at its first element (one value), or through the dimensions and its strides.
enum class InputAccess { same, scalar, strided };
InputAccess input_access(const BroadcastSpace& space, std::size_t k);

// Throws loom::Error naming the problem when `program` is malformed or an input does not
// broadcast to `shape` (the op's shape inference).
void check_elementwise_program(const ElementwiseProgram* program, std::span<const Tensor> inputs,
                               const Shape& shape);
// The same checks for matmul_elementwise, whose input 0 is the product (of
// `product_shape`) and whose other inputs are `rest`: the program may not reduce rows,
// and the product must have the chain's shape (the kernel writes the chain's outputs
// where the GEMM would have written its product).
void check_matmul_elementwise_program(const ElementwiseProgram* program, const Shape& product_shape,
                                      std::span<const Tensor> rest, const Shape& shape);

}  // namespace loom
