// backends/device_kernel_rows.h — the kernel-table rows the device backends (OpenCL and
// CUDA) share: the same ops under the same conditions, each launched by the backend's
// member function of the same name. A device backend's table is these rows followed by
// its own (backends/kernel_table.h: the first entry of an op whose condition holds runs).
#pragma once

#include <initializer_list>
#include <vector>

#include "backends/device_ops.h"
#include "backends/kernel_table.h"

namespace loom::device_ops {

// linear's weight is a matrix (the kernels read it as [out, in]).
inline bool f32_linear(const OpCall& call) {
  return f32_except_ids(call) && call.inputs[1].rank() == 2;
}

// copy of a tensor of at most `MaxRank` dimensions (the kernels' shape and stride
// arguments hold that many).
template <int MaxRank>
bool f32_copy_up_to_rank(const OpCall& call) {
  return f32_except_ids(call) && call.inputs[0].rank() <= MaxRank;
}

// The shared rows for backend `B` (copy up to `MaxCopyRank` dimensions), then `own`. A
// struct, so a backend whose launchers are private names it a friend.
template <class B, int MaxCopyRank>
struct SharedKernelRows {
  using Entry = typename KernelTable<B>::Entry;
  static std::vector<Entry> with(std::initializer_list<Entry> own) {
    constexpr auto f32 = f32_except_ids;
    std::vector<Entry> rows{
        {OpId::fill, f32_fill, &B::fill},
        {OpId::copy, f32_copy_up_to_rank<MaxCopyRank>, &B::copy},
        {OpId::add, f32_binary_one_kernel, &B::binary},
        {OpId::sub, f32_binary_one_kernel, &B::binary},
        {OpId::mul, f32_binary_one_kernel, &B::binary},
        {OpId::div, f32_binary_one_kernel, &B::binary},
        {OpId::exp, f32, &B::template unary<UnaryKernel::exp>},
        {OpId::log, f32, &B::template unary<UnaryKernel::log>},
        {OpId::tanh, f32, &B::template unary<UnaryKernel::tanh>},
        {OpId::relu, f32, &B::template unary<UnaryKernel::relu>},
        {OpId::gelu, f32, &B::template unary<UnaryKernel::gelu>},
        {OpId::scale, f32, &B::template unary<UnaryKernel::scale>},
        {OpId::sqrt, f32, &B::template unary<UnaryKernel::sqrt>},
        {OpId::erf, f32, &B::template unary<UnaryKernel::erf>},
        {OpId::math, f32, &B::math},
        {OpId::relu_backward, f32, &B::template unary_backward<UnaryBackwardKernel::relu>},
        {OpId::gelu_backward, f32, &B::template unary_backward<UnaryBackwardKernel::gelu>},
        {OpId::tanh_backward, f32, &B::template unary_backward<UnaryBackwardKernel::tanh>},
        {OpId::sum, f32_sum_rows_or_cols, &B::reduce},
        {OpId::max, f32_max_last_axis, &B::reduce},
        {OpId::matmul, f32, &B::matmul},
        {OpId::linear, f32_linear, &B::linear},
        {OpId::slice_backward, f32, &B::slice_backward},
        {OpId::sum_squares, f32, &B::sum_squares},
        {OpId::layer_norm_backward, f32, &B::layer_norm_backward},
        {OpId::rms_norm, f32, &B::rms_norm},
        {OpId::rms_norm_backward, f32, &B::rms_norm_backward},
        {OpId::rope, f32, &B::rope},
        {OpId::silu, f32, &B::gated},
        {OpId::silu_backward, f32, &B::gated},
        {OpId::swiglu, f32, &B::gated},
        {OpId::swiglu_backward, f32, &B::gated},
        {OpId::embedding, f32, &B::embedding},
        {OpId::embedding_backward, f32, &B::embedding_backward},
        {OpId::embedding_backward_add, f32, &B::embedding_backward},
        {OpId::cross_entropy, f32, &B::cross_entropy},
        {OpId::cross_entropy_backward, f32, &B::cross_entropy_backward},
        {OpId::adamw_step, f32, &B::adamw},
    };
    rows.insert(rows.end(), own.begin(), own.end());
    return rows;
  }
};

}  // namespace loom::device_ops
