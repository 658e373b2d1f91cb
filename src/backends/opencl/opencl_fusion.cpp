// backends/opencl/opencl_fusion.cpp — fused elementwise chains: OpenCL C generated at run
// time for each chain the graph's fusion pass makes, compiled once, and GEMM epilogues.
#include "backends/opencl/opencl_backend.h"

#include <clblast.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "backends/device_ops.h"
#include "backends/kernel_table.h"
#include "core/broadcast.h"
#include "core/error.h"
#include "core/fused_elementwise.h"

#include "backends/opencl/kernels.cl.h"
#include "backends/opencl/opencl_backend_internal.h"

namespace loom::opencl {

using namespace detail;

namespace {

constexpr int kFusedRank = 4;  // collapsed dimensions a generated kernel walks

std::string float_literal(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%af", static_cast<double>(static_cast<float>(value)));
  return text;
}

// Each step as the unfused kernel's expression (kernels.cl; binary, unary, unary_backward).
std::string step_expression(const ElementwiseStep& s, const std::string& a, const std::string& b) {
  switch (s.op) {
    case OpId::add:
      return a + " + " + b;
    case OpId::sub:
      return a + " - " + b;
    case OpId::mul:
      return a + " * " + b;
    case OpId::div:
      return a + " / " + b;
    case OpId::scale:
      return float_literal(s.alpha) + " * " + a;
    case OpId::exp:
      return "exp(" + a + ")";
    case OpId::log:
      return "log(" + a + ")";
    case OpId::tanh:
      return "tanh(" + a + ")";
    case OpId::sqrt:
      return "sqrt(" + a + ")";
    case OpId::erf:
      return "loom_erf(" + a + ")";
    case OpId::relu:
      return a + " > 0.0f ? " + a + " : 0.0f";
    case OpId::gelu:
      return "gelu_tanh(" + a + ")";
    case OpId::relu_backward:
      return b + " > 0.0f ? " + a + " : 0.0f";
    case OpId::gelu_backward:
      return a + " * gelu_tanh_grad(" + b + ")";
    case OpId::tanh_backward:
      return a + " * (1.0f - " + b + " * " + b + ")";
    case OpId::expand:
      return a;
    default:
      break;
  }
  throw Error("opencl fused_elementwise: no expression for " + std::string(op_name(s.op)));
}

// How the chain kernel without reductions reads an input of the collapsed space, finer
// than InputAccess: a strided input that walks only the inner dimension, at unit stride (a
// bias row broadcast over the rows), reads at the column; one that does not move along the
// inner dimension reads one value per row.
enum class ChainRead : char { same = 's', scalar = 'c', inner = 'i', outer = 'o', strided = 'g' };

ChainRead chain_read(const BroadcastSpace& space, std::size_t k) {
  switch (input_access(space, k)) {
    case InputAccess::same:
      return ChainRead::same;
    case InputAccess::scalar:
      return ChainRead::scalar;
    case InputAccess::strided:
      break;
  }
  const std::vector<std::int64_t>& strides = space.strides[k];
  if (strides.back() == 0)
    return ChainRead::outer;
  for (std::size_t d = 0; d + 1 < strides.size(); ++d)
    if (strides[d] != 0)
      return ChainRead::strided;
  return strides.back() == 1 ? ChainRead::inner : ChainRead::strided;
}

// The kernel for one chain and one way of reading its inputs: a two-dimensional range,
// the collapsed space's inner dimension by its other dimensions together (rows), one
// work-item per output element. An index that depends on the row alone is the same for
// every work-item of a row, so a CPU device's compiler hoists it out of the loop over the
// columns and vectorizes that loop; a 64-bit division per element kept it scalar (3x
// slower on PoCL). `index_type` is uint where every index fits in 31 bits, else ulong.
// Each step a statement of its own, with contraction off, so no multiply and add of two
// steps become one fma that the unfused kernels would not compute.
// A chain kernel's parameters after its own: the outputs, the collapsed space's
// dimensions, then inputs `first`.. (a strided one with its four strides); and the same
// as the names a call passes on.
struct ChainParameters {
  std::string declared, passed;
};
ChainParameters chain_parameters(const ElementwiseProgram& program,
                                 const std::vector<ChainRead>& reads, std::size_t first) {
  ChainParameters p;
  auto add = [&](const std::string& type, const std::string& name) {
    p.declared += (p.declared.empty() ? "" : ", ") + type + " " + name;
    p.passed += (p.passed.empty() ? "" : ", ") + name;
  };
  for (std::size_t k = 0; k < program.output_registers().size(); ++k) {
    add("__global float*", "y" + std::to_string(k));
    add("const ulong", "y" + std::to_string(k) + "_off");
  }
  for (const char* d : {"d1", "d2", "d3"})
    add("const ulong", d);
  for (std::size_t k = first; k < reads.size(); ++k) {
    const std::string n = std::to_string(k);
    add("__global const float*", "x" + n);
    add("const ulong", "o" + n);
    if (reads[k] == ChainRead::outer || reads[k] == ChainRead::strided)
      for (int d = 0; d < 4; ++d)
        add("const ulong", "s" + n + "_" + std::to_string(d));
  }
  return p;
}

// A chain's statements at element i (its column col and row in the collapsed space):
// the row coordinates where an input needs them, inputs `first`.. read, each step, each
// output written.
std::string chain_statements(const ElementwiseProgram& program, const std::vector<ChainRead>& reads,
                             const std::string& t, std::size_t first) {
  std::string body;
  bool by_row = false;
  for (std::size_t k = first; k < reads.size(); ++k)
    by_row = by_row || reads[k] == ChainRead::outer || reads[k] == ChainRead::strided;
  if (by_row)
    body += "  const " + t + " c2 = row % (" + t + ")d2, c1 = row / (" + t + ")d2 % (" + t +
            ")d1, c0 = row / ((" + t + ")d2 * (" + t + ")d1);\n";
  for (std::size_t k = first; k < reads.size(); ++k) {
    const std::string n = std::to_string(k);
    std::string index = "i";
    const std::string s = "(" + t + ")s" + n + "_";
    if (reads[k] == ChainRead::scalar) {
      index = "0";
    } else if (reads[k] == ChainRead::inner) {
      index = "col";
    } else if (reads[k] == ChainRead::outer || reads[k] == ChainRead::strided) {
      index = "c0 * " + s + "0 + c1 * " + s + "1 + c2 * " + s + "2";
      if (reads[k] == ChainRead::strided)
        index += " + col * " + s + "3";
    }
    body += "  const float r" + n + " = x" + n + "[o" + n + " + " + index + "];\n";
  }
  const int inputs = program.num_inputs;
  for (std::size_t k = 0; k < program.steps.size(); ++k) {
    const ElementwiseStep& s = program.steps[k];
    const std::string a = "r" + std::to_string(s.args[0]);
    const std::string b = s.args[1] >= 0 ? "r" + std::to_string(s.args[1]) : "";
    body += "  const float r" + std::to_string(inputs + static_cast<int>(k)) + " = " +
            step_expression(s, a, b) + ";\n";
  }
  const std::vector<int> written = program.output_registers();
  for (std::size_t k = 0; k < written.size(); ++k)
    body += "  y" + std::to_string(k) + "[y" + std::to_string(k) + "_off + i] = r" +
            std::to_string(written[k]) + ";\n";
  return body;
}

std::string fused_source(const ElementwiseProgram& program, const std::vector<ChainRead>& reads,
                         const std::string& index_type) {
  const std::string& t = index_type;
  const std::string body =
      "  const " + t + " col = get_global_id(0), row = get_global_id(1);\n  const " + t +
      " i = row * (" + t + ")d3 + col;\n" + chain_statements(program, reads, t, 0);
  return std::string(kElementwiseSource) + "\n__kernel void fused(" +
         chain_parameters(program, reads, 0).declared + ") {\n#pragma OPENCL FP_CONTRACT OFF\n" +
         body + "}\n";
}

// The GEMM kernels (gemm.cl) with a chain on each value of the product (matmul_elementwise):
// loom_epilogue computes the chain at the product's element i, its input 0 the value
// (register r0, never stored), and the kernels' store hooks call it instead of writing C.
std::string gemm_epilogue_source(const ElementwiseProgram& program,
                                 const std::vector<ChainRead>& reads,
                                 const std::string& index_type) {
  const std::string& t = index_type;
  const ChainParameters p = chain_parameters(program, reads, 1);
  std::string source =
      std::string(kElementwiseSource) + "\nvoid loom_epilogue(const " + t + " i, const float r0, " +
      p.declared + ") {\n#pragma OPENCL FP_CONTRACT OFF\n  const " + t + " col = i % (" + t +
      ")d3, row = i / (" + t + ")d3;\n" + chain_statements(program, reads, t, 1) + "}\n";
  source += "#define LOOM_GEMM_EXTRA_ARGS , " + p.declared + "\n";
  source += "#define LOOM_GEMM_STORE(index, col, value) loom_epilogue((" + t +
            ")(c_off + (index)), (value), " + p.passed + ")\n";
  source += "#define LOOM_GEMM_STORE8(index, col, value) do { const float8 v_ = (value); const " +
            t + " e_ = (" + t + ")(c_off + (index));";
  for (int lane = 0; lane < 8; ++lane)
    source += " loom_epilogue(e_ + " + std::to_string(lane) + ", v_.s" + std::to_string(lane) +
              ", " + p.passed + ");";
  source += " } while (0)\n";
  return source + kGemmSource;
}

// A program with row reductions: one work-item per row. Row values are computed once;
// each reduction is a loop over the row that computes the full steps before it and adds
// its operand in index order in a float, as reduce_rows adds a row; a last loop computes
// every full step and writes the full outputs.
//
// `aligned`: the collapsed space's inner dimension is the row (its length is cols), so an
// element's outer coordinates are the row's, computed once per work-item, and its inner
// one is the column: no division per element. Else each element's coordinates are
// computed from its index, in `index_type` (uint where every index fits in 31 bits).
std::string fused_rows_source(const ElementwiseProgram& program,
                              const std::vector<InputAccess>& access, const std::vector<bool>& row,
                              bool aligned, const std::string& index_type) {
  const std::string& t = index_type;
  const std::vector<int> written = program.output_registers();
  const int inputs = program.num_inputs;
  const int steps = static_cast<int>(program.steps.size());
  std::string args;
  for (std::size_t k = 0; k < written.size(); ++k)
    args +=
        "__global float* y" + std::to_string(k) + ", const ulong y" + std::to_string(k) + "_off, ";
  args += "const ulong d1, const ulong d2, const ulong d3, const ulong cols, const float inv_cols";
  bool strided = false;
  for (std::size_t k = 0; k < access.size(); ++k) {
    const std::string n = std::to_string(k);
    args += ", __global const float* x" + n + ", const ulong o" + n;
    if (access[k] == InputAccess::strided) {
      args += ", const ulong s" + n + "_0, const ulong s" + n + "_1, const ulong s" + n +
              "_2, const ulong s" + n + "_3";
      strided = true;
    }
  }
  auto read_input = [&](std::size_t k, const std::string& indent) {
    const std::string n = std::to_string(k);
    std::string index = "i";
    if (access[k] == InputAccess::scalar)
      index = "0";
    else if (access[k] == InputAccess::strided)
      index = "c0 * (" + t + ")s" + n + "_0 + c1 * (" + t + ")s" + n + "_1 + c2 * (" + t + ")s" +
              n + "_2 + c3 * (" + t + ")s" + n + "_3";
    return indent + "const float r" + n + " = x" + n + "[o" + n + " + " + index + "];\n";
  };
  auto coords = [&](const std::string& indent, const std::string& column) {
    if (!strided)
      return std::string();
    if (aligned)
      return indent + "const " + t + " c3 = " + column + ";\n";
    return indent + "const " + t + " c3 = i % (" + t + ")d3, c2 = i / (" + t + ")d3 % (" + t +
           ")d2, c1 = i / ((" + t + ")d3 * (" + t + ")d2) % (" + t + ")d1, c0 = i / ((" + t +
           ")d3 * (" + t + ")d2 * (" + t + ")d1);\n";
  };
  auto step_line = [&](int k, const std::string& indent) {
    const ElementwiseStep& s = program.steps[k];
    const std::string a = "r" + std::to_string(s.args[0]);
    const std::string b = s.args[1] >= 0 ? "r" + std::to_string(s.args[1]) : "";
    return indent + "const float r" + std::to_string(inputs + k) + " = " +
           step_expression(s, a, b) + ";\n";
  };
  // Row inputs: read once, at the row's first element.
  std::string body = "  const " + t + " r_row = get_global_id(0);\n";
  if (strided && aligned)
    body += "  const " + t + " c2 = r_row % (" + t + ")d2, c1 = r_row / (" + t + ")d2 % (" + t +
            ")d1, c0 = r_row / ((" + t + ")d2 * (" + t + ")d1);\n";
  for (std::size_t k = 0; k < access.size(); ++k)
    if (row[k])
      body += "  float r" + std::to_string(k) + ";\n";
  body += "  {\n    const " + t + " i = r_row * (" + t + ")cols;\n" + coords("    ", "0");
  for (std::size_t k = 0; k < access.size(); ++k)
    if (row[k]) {
      std::string line = read_input(k, "    ");
      body += line.replace(line.find("const float "), 12, "");
    }
  body += "  }\n";
  int next_row_step = 0;
  for (int phase = 0; phase <= steps; ++phase) {
    const bool last = phase == steps;
    if (!last && !row_reduction(program.steps[phase].op))
      continue;
    for (; next_row_step < phase; ++next_row_step)
      if (row[inputs + next_row_step] && !row_reduction(program.steps[next_row_step].op))
        body += step_line(next_row_step, "  ");
    const std::string acc = "acc" + std::to_string(phase);
    if (!last)
      body += "  float " + acc + " = 0.0f;\n";
    body += "  for (" + t + " j = 0; j < (" + t + ")cols; ++j) {\n    const " + t +
            " i = r_row * (" + t + ")cols + j;\n" + coords("    ", "j");
    for (std::size_t k = 0; k < access.size(); ++k)
      if (!row[k])
        body += read_input(k, "    ");
    for (int k = 0; k < phase; ++k)
      if (!row[inputs + k])
        body += step_line(k, "    ");
    if (!last) {
      body += "    " + acc + " = " + acc + " + r" + std::to_string(program.steps[phase].args[0]) +
              ";\n";
    } else {
      for (std::size_t k = 0; k < written.size(); ++k)
        if (!row[written[k]])
          body += "    y" + std::to_string(k) + "[y" + std::to_string(k) + "_off + i] = r" +
                  std::to_string(written[k]) + ";\n";
    }
    body += "  }\n";
    if (!last)  // reduce_rows scales by 1; a mean's 1/cols as the scale kernel multiplies
      body += "  const float r" + std::to_string(inputs + phase) + " = " +
              (program.steps[phase].op == OpId::mean ? "inv_cols * " + acc : acc + " * 1.0f") +
              ";\n";
  }
  for (std::size_t k = 0; k < written.size(); ++k)
    if (row[written[k]])
      body += "  y" + std::to_string(k) + "[y" + std::to_string(k) + "_off + r_row] = r" +
              std::to_string(written[k]) + ";\n";
  return std::string(kElementwiseSource) + "\n__kernel void fused(" + args +
         ") {\n#pragma OPENCL FP_CONTRACT OFF\n" + body + "}\n";
}

}  // namespace

// A chain whose collapsed index space has at most kFusedRank dimensions (asked without
// tensors, as the graph's fusion pass does, it accepts: any f32 chain may be fused).
bool detail::fused_rank_fits(const OpCall& call) {
  return call.inputs.empty() || collapse_broadcast(call.attrs.shape, call.inputs).dims.size() <=
                                    static_cast<std::size_t>(kFusedRank);
}

bool OpenClBackend::narrow_index(const BroadcastSpace& space, std::size_t elements) const {
  constexpr auto kLimit = static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max());
  bool narrow = fused_index_ == FusedIndex::narrowest && elements <= kLimit;
  for (const std::vector<std::int64_t>& strides : space.strides) {
    std::uint64_t last = 0;  // the largest index the input is read at
    for (std::size_t d = 0; d < space.dims.size(); ++d)
      last +=
          static_cast<std::uint64_t>(space.dims[d] - 1) * static_cast<std::uint64_t>(strides[d]);
    narrow = narrow && last <= kLimit;
  }
  return narrow;
}

namespace {
// The collapsed space's dimensions padded at the front to the kFusedRank a chain kernel
// walks; more is an error naming `op`.
std::vector<cl_ulong> padded_dims(const BroadcastSpace& space, const char* op) {
  check(space.dims.size() <= static_cast<std::size_t>(kFusedRank), [&] {
    return "opencl " + std::string(op) + ": " + std::to_string(space.dims.size()) +
           " dimensions after merging, the kernel walks " + std::to_string(kFusedRank);
  });
  const std::size_t pad = kFusedRank - space.dims.size();
  std::vector<cl_ulong> dims(kFusedRank, 1);
  for (std::size_t d = 0; d < space.dims.size(); ++d)
    dims[pad + d] = static_cast<cl_ulong>(space.dims[d]);
  return dims;
}

// A chain kernel's arguments for input k of `space`: its buffer and offset, then its four
// strides (padded at the front) when the kernel reads it through them.
void set_chain_input(cl_kernel kernel, cl_uint& arg, const Tensor& input,
                     const BroadcastSpace& space, std::size_t k, bool takes_strides) {
  set_arg(kernel, arg++, mem_of(input));
  set_arg(kernel, arg++, off_of(input));
  if (!takes_strides)
    return;
  const std::size_t pad = kFusedRank - space.dims.size();
  std::vector<cl_ulong> strides(kFusedRank, 0);
  for (std::size_t d = 0; d < space.dims.size(); ++d)
    strides[pad + d] = static_cast<cl_ulong>(space.strides[k][d]);
  for (cl_ulong stride : strides)
    set_arg(kernel, arg++, stride);
}
}  // namespace

void OpenClBackend::matmul_elementwise(const OpCall& call) {
  const ElementwiseProgram& program = *call.attrs.program;
  Tensor& y = call.outputs[0];
  if (y.numel() == 0)
    return;
  // The chain's input 0 is the product, laid out as the outputs are: the first output
  // stands in for it where the chain's space is worked out.
  std::vector<Tensor> chain_inputs{y};
  chain_inputs.insert(chain_inputs.end(), call.inputs.begin() + 2, call.inputs.end());
  if (!uses_gemm_nt(call.inputs[0], call.inputs[1], y)) {
    // CLBlast's product, then the chain: the bits of matmul then fused_elementwise.
    gemm_calls_[static_cast<std::size_t>(Gemm::clblast)].fetch_add(1, std::memory_order_relaxed);
    Tensor products[] = {Tensor::empty(call.attrs.shape, DType::f32, *this)};
    matmul_clblast(OpCall{OpId::matmul, call.inputs.first(2), products, call.attrs});
    chain_inputs[0] = products[0];
    fused(OpCall{OpId::fused_elementwise, chain_inputs, call.outputs, call.attrs});
    return;
  }
  const BroadcastSpace space = collapse_broadcast(call.attrs.shape, chain_inputs);
  const std::vector<cl_ulong> dims = padded_dims(space, "matmul_elementwise");
  std::vector<ChainRead> reads;
  std::string key;
  for (std::size_t k = 0; k < chain_inputs.size(); ++k) {
    reads.push_back(chain_read(space, k));
    key += static_cast<char>(reads.back());
  }
  const bool narrow = narrow_index(space, count(y));
  const std::string index_type = narrow ? "uint" : "ulong";
  key += index_type;
  const std::array<cl_kernel, 3>* kernels = nullptr;
  {
    std::lock_guard lock(mutex_);
    auto known = epilogue_by_program_.find({&program, key});
    if (known == epilogue_by_program_.end()) {
      const std::string source = gemm_epilogue_source(program, reads, index_type);
      auto found = epilogue_kernels_.find(source);
      if (found == epilogue_kernels_.end()) {
        EpilogueKernels made{compile(source, "a GEMM with a chain (" + program.describe() + ")"),
                             Kernel(), Kernel(), Kernel()};
        Kernel* slots[] = {&made.nn, &made.tn, &made.nt};
        const char* names[] = {"gemm_nn", "gemm_tn", "gemm_nt"};
        for (int i = 0; i < 3; ++i) {
          cl_int err = CL_SUCCESS;
          *slots[i] = Kernel(clCreateKernel(made.program.get(), names[i], &err));
          ok(err, std::string("clCreateKernel ") + names[i]);
        }
        found = epilogue_kernels_.emplace(source, std::move(made)).first;
      }
      const EpilogueKernels& made = found->second;
      const std::array<cl_kernel, 3> three{made.nn.get(), made.tn.get(), made.nt.get()};
      known = epilogue_by_program_
                  .emplace(std::make_pair(&program, key), std::make_pair(call.attrs.program, three))
                  .first;
    }
    kernels = &known->second.second;
  }
  auto set_args = [&](cl_kernel k, cl_uint arg) {
    for (const Tensor& out : call.outputs) {
      set_arg(k, arg++, mem_of(out));
      set_arg(k, arg++, off_of(out));
    }
    for (int d = 1; d < kFusedRank; ++d)
      set_arg(k, arg++, dims[d]);
    for (std::size_t i = 1; i < chain_inputs.size(); ++i)
      set_chain_input(k, arg, chain_inputs[i], space, i,
                      reads[i] == ChainRead::outer || reads[i] == ChainRead::strided);
  };
  gemm_calls_[static_cast<std::size_t>(Gemm::gemm_nt)].fetch_add(1, std::memory_order_relaxed);
  fused_calls_[narrow ? 0 : 1].fetch_add(1, std::memory_order_relaxed);
  matmul_dot(OpCall{OpId::matmul, call.inputs.first(2), call.outputs.first(1), call.attrs},
             GemmTail{nullptr, kernels, set_args});
}

void OpenClBackend::fused(const OpCall& call) {
  const ElementwiseProgram& program = *call.attrs.program;
  Tensor& y = call.outputs[0];
  const BroadcastSpace space = collapse_broadcast(call.attrs.shape, call.inputs);
  const std::vector<cl_ulong> dims = padded_dims(space, "fused_elementwise");
  // With row reductions: one work-item per row of the program's shape. Without: the
  // collapsed space's inner dimension by its rows (fused_source).
  const bool rows = program.reduces();
  std::vector<InputAccess> access;  // the kernel with row reductions
  std::vector<ChainRead> reads;     // the kernel without
  std::string access_key;
  for (std::size_t k = 0; k < call.inputs.size(); ++k) {
    access.push_back(input_access(space, k));
    reads.push_back(chain_read(space, k));
    access_key += rows ? static_cast<char>('0' + static_cast<int>(access.back()))
                       : static_cast<char>(reads.back());
  }
  const bool narrow = narrow_index(space, count(y));
  const std::string index_type = narrow ? "uint" : "ulong";
  const std::int64_t cols = call.attrs.shape.empty() ? 1 : call.attrs.shape.back();
  const bool aligned = rows && static_cast<std::int64_t>(dims[kFusedRank - 1]) == cols;
  access_key += index_type + (aligned ? "a" : "");
  std::vector<bool> row;
  if (rows) {
    std::vector<Shape> shapes;
    for (const Tensor& x : call.inputs)
      shapes.push_back(x.shape());
    row = row_registers(program, shapes, call.attrs.shape);
  }
  const std::size_t row_count =
      cols == 0 ? 0 : static_cast<std::size_t>(shape_numel(call.attrs.shape) / cols);
  const std::size_t global[2] = {rows ? row_count : static_cast<std::size_t>(dims[kFusedRank - 1]),
                                 rows ? 1 : static_cast<std::size_t>(dims[0] * dims[1] * dims[2])};
  if (count(y) == 0 || global[0] == 0)
    return;
  std::lock_guard lock(mutex_);
  // A replayed node passes the same program each step: find its kernel by the program's
  // address (the entry keeps the program alive, so the address is never reused) before
  // generating any source; the source keys the built kernels, shared by equal chains.
  auto known = fused_by_program_.find({&program, access_key});
  if (known == fused_by_program_.end()) {
    const std::string source = rows ? fused_rows_source(program, access, row, aligned, index_type)
                                    : fused_source(program, reads, index_type);
    auto found = fused_kernels_.find(source);
    if (found == fused_kernels_.end()) {
      Program built = compile(source, "a fused kernel (" + program.describe() + ")");
      cl_int err = CL_SUCCESS;
      Kernel kernel(clCreateKernel(built.get(), "fused", &err));
      ok(err, "clCreateKernel fused");
      found =
          fused_kernels_.emplace(source, FusedKernel{std::move(built), std::move(kernel)}).first;
    }
    known = fused_by_program_
                .emplace(std::make_pair(&program, access_key),
                         std::make_pair(call.attrs.program, found->second.kernel.get()))
                .first;
  }
  cl_kernel k = known->second.second;
  cl_uint arg = 0;
  for (const Tensor& out : call.outputs) {
    set_arg(k, arg++, mem_of(out));
    set_arg(k, arg++, off_of(out));
  }
  for (int d = 1; d < kFusedRank; ++d)
    set_arg(k, arg++, dims[d]);
  if (rows) {
    set_arg(k, arg++, static_cast<cl_ulong>(cols));
    set_arg(k, arg++, static_cast<cl_float>(1.0 / static_cast<double>(cols)));
  }
  for (std::size_t i = 0; i < call.inputs.size(); ++i)
    set_chain_input(k, arg, call.inputs[i], space, i,
                    rows ? access[i] == InputAccess::strided
                         : reads[i] == ChainRead::outer || reads[i] == ChainRead::strided);
  ok(clEnqueueNDRangeKernel(current_queue(), k, rows ? 1 : 2, nullptr, global, nullptr, 0, nullptr,
                            nullptr),
     "clEnqueueNDRangeKernel fused");
  fused_calls_[narrow ? 0 : 1].fetch_add(1, std::memory_order_relaxed);
}

}  // namespace loom::opencl
