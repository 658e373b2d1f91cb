// core/op_catalog.h — the operator catalog: what every backend may implement.
//
// Each operator (ops.def) has shape/dtype inference, kept apart from kernels, and a
// reference kernel: plain C++ that is the oracle every backend is tested against.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace loom {

enum class OpId : std::uint16_t {
#define LOOM_OP(name, n_in, n_out, role, doc) name,
#include "core/ops.def"
#undef LOOM_OP
};

enum class OpRole { forward, backward, optimizer, utility };

struct ElementwiseProgram;  // core/fused_elementwise.h

// What `compare` tests: a == b, a < b, a <= b, a > b, a >= b.
enum class Comparison : std::uint8_t { eq, lt, le, gt, ge };

// What `math` computes.
enum class MathFunction : std::uint8_t {
  sin,
  cos,
  tan,
  asin,
  acos,
  atan,
  sinh,
  cosh,
  asinh,
  acosh,
  atanh,
  floor,
  ceil,
  round,
  sign
};
inline constexpr MathFunction kMathFunctions[] = {
    MathFunction::sin,   MathFunction::cos,   MathFunction::tan,   MathFunction::asin,
    MathFunction::acos,  MathFunction::atan,  MathFunction::sinh,  MathFunction::cosh,
    MathFunction::asinh, MathFunction::acosh, MathFunction::atanh, MathFunction::floor,
    MathFunction::ceil,  MathFunction::round, MathFunction::sign};
// f(x) in float, as the reference kernel computes it (round: half to even).
float math_function(MathFunction f, float x);

// Attributes of an operator call; each op reads the fields its ops.def line names.
struct Attrs {
  std::vector<std::int64_t> axes;  // sum, mean: reduced axes (empty: all)
  Shape shape;                     // fill, expand, *_backward: the target shape
  bool keepdim = false;
  bool trans_a = false, trans_b = false;
  std::int64_t axis = -1;  // max, concat, slice_backward
  std::int64_t start = 0;  // slice_backward
  double alpha = 1.0;      // scale factor, fill value
  double eps = 1e-5;       // layer_norm; adamw
  double p = 0.0;          // dropout probability
  std::uint64_t seed = 0;  // dropout: the mask's seed
  // dropout drawn anew each step: seed = mix_seed(step_seed, seed_site), so a replayed
  // graph (graph/) can give the node the next step's seed.
  bool seed_per_step = false;
  std::uint64_t seed_site = 0;
  std::int64_t heads = 1;                            // causal_attention
  std::int64_t kernel = 2, stride = 1, padding = 0;  // conv2d, pooling
  std::int64_t k = 1;                                // top_k
  DType dtype = DType::f32;                          // cast, fill
  Comparison comparison = Comparison::eq;            // compare
  MathFunction function = MathFunction::sin;         // math
  // adamw_step
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, weight_decay = 0.0;
  std::int64_t step = 1;
  // fused_elementwise: the chain it runs (immutable, shared by copies of the attributes)
  std::shared_ptr<const ElementwiseProgram> program;

  bool operator==(const Attrs&) const = default;  // the same program object, for fused nodes
};

// One operator invocation: inputs are read, outputs (preallocated, contiguous) written.
struct OpCall {
  OpId op;
  std::span<const Tensor> inputs;
  std::span<Tensor> outputs;
  const Attrs& attrs;
};

struct TensorSpec {
  Shape shape;
  DType dtype;
};

using InferFn = std::vector<TensorSpec> (*)(std::span<const Tensor> inputs, const Attrs& attrs);
using KernelFn = void (*)(const OpCall& call);

struct OpInfo {
  std::string_view name;
  int num_inputs;   // -1: variadic
  int num_outputs;  // -1: given by the attributes (fused_elementwise's program)
  OpRole role;
  std::string_view summary;
  InferFn infer;       // validates inputs and gives output shapes; throws loom::Error
  KernelFn reference;  // the oracle: contiguous inputs and outputs on a host-accessible device
};

constexpr std::size_t kNumOps = 0
#define LOOM_OP(name, n_in, n_out, role, doc) +1
#include "core/ops.def"
#undef LOOM_OP
    ;

const OpInfo& op_info(OpId op);
std::string_view op_name(OpId op);
std::string_view role_name(OpRole role);
bool find_op(std::string_view name, OpId& out);
std::span<const OpInfo> all_ops();

// How a decomposition calls other catalog ops (dispatch implements it, so each sub-op
// again goes native, decomposed or fallback on the same device).
class OpRunner {
 public:
  virtual ~OpRunner() = default;
  virtual std::vector<Tensor> run(OpId op, std::span<const Tensor> inputs, const Attrs& attrs) = 0;
};

// A composite op written with other catalog ops; returns the op's outputs.
using DecomposeFn = std::vector<Tensor> (*)(OpRunner& ops, std::span<const Tensor> inputs,
                                            const Attrs& attrs);
// The op's decomposition, or nullptr for a primitive (decompositions.cpp).
DecomposeFn decomposition(OpId op);

// Broadcast shape of two shapes (numpy rules); throws naming `op` on mismatch.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op);
// Normalises a possibly negative axis; throws naming `op` when out of range.
int normalize_axis(std::int64_t axis, int rank, std::string_view op);

// Reference kernels, one per op (reference_kernels.cpp, reference_nn_kernels.cpp).
namespace reference {
#define LOOM_OP(name, n_in, n_out, role, doc) void name(const OpCall& call);
#include "core/ops.def"
#undef LOOM_OP
}  // namespace reference

// Mixes two numbers into a seed (splitmix64), e.g. (run seed, step) -> batch seed.
inline std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b) {
  std::uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x2545F4914F6CDD1Dull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Counter-based hash giving dropout's keep mask: the same (seed, index) gives the same
// uniform number on every backend, so masks need no storage and no RNG state.
inline float dropout_uniform(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // 24 bits -> [0, 1)
}

// GPT-2's tanh approximation of GELU and its derivative.
inline float gelu_tanh(float x) {
  constexpr float k = 0.7978845608028654f;  // sqrt(2/pi)
  float inner = k * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}
inline float gelu_tanh_grad(float x) {
  constexpr float k = 0.7978845608028654f;
  float x2 = x * x;
  float t = std::tanh(k * (x + 0.044715f * x2 * x));
  float dinner = k * (1.0f + 3.0f * 0.044715f * x2);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner;
}

}  // namespace loom
