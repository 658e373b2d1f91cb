// The fused elementwise op: its program's checks and description, and its reference
// kernel (each step by that op's own reference kernel). The decomposition is in
// decompositions.cpp, fast kernels with the backends.
#include "core/fused_elementwise.h"

#include "core/error.h"
#include "core/reference_util.h"

namespace loom {

bool fusable_elementwise(OpId op) {
  switch (op) {
    case OpId::add:
    case OpId::sub:
    case OpId::mul:
    case OpId::div:
    case OpId::scale:
    case OpId::exp:
    case OpId::log:
    case OpId::tanh:
    case OpId::sqrt:
    case OpId::erf:
    case OpId::relu:
    case OpId::gelu:
    case OpId::relu_backward:
    case OpId::gelu_backward:
    case OpId::tanh_backward:
    case OpId::expand:
      return true;
    default:
      return false;
  }
}

bool row_reduction(OpId op) {
  return op == OpId::sum || op == OpId::mean;
}

int elementwise_arity(OpId op) {
  const int n = op_info(op).num_inputs;
  return n < 1 ? 1 : n;
}

namespace {

// numpy rules, one way: `in` repeats into `out` without changing it.
bool broadcasts_to(const Shape& in, const Shape& out) {
  if (in.size() > out.size())
    return false;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::int64_t d = in[in.size() - 1 - i];
    if (d != 1 && d != out[out.size() - 1 - i])
      return false;
  }
  return true;
}

}  // namespace

Shape row_shape(const Shape& shape) {
  Shape row = shape;
  if (!row.empty())
    row.back() = 1;
  return row;
}

bool ElementwiseProgram::reduces() const {
  for (const ElementwiseStep& s : steps)
    if (row_reduction(s.op))
      return true;
  return false;
}

std::vector<bool> row_registers(const ElementwiseProgram& program,
                                std::span<const Shape> input_shapes, const Shape& shape) {
  std::vector<bool> row(static_cast<std::size_t>(program.num_inputs) + program.steps.size(), false);
  if (!program.reduces())
    return row;
  const Shape rows = row_shape(shape);
  for (std::size_t i = 0; i < input_shapes.size() && i < row.size(); ++i)
    row[i] = broadcasts_to(input_shapes[i], rows);
  for (std::size_t k = 0; k < program.steps.size(); ++k) {
    const ElementwiseStep& s = program.steps[k];
    bool value = !(s.op == OpId::expand);
    if (row_reduction(s.op)) {
      value = true;
    } else if (value) {
      for (int a = 0; a < elementwise_arity(s.op); ++a)
        value = value && s.args[a] >= 0 && static_cast<std::size_t>(s.args[a]) < row.size() &&
                row[static_cast<std::size_t>(s.args[a])];
    }
    row[static_cast<std::size_t>(program.num_inputs) + k] = value;
  }
  return row;
}

std::vector<Shape> fused_output_shapes(const ElementwiseProgram& program,
                                       std::span<const Shape> input_shapes, const Shape& shape) {
  const std::vector<bool> row = row_registers(program, input_shapes, shape);
  std::vector<Shape> shapes;
  for (int r : program.output_registers())
    shapes.push_back(row[static_cast<std::size_t>(r)] ? row_shape(shape) : shape);
  return shapes;
}

namespace {

// Input `i` (numbered as the program reads it) is a defined f32 tensor that broadcasts to
// `shape`.
void check_program_input(const std::string& op, std::size_t i, const Tensor& input,
                         const Shape& shape) {
  check(input.defined() && input.dtype() == DType::f32, [&] {
    return op + ": input " + std::to_string(i) + " is " +
           (input.defined() ? input.describe() : std::string("undefined")) + ", expected f32";
  });
  check(broadcasts_to(input.shape(), shape), [&] {
    return op + ": input " + std::to_string(i) + " " + input.describe() +
           " does not broadcast to the output shape " + shape_str(shape);
  });
}

void check_program_count(const std::string& op, const ElementwiseProgram* program,
                         std::size_t inputs) {
  check(program != nullptr, [&] { return op + ": no program (attrs.program is unset)"; });
  check(!program->steps.empty(), [&] { return op + ": the program has no steps"; });
  check(program->num_inputs == static_cast<int>(inputs), [&] {
    return op + ": the program reads " + std::to_string(program->num_inputs) + " inputs, got " +
           std::to_string(inputs);
  });
}

// The steps and outputs of a program over inputs of `input_shapes` (their count checked).
void check_program_steps(const std::string& op, const ElementwiseProgram* program,
                         std::span<const Shape> input_shapes, const Shape& shape);

}  // namespace

void check_elementwise_program(const ElementwiseProgram* program, std::span<const Tensor> inputs,
                               const Shape& shape) {
  const std::string op = "fused_elementwise";
  check_program_count(op, program, inputs.size());
  std::vector<Shape> shapes;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    check_program_input(op, i, inputs[i], shape);
    shapes.push_back(inputs[i].shape());
  }
  check_program_steps(op, program, shapes, shape);
}

void check_matmul_elementwise_program(const ElementwiseProgram* program, const Shape& product_shape,
                                      std::span<const Tensor> rest, const Shape& shape) {
  const std::string op = "matmul_elementwise";
  check_program_count(op, program, rest.size() + 1);
  check(product_shape == shape, [&] {
    return op + ": the product " + shape_str(product_shape) + " is not the chain's shape " +
           shape_str(shape);
  });
  check(!program->reduces(), [&] { return op + ": the program reduces rows, which it may not"; });
  std::vector<Shape> shapes{product_shape};
  for (std::size_t i = 0; i < rest.size(); ++i) {
    check_program_input(op, i + 1, rest[i], shape);
    shapes.push_back(rest[i].shape());
  }
  check_program_steps(op, program, shapes, shape);
}

namespace {
void check_program_steps(const std::string& op, const ElementwiseProgram* program,
                         std::span<const Shape> input_shapes, const Shape& shape) {
  for (std::size_t k = 0; k < program->steps.size(); ++k) {
    const ElementwiseStep& s = program->steps[k];
    const std::string where = op + ": step " + std::to_string(k);
    check(fusable_elementwise(s.op) || row_reduction(s.op), [&] {
      return where + " is " + std::string(op_name(s.op)) +
             ", which is not an elementwise op or row reduction a program may hold";
    });
    const int arity = elementwise_arity(s.op);
    const int registers = program->num_inputs + static_cast<int>(k);
    for (int a = 0; a < 2; ++a) {
      if (a < arity)
        check(s.args[a] >= 0 && s.args[a] < registers, [&] {
          return where + " (" + std::string(op_name(s.op)) + ") reads register " +
                 std::to_string(s.args[a]) + ", expected one of the " + std::to_string(registers) +
                 " defined before it";
        });
      else
        check(s.args[a] == -1, [&] {
          return where + " (" + std::string(op_name(s.op)) + ") takes " + std::to_string(arity) +
                 " operand, got a second";
        });
    }
  }
  if (program->reduces()) {
    check(!shape.empty(),
          [&] { return op + ": a program with a row reduction needs a shape of rank >= 1"; });
    const std::vector<bool> row = row_registers(*program, input_shapes, shape);
    for (std::size_t k = 0; k < program->steps.size(); ++k)
      if (row_reduction(program->steps[k].op))
        check(!row[static_cast<std::size_t>(program->steps[k].args[0])] || shape.back() == 1, [&] {
          return op + ": step " + std::to_string(k) + " (" +
                 std::string(op_name(program->steps[k].op)) +
                 ") reduces a row value; a reduction reads a value of the full shape " +
                 shape_str(shape);
        });
  }
  const int registers = program->num_inputs + static_cast<int>(program->steps.size());
  check(program->outputs.size() <= static_cast<std::size_t>(kMaxFusedOutputs), [&] {
    return op + ": " + std::to_string(program->outputs.size()) + " outputs, at most " +
           std::to_string(kMaxFusedOutputs);
  });
  for (std::size_t k = 0; k < program->outputs.size(); ++k) {
    const int r = program->outputs[k];
    check(r >= program->num_inputs && r < registers, [&] {
      return op + ": output " + std::to_string(k) + " is register " + std::to_string(r) +
             ", expected a step's, in [" + std::to_string(program->num_inputs) + ", " +
             std::to_string(registers) + ")";
    });
    for (std::size_t j = 0; j < k; ++j)
      check(program->outputs[j] != r, [&] {
        return op + ": outputs " + std::to_string(j) + " and " + std::to_string(k) +
               " are both register " + std::to_string(r);
      });
  }
}

}  // namespace

BroadcastSpace collapse_broadcast(const Shape& out, std::span<const Tensor> inputs) {
  std::vector<Strides> input_strides;
  for (const Tensor& x : inputs)
    input_strides.push_back(broadcast_strides(x.shape(), out));
  BroadcastSpace space;
  space.strides.resize(inputs.size());
  for (std::size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1)
      continue;
    bool merge = !space.dims.empty();
    for (std::size_t i = 0; i < inputs.size() && merge; ++i)
      merge = space.strides[i].back() == input_strides[i][d] * out[d];
    if (merge) {
      space.dims.back() *= out[d];
      for (std::size_t i = 0; i < inputs.size(); ++i)
        space.strides[i].back() = input_strides[i][d];
    } else {
      space.dims.push_back(out[d]);
      for (std::size_t i = 0; i < inputs.size(); ++i)
        space.strides[i].push_back(input_strides[i][d]);
    }
  }
  if (space.dims.empty()) {
    space.dims.push_back(1);
    for (auto& s : space.strides)
      s.push_back(0);
  }
  return space;
}

InputAccess input_access(const BroadcastSpace& space, std::size_t k) {
  bool scalar = true, same = true;
  std::int64_t expected = 1;
  for (std::size_t d = space.dims.size(); d-- > 0;) {
    scalar = scalar && space.strides[k][d] == 0;
    same = same && space.strides[k][d] == expected;
    expected *= space.dims[d];
  }
  return same ? InputAccess::same : scalar ? InputAccess::scalar : InputAccess::strided;
}

std::vector<int> ElementwiseProgram::output_registers() const {
  if (!outputs.empty())
    return outputs;
  return {num_inputs + static_cast<int>(steps.size()) - 1};
}

std::string ElementwiseProgram::describe() const {
  std::vector<std::string> text;
  for (int i = 0; i < num_inputs; ++i)
    text.push_back("x" + std::to_string(i));
  for (const ElementwiseStep& s : steps) {
    std::string e = std::string(op_name(s.op)) + "(";
    for (int a = 0; a < elementwise_arity(s.op); ++a)
      e += (a ? ", " : "") + text[s.args[a]];
    text.push_back(e + ")");
  }
  std::string all;
  for (int r : output_registers())
    all += (all.empty() ? "" : "; ") + text[r];
  return all;
}

namespace reference {

// Each input broadcast to its register's shape (the output shape, or the row shape for a
// row value), then each step by its op's reference kernel on operands of its shape: a
// reduction by the reference sum or mean over the last axis.
void fused_elementwise(const OpCall& call) {
  const ElementwiseProgram& program = *call.attrs.program;
  const Shape& shape = call.attrs.shape;
  Backend& device = call.outputs[0].backend();
  std::vector<Shape> input_shapes;
  for (const Tensor& x : call.inputs)
    input_shapes.push_back(x.shape());
  const std::vector<bool> row = row_registers(program, input_shapes, shape);
  auto shape_of = [&](std::size_t r) { return row[r] ? row_shape(shape) : shape; };
  auto broadcast = [&](const Tensor& x, const Shape& to) {
    Attrs a;
    a.shape = to;
    std::array<Tensor, 1> in{x}, out{Tensor::empty(to, DType::f32, device)};
    expand(OpCall{OpId::expand, in, out, a});
    return out[0];
  };
  std::vector<Tensor> registers;
  for (std::size_t i = 0; i < call.inputs.size(); ++i)
    registers.push_back(broadcast(call.inputs[i], shape_of(i)));
  for (std::size_t k = 0; k < program.steps.size(); ++k) {
    const ElementwiseStep& s = program.steps[k];
    const Shape& to = shape_of(call.inputs.size() + k);
    Attrs step_attrs;
    step_attrs.shape = to;
    step_attrs.alpha = s.alpha;
    std::array<Tensor, 2> in;
    const int arity = elementwise_arity(s.op);
    for (int a = 0; a < arity; ++a)
      in[a] = row_reduction(s.op) ? registers[s.args[a]] : broadcast(registers[s.args[a]], to);
    if (row_reduction(s.op)) {
      step_attrs.axes = {static_cast<std::int64_t>(shape.size()) - 1};
      step_attrs.keepdim = true;
    }
    std::array<Tensor, 1> out{Tensor::empty(to, DType::f32, device)};
    op_info(s.op).reference(
        OpCall{s.op, std::span<const Tensor>(in.data(), static_cast<std::size_t>(arity)), out,
               step_attrs});
    registers.push_back(out[0]);
  }
  const std::vector<int> written = program.output_registers();
  for (std::size_t k = 0; k < written.size(); ++k) {
    Attrs a;
    a.shape = call.outputs[k].shape();
    std::array<Tensor, 1> in{registers[written[k]]}, out{call.outputs[k]};
    expand(OpCall{OpId::expand, in, out, a});
  }
}

// The product by the reference matmul, then the chain by the reference fused_elementwise
// with the product as its input 0.
void matmul_elementwise(const OpCall& call) {
  Backend& device = call.outputs[0].backend();
  std::array<Tensor, 1> product{Tensor::empty(call.attrs.shape, DType::f32, device)};
  matmul(OpCall{OpId::matmul, call.inputs.first(2), product, call.attrs});
  std::vector<Tensor> chain_inputs{product[0]};
  for (std::size_t i = 2; i < call.inputs.size(); ++i)
    chain_inputs.push_back(call.inputs[i]);
  fused_elementwise(OpCall{OpId::fused_elementwise, chain_inputs, call.outputs, call.attrs});
}

}  // namespace reference
}  // namespace loom
