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

}  // namespace loom::cuda
