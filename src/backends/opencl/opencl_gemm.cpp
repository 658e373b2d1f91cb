// backends/opencl/opencl_gemm.cpp — matrix products: Loom's GEMM kernels (gemm.cl) with their
// epilogues, and CLBlast's batched GEMM.
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
#include "backends/opencl/opencl_backend_internal.h"
#include "core/broadcast.h"
#include "core/error.h"
#include "core/fused_elementwise.h"

namespace loom::opencl {

using namespace detail;

Tensor OpenClBackend::transposed_copy(const Tensor& x) {
  const Tensor view = x.transpose(x.rank() - 2, x.rank() - 1);
  Tensor out = Tensor::empty(view.shape(), DType::f32, *this);
  StridedView strided;
  for (int d = 0; d < view.rank(); ++d) {
    strided.shape[d] = static_cast<cl_ulong>(view.shape()[d]);
    strided.stride[d] = static_cast<cl_ulong>(view.strides()[d]);
  }
  copy_strided(view, out, view.rank(), strided);
  return out;
}

void OpenClBackend::matmul_dot(const OpCall& call) {
  matmul_dot(call, GemmTail{});
}

void OpenClBackend::matmul_dot(const OpCall& call, const GemmTail& tail) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  Tensor& c = call.outputs[0];
  const bool ta = call.attrs.trans_a, tb = call.attrs.trans_b;
  const std::int64_t m = c.rank() >= 2 ? c.dim(-2) : 1, n = c.dim(-1),
                     k = ta ? a.dim(-2) : a.dim(-1);
  if (c.numel() == 0)
    return;
  // B as stored ([K, N], a forward product's weight): gemm_nn, or gemm_tn for a
  // transposed A, eight columns of B's row per load. B transposed ([N, K], the backward
  // products against a weight): gemm_nt, A and B both read along k, through a transposed
  // copy of A when A is transposed too (one pass over it against M*N*K multiply-adds).
  const char* name = !tb ? (ta ? "gemm_tn" : "gemm_nn") : "gemm_nt";
  const std::size_t which = !tb ? (ta ? 1 : 0) : 2;  // its place in GemmTail::kernels
  const Tensor rows_a = tb && ta ? transposed_copy(a) : a;
  const Tensor& rows_b = b;
  const std::size_t columns = static_cast<std::size_t>(tb ? n : (n + 7) / 8);
  auto launch = [&](std::int64_t rows, std::size_t batches, cl_ulong a_off, cl_ulong a_batch,
                    cl_ulong b_off, cl_ulong b_batch, cl_ulong c_off) {
    std::lock_guard lock(mutex_);
    cl_kernel kern = tail.kernels != nullptr ? (*tail.kernels)[which] : kernel(name);
    cl_uint arg = 0;
    set_arg(kern, arg++, static_cast<cl_int>(rows));
    set_arg(kern, arg++, static_cast<cl_int>(n));
    set_arg(kern, arg++, static_cast<cl_int>(k));
    set_arg(kern, arg++, mem_of(rows_a));
    set_arg(kern, arg++, off_of(rows_a) + a_off);
    set_arg(kern, arg++, a_batch);
    set_arg(kern, arg++, mem_of(rows_b));
    set_arg(kern, arg++, off_of(rows_b) + b_off);
    set_arg(kern, arg++, b_batch);
    set_arg(kern, arg++, mem_of(c));
    if (tail.kernels != nullptr) {  // c_off: where this launch's product starts in c
      set_arg(kern, arg++, c_off);
      tail.set_args(kern, arg);
    } else {
      set_arg(kern, arg++, off_of(c) + c_off);
      set_arg(kern, arg++, mem_of(tail.bias != nullptr ? *tail.bias : c));
      set_arg(kern, arg++, tail.bias != nullptr ? off_of(*tail.bias) : cl_ulong{0});
      set_arg(kern, arg++, cl_int{tail.bias != nullptr ? 1 : 0});
    }
    const std::size_t global[3] = {columns, static_cast<std::size_t>((rows + 3) / 4), batches};
    const cl_int err = clEnqueueNDRangeKernel(current_queue(), kern, 3, nullptr, global, nullptr, 0,
                                              nullptr, nullptr);
    if (err != CL_SUCCESS)
      ok(err, std::string("clEnqueueNDRangeKernel ") + name);
  };
  if (b.rank() == 2 && !ta) {  // one B for every row of A: the batch folds into M
    launch(c.numel() / n, 1, 0, 0, 0, 0, 0);
    return;
  }
  const std::vector<std::pair<std::int64_t, std::int64_t>> offsets =
      matmul_batch_offsets(a.shape(), b.shape(), c.shape());
  const std::size_t batch = offsets.size();
  const std::int64_t a_stride = batch > 1 ? offsets[1].first - offsets[0].first : 0;
  const std::int64_t b_stride = batch > 1 ? offsets[1].second - offsets[0].second : 0;
  bool even = a_stride >= 0 && b_stride >= 0;
  for (std::size_t i = 0; even && i < batch; ++i)
    even = offsets[i].first == offsets[0].first + static_cast<std::int64_t>(i) * a_stride &&
           offsets[i].second == offsets[0].second + static_cast<std::int64_t>(i) * b_stride;
  if (even) {
    launch(m, batch, static_cast<cl_ulong>(offsets[0].first), static_cast<cl_ulong>(a_stride),
           static_cast<cl_ulong>(offsets[0].second), static_cast<cl_ulong>(b_stride), 0);
    return;
  }
  for (std::size_t i = 0; i < batch; ++i)  // any other broadcast: one launch per matrix
    launch(m, 1, static_cast<cl_ulong>(offsets[i].first), 0,
           static_cast<cl_ulong>(offsets[i].second), 0, static_cast<cl_ulong>(i * m * n));
}

bool OpenClBackend::uses_gemm_nt(const Tensor& a, const Tensor& b, const Tensor& c) const {
  // Loom's kernels take int sizes and copy_strided's ranks; anything larger goes to CLBlast.
  constexpr std::int64_t kIntSizes = std::int64_t{1} << 31;
  return gemm_ == Gemm::gemm_nt && a.rank() <= kMaxCopyRank && b.rank() <= kMaxCopyRank &&
         c.numel() < kIntSizes && a.numel() < kIntSizes && b.numel() < kIntSizes;
}

void OpenClBackend::matmul(const OpCall& call) {
  if (uses_gemm_nt(call.inputs[0], call.inputs[1], call.outputs[0])) {
    gemm_calls_[static_cast<std::size_t>(Gemm::gemm_nt)].fetch_add(1, std::memory_order_relaxed);
    matmul_dot(call);
    return;
  }
  gemm_calls_[static_cast<std::size_t>(Gemm::clblast)].fetch_add(1, std::memory_order_relaxed);
  matmul_clblast(call);
}

void OpenClBackend::linear(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Tensor& w = call.inputs[1];
  const Tensor& bias = call.inputs[2];
  Tensor& y = call.outputs[0];
  if (y.numel() == 0)
    return;
  // x [..., K] as the matrix [rows, K], y as [rows, N]: one product.
  const std::int64_t k = x.dim(-1), n = y.dim(-1), rows = y.numel() / n;
  const Tensor x2 = x.reshape({rows, k});
  Tensor y2 = y.reshape({rows, n});
  Attrs attrs;
  attrs.trans_b = call.attrs.trans_b;
  const Tensor operands[] = {x2, w};
  Tensor products[] = {y2};
  const OpCall product{OpId::matmul, operands, products, attrs};
  if (uses_gemm_nt(x2, w, y2)) {
    gemm_calls_[static_cast<std::size_t>(Gemm::gemm_nt)].fetch_add(1, std::memory_order_relaxed);
    matmul_dot(product, GemmTail{&bias, nullptr, {}});
    return;
  }
  gemm_calls_[static_cast<std::size_t>(Gemm::clblast)].fetch_add(1, std::memory_order_relaxed);
  matmul_clblast(product);
  launch_binary(*device_ops::plan_binary(OpId::add, y2.shape(), bias.shape()), y2, bias, y2);
}

void OpenClBackend::matmul_clblast(const OpCall& call) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  Tensor& c = call.outputs[0];
  bool ta = call.attrs.trans_a, tb = call.attrs.trans_b;
  std::size_t m = c.dim(-2), n = c.dim(-1), k = ta ? a.dim(-2) : a.dim(-1);
  std::size_t lda = a.dim(-1), ldb = b.dim(-1);
  auto gemm = [&](std::size_t rows, std::size_t a_off, std::size_t b_off, std::size_t c_off) {
    cl_command_queue q = current_queue();
    auto status = clblast::Gemm<float>(
        clblast::Layout::kRowMajor, ta ? clblast::Transpose::kYes : clblast::Transpose::kNo,
        tb ? clblast::Transpose::kYes : clblast::Transpose::kNo, rows, n, k, 1.0f, mem_of(a),
        off_of(a) + a_off, lda, mem_of(b), off_of(b) + b_off, ldb, 0.0f, mem_of(c),
        off_of(c) + c_off, n, &q, nullptr);
    check(status == clblast::StatusCode::kSuccess, [&] {
      return "opencl: CLBlast Gemm failed with status " + std::to_string(static_cast<int>(status));
    });
  };
  if (b.rank() == 2 && !ta) {  // fold the batch into M
    gemm(c.numel() / std::max<std::size_t>(n, 1), 0, 0, 0);
    return;
  }
  // A batch of products is one CLBlast call, not one per matrix: a loop of small GEMMs
  // (attention's per-head products) costs a kernel launch or more each. Evenly spaced
  // operands (a stride per batch, 0 where one broadcasts) go to GemmStridedBatched,
  // any other broadcast to GemmBatched with each matrix's offset.
  std::vector<std::pair<std::int64_t, std::int64_t>> offsets =
      matmul_batch_offsets(a.shape(), b.shape(), c.shape());
  const std::size_t batch = offsets.size();
  if (batch == 0 || m == 0 || n == 0)
    return;
  if (batch == 1) {
    gemm(m, static_cast<std::size_t>(offsets[0].first), static_cast<std::size_t>(offsets[0].second),
         0);
    return;
  }
  const auto a_transpose = ta ? clblast::Transpose::kYes : clblast::Transpose::kNo;
  const auto b_transpose = tb ? clblast::Transpose::kYes : clblast::Transpose::kNo;
  const std::int64_t a_stride = offsets[1].first - offsets[0].first;
  const std::int64_t b_stride = offsets[1].second - offsets[0].second;
  bool even = offsets[0].first == 0 && offsets[0].second == 0 && a_stride >= 0 && b_stride >= 0;
  for (std::size_t i = 0; even && i < batch; ++i)
    even = offsets[i].first == static_cast<std::int64_t>(i) * a_stride &&
           offsets[i].second == static_cast<std::int64_t>(i) * b_stride;
  cl_command_queue q = current_queue();
  clblast::StatusCode status;
  if (even) {
    status = clblast::GemmStridedBatched<float>(
        clblast::Layout::kRowMajor, a_transpose, b_transpose, m, n, k, 1.0f, mem_of(a), off_of(a),
        lda, static_cast<std::size_t>(a_stride), mem_of(b), off_of(b), ldb,
        static_cast<std::size_t>(b_stride), 0.0f, mem_of(c), off_of(c), n, m * n, batch, &q,
        nullptr);
  } else {
    std::vector<std::size_t> a_offsets(batch), b_offsets(batch), c_offsets(batch);
    for (std::size_t i = 0; i < batch; ++i) {
      a_offsets[i] = off_of(a) + static_cast<std::size_t>(offsets[i].first);
      b_offsets[i] = off_of(b) + static_cast<std::size_t>(offsets[i].second);
      c_offsets[i] = off_of(c) + i * m * n;
    }
    const std::vector<float> alphas(batch, 1.0f), betas(batch, 0.0f);
    status = clblast::GemmBatched<float>(clblast::Layout::kRowMajor, a_transpose, b_transpose, m, n,
                                         k, alphas.data(), mem_of(a), a_offsets.data(), lda,
                                         mem_of(b), b_offsets.data(), ldb, betas.data(), mem_of(c),
                                         c_offsets.data(), n, batch, &q, nullptr);
  }
  check(status == clblast::StatusCode::kSuccess, [&] {
    return "opencl: CLBlast batched Gemm failed with status " +
           std::to_string(static_cast<int>(status));
  });
}

}  // namespace loom::opencl
