// Fast CPU kernels, part 3: fused chains of elementwise ops (graph/fusion.cpp), and
// expand, which is such a chain of one step.
//
// One pass over the output in blocks of kBlock elements: each block's operands are read
// once (in place when contiguous, broadcast values spread into a small buffer), every
// step of the chain runs over the block while it sits in L1, and only the last step
// writes memory. Each step computes exactly what the unfused CPU kernel computes per
// element (the same float expressions), so a fused graph gives the unfused graph's bits.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/vec_math.h"
#include "core/error.h"
#include "core/fused_elementwise.h"
#include "core/reference_util.h"

namespace loom::cpu {
namespace {

constexpr std::int64_t kBlock = 512;            // floats per register: 2 KB
constexpr std::int64_t kParallelGrain = 16384;  // as the other elementwise kernels

template <class F>
void unary(float* d, const float* a, std::int64_t n, F f) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i)
    d[i] = f(a[i]);
}

template <class F>
void binary(float* d, const float* a, const float* b, std::int64_t n, F f) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i)
    d[i] = f(a[i], b[i]);
}

// One step over a block. The expressions are those of cpu_kernels.cpp (and of the
// reference kernels for sqrt and erf, which the CPU runs unfused).
void run_step(const ElementwiseStep& s, float* d, const float* a, const float* b, std::int64_t n) {
  switch (s.op) {
    case OpId::add:
      return binary(d, a, b, n, [](float x, float y) { return x + y; });
    case OpId::sub:
      return binary(d, a, b, n, [](float x, float y) { return x - y; });
    case OpId::mul:
      return binary(d, a, b, n, [](float x, float y) { return x * y; });
    case OpId::div:
      return binary(d, a, b, n, [](float x, float y) { return x / y; });
    case OpId::scale: {
      const float alpha = static_cast<float>(s.alpha);
      return unary(d, a, n, [alpha](float x) { return alpha * x; });
    }
    case OpId::exp:
      return unary(d, a, n, [](float x) { return std::exp(x); });
    case OpId::log:
      return unary(d, a, n, [](float x) { return std::log(x); });
    case OpId::tanh:
      return unary(d, a, n, [](float x) { return std::tanh(x); });
    case OpId::sqrt:
      return unary(d, a, n, [](float x) { return std::sqrt(x); });
    case OpId::erf:
      return unary(d, a, n, [](float x) { return std::erf(x); });
    case OpId::relu:
      return unary(d, a, n, [](float x) { return x > 0.0f ? x : 0.0f; });
    case OpId::gelu:
      return unary(d, a, n, [](float x) { return gelu_fast(x); });
    case OpId::relu_backward:
      return binary(d, a, b, n, [](float dy, float x) { return x > 0.0f ? dy : 0.0f; });
    case OpId::gelu_backward:
      return binary(d, a, b, n, [](float dy, float x) { return dy * gelu_grad_fast(x); });
    case OpId::tanh_backward:
      return binary(d, a, b, n, [](float dy, float y) { return dy * (1.0f - y * y); });
    case OpId::expand:
      return unary(d, a, n, [](float x) { return x; });
    default:
      break;
  }
  check(false,
        [&] { return "cpu fused_elementwise: no block kernel for " + std::string(op_name(s.op)); });
}

void run_program(const ElementwiseProgram& program, const OpCall& call) {
  Tensor& y = call.outputs[0];
  const std::int64_t n = y.numel();
  if (n == 0)
    return;
  const int inputs = program.num_inputs;
  const int steps = static_cast<int>(program.steps.size());
  std::vector<const float*> data;
  for (const Tensor& x : call.inputs)
    data.push_back(x.data<float>());
  const BroadcastSpace space = collapse_broadcast(y.shape(), call.inputs);
  const std::int64_t inner = space.dims.back();
  const std::int64_t rows = n / inner;
  const std::int64_t blocks_per_row = (inner + kBlock - 1) / kBlock;
  const std::int64_t chunks = rows * blocks_per_row;
  // Where each step writes: the output that takes its value, else its scratch block.
  std::vector<float*> out_of_step(static_cast<std::size_t>(steps), nullptr);
  const std::vector<int> written = program.output_registers();
  for (std::size_t k = 0; k < written.size(); ++k)
    out_of_step[static_cast<std::size_t>(written[k] - inputs)] = call.outputs[k].data<float>();
  const int outer_dims = static_cast<int>(space.dims.size()) - 1;
  const int threads = n > kParallelGrain ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(threads)
  {
    // Registers: one block per input (used when it is not read in place) and per step.
    std::vector<float> scratch(static_cast<std::size_t>((inputs + steps) * kBlock));
    std::vector<const float*> reg(static_cast<std::size_t>(inputs + steps));
#pragma omp for schedule(static)
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t row = c / blocks_per_row;
      const std::int64_t begin = (c % blocks_per_row) * kBlock;
      const std::int64_t len = std::min(kBlock, inner - begin);
      for (int i = 0; i < inputs; ++i) {
        const auto& st = space.strides[i];
        std::int64_t offset = 0, rest = row;
        for (int d = outer_dims - 1; d >= 0; --d) {
          offset += (rest % space.dims[d]) * st[d];
          rest /= space.dims[d];
        }
        const std::int64_t step = st.back();
        const float* src = data[i] + offset + begin * step;
        if (step == 1) {
          reg[i] = src;
          continue;
        }
        float* buffer = scratch.data() + i * kBlock;
        if (step == 0) {
          std::fill(buffer, buffer + len, *src);
        } else {
          for (std::int64_t j = 0; j < len; ++j)
            buffer[j] = src[j * step];
        }
        reg[i] = buffer;
      }
      for (int k = 0; k < steps; ++k) {
        const ElementwiseStep& s = program.steps[k];
        float* dst = out_of_step[k] != nullptr
                         ? out_of_step[k] + row * inner + begin
                         : scratch.data() + static_cast<std::size_t>(inputs + k) * kBlock;
        run_step(s, dst, reg[s.args[0]], s.args[1] >= 0 ? reg[s.args[1]] : nullptr, len);
        reg[inputs + k] = dst;
      }
    }
  }
}

// A program with row reductions (core/fused_elementwise.h). The rows are cut into
// blocks of at most kBlock elements: several whole rows when rows are short, else pieces
// of one row; blocks of rows run in parallel. A block's full values are computed as
// above; row values are one number per row of the block. Each reduction is a pass over
// the block's rows that computes the full steps before it and adds its operand to one
// double per row, element by element in index order, as the CPU's sum and mean kernels
// add a row; a last pass computes every full step and writes the full outputs. When a
// block holds whole rows, a pass computes only the steps the passes before it did not;
// pieces of long rows are recomputed by each pass instead of kept.
void run_row_program(const ElementwiseProgram& program, const OpCall& call) {
  const Shape& shape = call.attrs.shape;
  const std::int64_t cols = shape.back();
  const std::int64_t total = shape_numel(shape);
  if (total == 0)
    return;
  const std::int64_t rows = total / cols;
  const int inputs = program.num_inputs;
  const int steps = static_cast<int>(program.steps.size());
  const int registers = inputs + steps;
  std::vector<Shape> input_shapes;
  for (const Tensor& x : call.inputs)
    input_shapes.push_back(x.shape());
  const std::vector<bool> row = row_registers(program, input_shapes, shape);
  // Each input's element strides over `shape` (0 along the dimensions it repeats).
  const int rank = static_cast<int>(shape.size());
  std::vector<Strides> strides;
  std::vector<const float*> data;
  for (const Tensor& x : call.inputs) {
    strides.push_back(broadcast_strides(x.shape(), shape));
    data.push_back(x.data<float>());
  }
  std::vector<float*> out_of(static_cast<std::size_t>(registers), nullptr);
  const std::vector<int> written = program.output_registers();
  for (std::size_t k = 0; k < written.size(); ++k)
    out_of[static_cast<std::size_t>(written[k])] = call.outputs[k].data<float>();
  // A block: `group` whole rows of `len` = cols elements, or one row's piece of `len`.
  const std::int64_t group = cols >= kBlock ? 1 : kBlock / cols;
  const std::int64_t len = std::min(cols, kBlock);
  const std::int64_t groups = (rows + group - 1) / group;
  const bool single_block = len == cols;
  const float inv_cols = static_cast<float>(1.0 / static_cast<double>(cols));
  const int threads = total > kParallelGrain ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> scratch(static_cast<std::size_t>(registers * kBlock));
    std::vector<const float*> reg(static_cast<std::size_t>(registers));
    // Row values, `group` per register; each input's offset at (row, 0).
    std::vector<float> value(static_cast<std::size_t>(registers * group), 0.0f);
    std::vector<std::int64_t> base(static_cast<std::size_t>(inputs * group));
    std::vector<double> acc(static_cast<std::size_t>(group));
#pragma omp for schedule(static)
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t r0 = g * group, nr = std::min(group, rows - r0);
      for (int i = 0; i < inputs; ++i)
        for (std::int64_t t = 0; t < nr; ++t) {
          std::int64_t offset = 0, rest = r0 + t;
          for (int d = rank - 2; d >= 0; --d) {
            offset += (rest % shape[d]) * strides[i][d];
            rest /= shape[d];
          }
          base[i * group + t] = offset;
          if (row[i])
            value[i * group + t] = data[i][offset];
        }
      int next_row_step = 0;  // row steps run once, in order, when their operands exist
      int computed = 0;       // leading steps whose full values this group's block holds
      for (int phase = 0; phase <= steps; ++phase) {  // each reduction, then the last pass
        const bool last = phase == steps;
        if (!last && !row_reduction(program.steps[phase].op))
          continue;
        for (; next_row_step < phase; ++next_row_step) {
          const ElementwiseStep& s = program.steps[next_row_step];
          const int reg_index = inputs + next_row_step;
          if (!row[reg_index] || row_reduction(s.op))
            continue;
          float* v = value.data() + reg_index * group;
          const float* a = value.data() + s.args[0] * group;
          const float* b = s.args[1] >= 0 ? value.data() + s.args[1] * group : nullptr;
          run_step(s, v, a, b, nr);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        const int reduced = last ? -1 : program.steps[phase].args[0];
        for (std::int64_t j0 = 0; j0 < cols; j0 += len) {  // one block, or a row's pieces
          const std::int64_t n = std::min(len, cols - j0), block = nr * n;
          // A row value a full step reads: the block filled with each row's value.
          for (int k = 0; k < inputs + phase; ++k)
            if (row[k]) {
              float* dst = scratch.data() + static_cast<std::size_t>(k) * kBlock;
              for (std::int64_t t = 0; t < nr; ++t)
                std::fill(dst + t * n, dst + (t + 1) * n, value[k * group + t]);
              reg[k] = dst;
            }
          for (int i = 0; i < inputs; ++i) {
            if (row[i])
              continue;
            const std::int64_t step = strides[i][rank - 1];
            const float* first = data[i] + base[i * group] + j0 * step;
            // In place when the block's elements are consecutive in the input.
            if (step == 1 && (nr == 1 || (n == cols && base[i * group + nr - 1] ==
                                                           base[i * group] + (nr - 1) * cols))) {
              reg[i] = first;
              continue;
            }
            float* buffer = scratch.data() + static_cast<std::size_t>(i) * kBlock;
            for (std::int64_t t = 0; t < nr; ++t) {
              const float* src = data[i] + base[i * group + t] + j0 * step;
              for (std::int64_t j = 0; j < n; ++j)
                buffer[t * n + j] = src[j * step];
            }
            reg[i] = buffer;
          }
          // With one block per group its full values stay in their slots between passes,
          // so each pass computes only the steps the passes before it did not.
          for (int k = single_block ? computed : 0; k < phase; ++k) {
            const int reg_index = inputs + k;
            if (row[reg_index])
              continue;
            const ElementwiseStep& s = program.steps[k];
            float* dst = (last || single_block) && out_of[reg_index] != nullptr
                             ? out_of[reg_index] + r0 * cols + j0
                             : scratch.data() + static_cast<std::size_t>(reg_index) * kBlock;
            run_step(s, dst, reg[s.args[0]], s.args[1] >= 0 ? reg[s.args[1]] : nullptr, block);
            reg[reg_index] = dst;
          }
          if (!last)
            for (std::int64_t t = 0; t < nr; ++t) {
              const float* x = reg[reduced] + t * n;
              double sum = acc[t];
              for (std::int64_t j = 0; j < n; ++j)
                sum += x[j];
              acc[t] = sum;
            }
        }
        computed = phase;
        if (!last)  // as sum_fast: the double total times 1 (sum) or the float 1/cols (mean)
          for (std::int64_t t = 0; t < nr; ++t)
            value[(inputs + phase) * group + t] = static_cast<float>(
                acc[t] * (program.steps[phase].op == OpId::mean ? inv_cols : 1.0f));
      }
      for (std::size_t k = 0; k < written.size(); ++k)
        if (row[written[k]])
          for (std::int64_t t = 0; t < nr; ++t)
            call.outputs[k].data<float>()[r0 + t] = value[written[k] * group + t];
    }
  }
}

void fused_elementwise(const OpCall& call) {
  if (call.attrs.program->reduces())
    run_row_program(*call.attrs.program, call);
  else
    run_program(*call.attrs.program, call);
}

// Broadcasting x to y's shape is the one-step program expand(x0): blocks of contiguous
// runs, the broadcast values spread, instead of an index computation per element.
void expand(const OpCall& call) {
  static const ElementwiseProgram program{1, {ElementwiseStep{OpId::expand, {0, -1}}}, {}};
  run_program(program, call);
}

}  // namespace

void register_fused_kernels(std::array<KernelFn, kNumOps>& table) {
  table[static_cast<std::size_t>(OpId::fused_elementwise)] = fused_elementwise;
  table[static_cast<std::size_t>(OpId::expand)] = expand;
}

}  // namespace loom::cpu
