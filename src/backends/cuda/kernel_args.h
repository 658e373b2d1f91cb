// backends/cuda/kernel_args.h — argument structs shared by the host code (g++) and the
// kernels (nvcc); both compile them with the same x86-64 layout.
#pragma once

namespace loom::cuda {

inline constexpr int kMaxCopyRank = 6;

// A strided view read by copy_strided: element i of the contiguous output comes from
// sum_d index_d(i) * stride[d] of the input.
struct StridedView {
  int rank;
  long long shape[kMaxCopyRank];
  long long stride[kMaxCopyRank];
};

// A fused elementwise chain (graph fusion; core/fused_elementwise.h) as the interpreter
// kernels `fused_elementwise` and `fused_rows` read it, passed by value (about 2.2 KB of
// the 4 KB a launch may carry). Element i of the output: the inputs read at i (same layout), at 0
// (one value) or through the collapsed dimensions and each input's strides; then each step.
inline constexpr int kFusedRank = 4, kFusedMaxInputs = 16, kFusedMaxSteps = 64;
enum FusedOp : int {
  fused_add,
  fused_sub,
  fused_mul,
  fused_div,
  fused_scale,
  fused_exp,
  fused_log,
  fused_tanh,
  fused_sqrt,
  fused_erf,
  fused_relu,
  fused_gelu,
  fused_relu_backward,
  fused_gelu_backward,
  fused_tanh_backward,
  fused_identity,
  fused_sum,  // row reductions (kernel fused_rows)
  fused_mean
};
struct FusedStep {
  int op;    // FusedOp
  int a, b;  // registers: inputs first, then steps; b = -1 for one operand
  float alpha;
};
inline constexpr int kFusedMaxOutputs = 8;  // core's kMaxFusedOutputs
struct FusedProgram {
  int inputs, steps, outputs;
  float* y[kFusedMaxOutputs];
  int y_reg[kFusedMaxOutputs];  // the register each output takes
  long long dims[kFusedRank];   // padded at the front with 1
  const float* x[kFusedMaxInputs];
  int access[kFusedMaxInputs];  // 0 same layout, 1 one value, 2 strided
  long long strides[kFusedMaxInputs][kFusedRank];
  FusedStep step[kFusedMaxSteps];
  // With row reductions (kernel fused_rows): whether each register (inputs, then steps)
  // holds one value per row.
  int row[kFusedMaxInputs + kFusedMaxSteps];
};

}  // namespace loom::cuda
