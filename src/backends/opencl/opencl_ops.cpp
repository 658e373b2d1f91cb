// backends/opencl/opencl_ops.cpp — the elementwise, reduction, copy, embedding, loss,
// attention and optimizer kernels' launchers, and the kernel table (which ops run natively).
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

#include "backends/device_kernel_rows.h"
#include "backends/device_ops.h"
#include "backends/kernel_table.h"
#include "backends/opencl/opencl_backend_internal.h"
#include "core/broadcast.h"
#include "core/error.h"
#include "core/fused_elementwise.h"

namespace loom::opencl {

using namespace detail;

namespace {
constexpr int kMaxCopyRank = OpenClBackend::kMaxCopyRank;
constexpr std::int64_t kMaxHead = 256;  // LOOM_MAX_HEAD in kernels.cl

// The GEMM kernels call the epilogue once per element, in scalar code (their vector
// width is the eight columns a work-item computes), where a chain kernel of its own is
// vectorized across work-items by a CPU device's compiler: a chain of adds, multiplies and
// selections costs less in the GEMM than a pass of its own, one with exp, erf, tanh or a
// square root more (the GPT block's GELU: 3-6% slower a step on PoCL). So only the former.
bool f32_cheap_epilogue(const OpCall& call) {
  if (!device_ops::f32_except_ids(call) || call.attrs.program == nullptr)
    return false;
  for (const ElementwiseStep& s : call.attrs.program->steps)
    if (s.op != OpId::add && s.op != OpId::sub && s.op != OpId::mul && s.op != OpId::div &&
        s.op != OpId::scale && s.op != OpId::relu && s.op != OpId::relu_backward &&
        s.op != OpId::expand)
      return false;
  return true;
}
// The catalog has checked the dtypes (concat: one for all inputs, copied as bytes; top_k:
// f32 values, i32 indices).
bool any_dtype(const OpCall&) {
  return true;
}
bool f32_expand(const OpCall& call) {
  return device_ops::f32_except_ids(call) &&
         call.attrs.shape.size() <= static_cast<std::size_t>(kMaxCopyRank);
}
// The kernels keep a head's D accumulators in registers: at most kMaxHead of them.
bool f32_attention(const OpCall& call) {
  return device_ops::f32_except_ids(call) && device_ops::attention_head_dim(call) <= kMaxHead;
}
}  // namespace

void OpenClBackend::fill(const OpCall& call) {
  Tensor& y = call.outputs[0];
  run("fill", count(y), mem_of(y), off_of(y), static_cast<cl_float>(call.attrs.alpha));
}

void OpenClBackend::binary(const OpCall& call) {
  const auto& in = call.inputs;
  Tensor& y = call.outputs[0];
  device_ops::BinaryPlan plan = *device_ops::plan_binary(call.op, in[0].shape(), in[1].shape());
  const Tensor& full = plan.other_left ? in[1] : in[0];
  const Tensor& other = plan.other_left ? in[0] : in[1];
  launch_binary(plan, full, other, y);
}

void OpenClBackend::launch_binary(const device_ops::BinaryPlan& plan, const Tensor& full,
                                  const Tensor& other, const Tensor& y) {
  const bool by_rows = plan.mode == 2 || plan.mode == 3;  // binary in kernels.cl
  const std::size_t columns = by_rows ? static_cast<std::size_t>(plan.period) : count(y);
  run_rows("binary", columns, columns == 0 ? 0 : count(y) / columns, static_cast<cl_int>(plan.op),
           mem_of(full), off_of(full), mem_of(other), off_of(other), mem_of(y), off_of(y),
           static_cast<cl_int>(plan.mode), static_cast<cl_ulong>(columns),
           static_cast<cl_int>(plan.other_left));
}

template <device_ops::UnaryKernel Code>
void OpenClBackend::unary(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  // One kernel per op (kernels.cl, LOOM_UNARY), in UnaryKernel's order.
  static constexpr const char* kNames[] = {"unary_exp",  "unary_log",   "unary_tanh", "unary_relu",
                                           "unary_gelu", "unary_scale", "unary_sqrt", "unary_erf"};
  static_assert(std::size(kNames) == static_cast<std::size_t>(device_ops::UnaryKernel::erf) + 1);
  run(kNames[static_cast<std::size_t>(Code)], count(y), mem_of(x), off_of(x), mem_of(y), off_of(y),
      static_cast<cl_float>(call.attrs.alpha));
}

void OpenClBackend::math(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  run("unary", count(y), static_cast<cl_int>(device_ops::math_unary_code(call.attrs.function)),
      mem_of(x), off_of(x), mem_of(y), off_of(y), static_cast<cl_float>(call.attrs.alpha));
}

template <device_ops::UnaryBackwardKernel Code>
void OpenClBackend::unary_backward(const OpCall& call) {
  const auto& in = call.inputs;
  Tensor& dx = call.outputs[0];
  run("unary_backward", count(dx), static_cast<cl_int>(Code), mem_of(in[0]), off_of(in[0]),
      mem_of(in[1]), off_of(in[1]), mem_of(dx), off_of(dx));
}

// sum over the axes of a row or column layout; max over the last axis (a row layout).
void OpenClBackend::reduce(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  std::vector<std::int64_t> axes =
      call.op == OpId::max ? std::vector<std::int64_t>{call.attrs.axis} : call.attrs.axes;
  if (classify_reduction(x, axes) == ReduceShape::rows) {
    std::size_t rows = 1, cols = 1;
    std::vector<bool> reduced(x.rank(), axes.empty());
    for (auto a : axes)
      reduced[normalize_axis(a, x.rank(), "sum")] = true;
    for (int d = 0; d < x.rank(); ++d)
      (reduced[d] ? cols : rows) *= x.shape()[d];
    run("reduce_rows", rows, static_cast<cl_int>(call.op == OpId::max), mem_of(x), off_of(x),
        mem_of(y), off_of(y), static_cast<cl_ulong>(cols), 1.0f);
    return;
  }
  std::size_t cols = count(y), rows = count(x) / std::max<std::size_t>(cols, 1);
  run("sum_cols", cols, mem_of(x), off_of(x), mem_of(y), off_of(y), static_cast<cl_ulong>(rows),
      static_cast<cl_ulong>(cols), 1.0f);
}

void OpenClBackend::copy_strided(const Tensor& x, Tensor& y, int rank, const StridedView& v) {
  // Dimensions the index arithmetic need not tell apart are merged: a size-1 one goes,
  // and one whose stride is the next one's extent times that one's stride joins it (two
  // repeated dimensions, stride 0, join too).
  std::vector<cl_ulong> shape, stride;
  for (int d = 0; d < rank; ++d) {
    if (v.shape[d] == 1)
      continue;
    if (!shape.empty() && stride.back() == v.stride[d] * v.shape[d]) {
      shape.back() *= v.shape[d];
      stride.back() = v.stride[d];
    } else {
      shape.push_back(v.shape[d]);
      stride.push_back(v.stride[d]);
    }
  }
  if (shape.empty()) {
    shape.push_back(1);
    stride.push_back(0);
  }
  constexpr cl_ulong kUint = cl_ulong{1} << 32;
  cl_ulong reach = 0;  // the largest element index read, from x's offset
  for (std::size_t d = 0; d < shape.size(); ++d)
    reach += (shape[d] - 1) * stride[d];
  const std::size_t total = count(y);
  if (total > 0 && total < kUint && reach < kUint && shape.size() <= 6) {
    const std::size_t outer_rank = shape.size() - 1;
    cl_uint n[5] = {1, 1, 1, 1, 1}, t[5] = {0, 0, 0, 0, 0};
    for (std::size_t d = 0; d < outer_rank; ++d) {
      n[d] = static_cast<cl_uint>(shape[d]);
      t[d] = static_cast<cl_uint>(stride[d]);
    }
    std::lock_guard lock(mutex_);
    cl_kernel k = kernel("copy_rows");
    cl_uint arg = 0;
    set_arg(k, arg++, mem_of(x));
    set_arg(k, arg++, off_of(x));
    set_arg(k, arg++, mem_of(y));
    set_arg(k, arg++, off_of(y));
    set_arg(k, arg++, static_cast<cl_uint>(shape.back()));
    set_arg(k, arg++, static_cast<cl_uint>(stride.back()));
    set_arg(k, arg++, static_cast<cl_int>(outer_rank));
    for (cl_uint e : n)
      set_arg(k, arg++, e);
    for (cl_uint e : t)
      set_arg(k, arg++, e);
    constexpr std::size_t kPiece = 64;  // LOOM_COPY_PIECE in kernels.cl
    const auto inner = static_cast<std::size_t>(shape.back());
    const std::size_t global[2] = {(inner + kPiece - 1) / kPiece, total / inner};
    ok(clEnqueueNDRangeKernel(current_queue(), k, 2, nullptr, global, nullptr, 0, nullptr, nullptr),
       "clEnqueueNDRangeKernel copy_rows");
    return;
  }
  run("copy_strided", count(y), mem_of(x), off_of(x), mem_of(y), off_of(y),
      static_cast<cl_int>(rank), v.shape[0], v.shape[1], v.shape[2], v.shape[3], v.shape[4],
      v.shape[5], v.stride[0], v.stride[1], v.stride[2], v.stride[3], v.stride[4], v.stride[5]);
}

void OpenClBackend::copy(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  StridedView view;
  for (int d = 0; d < x.rank(); ++d) {
    view.shape[d] = static_cast<cl_ulong>(x.shape()[d]);
    view.stride[d] = static_cast<cl_ulong>(x.strides()[d]);
  }
  copy_strided(x, call.outputs[0], x.rank(), view);
}

// Right-aligned broadcasting: a size-1 or missing dimension of x repeats (stride 0).
void OpenClBackend::expand(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Shape& target = call.outputs[0].shape();
  const int rank = static_cast<int>(target.size()), lead = rank - x.rank();
  StridedView view;
  for (int d = 0; d < rank; ++d) {
    view.shape[d] = static_cast<cl_ulong>(target[static_cast<std::size_t>(d)]);
    const int xd = d - lead;
    view.stride[d] = xd < 0 || x.shape()[static_cast<std::size_t>(xd)] == 1
                         ? 0
                         : static_cast<cl_ulong>(x.strides()[static_cast<std::size_t>(xd)]);
  }
  copy_strided(x, call.outputs[0], rank, view);
}

void OpenClBackend::slice_backward(const OpCall& call) {
  const Tensor& dy = call.inputs[0];
  Tensor& dx = call.outputs[0];
  int axis = normalize_axis(call.attrs.axis, dx.rank(), "slice_backward");
  cl_ulong inner = 1;
  for (int d = axis + 1; d < dx.rank(); ++d)
    inner *= static_cast<cl_ulong>(dx.shape()[d]);
  run_rows("slice_backward", static_cast<std::size_t>(inner),
           inner == 0 ? 0 : count(dx) / static_cast<std::size_t>(inner), mem_of(dy), off_of(dy),
           mem_of(dx), off_of(dx), static_cast<cl_ulong>(dx.shape()[axis]),
           static_cast<cl_ulong>(dy.shape()[axis]), inner, static_cast<cl_ulong>(call.attrs.start));
}

// y viewed as [outer, axis * inner] rows of bytes; input i fills the block of columns
// [column_i, column_i + axis_i * inner) of every row (kernels.cl's place_columns, in bytes,
// so any dtype; dispatch hands the inputs over contiguous). A rectangular buffer copy
// (clEnqueueCopyBufferRect) would be one call, but PoCL bounds-checks the destination's
// whole last row from the column onward, which passes the buffer's end.
void OpenClBackend::concat(const OpCall& call) {
  Tensor& y = call.outputs[0];
  const int axis = normalize_axis(call.attrs.axis, y.rank(), "concat");
  const std::size_t element = dtype_size(y.dtype());
  std::size_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d)
    outer *= static_cast<std::size_t>(y.shape()[d]);
  for (int d = axis + 1; d < y.rank(); ++d)
    inner *= static_cast<std::size_t>(y.shape()[d]);
  const std::size_t row = static_cast<std::size_t>(y.shape()[axis]) * inner * element;
  std::size_t column = 0;  // bytes into a row of y
  for (const Tensor& x : call.inputs) {
    const std::size_t run = static_cast<std::size_t>(x.shape()[axis]) * inner * element;
    if (run > 0 && outer > 0)
      run_rows("place_columns", run, outer, mem_of(x), static_cast<cl_ulong>(off_of(x) * element),
               mem_of(y), static_cast<cl_ulong>(off_of(y) * element), static_cast<cl_ulong>(run),
               static_cast<cl_ulong>(row), static_cast<cl_ulong>(column));
    column += run;
  }
}

// A row a work-item (kernels.cl's top_k_rows and top_k_scatter).
void OpenClBackend::top_k(const OpCall& call) {
  if (call.op == OpId::top_k) {
    const Tensor& x = call.inputs[0];
    const auto width = static_cast<cl_ulong>(x.dim(-1)), k = static_cast<cl_ulong>(call.attrs.k);
    run("top_k_rows", count(x) / width, mem_of(x), off_of(x), mem_of(call.outputs[0]),
        off_of(call.outputs[0]), mem_of(call.outputs[1]), off_of(call.outputs[1]), width, k);
    return;
  }
  const Tensor& dv = call.inputs[0];
  const auto k = static_cast<cl_ulong>(dv.dim(-1)),
             width = static_cast<cl_ulong>(call.outputs[0].dim(-1));
  run("top_k_scatter", count(dv) / k, mem_of(dv), off_of(dv), mem_of(call.inputs[1]),
      off_of(call.inputs[1]), mem_of(call.outputs[0]), off_of(call.outputs[0]), width, k);
}

void OpenClBackend::sum_squares(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  std::size_t total = count(x),
              chunks = std::max<std::size_t>(1, std::min<std::size_t>(1024, total));
  std::size_t chunk = (total + chunks - 1) / chunks;
  Tensor partial = Tensor::empty({static_cast<std::int64_t>(chunks)}, DType::f32, *this);
  run("sum_squares_partial", chunks, mem_of(x), off_of(x), static_cast<cl_ulong>(total),
      static_cast<cl_ulong>(chunk), mem_of(partial));
  run("reduce_rows", 1, cl_int{0}, mem_of(partial), cl_ulong{0}, mem_of(y), off_of(y),
      static_cast<cl_ulong>(chunks), 1.0f);
}

void OpenClBackend::embedding(const OpCall& call) {
  const Tensor &table = call.inputs[0], &ids = call.inputs[1];
  Tensor& y = call.outputs[0];
  id_fault_possible_.store(true, std::memory_order_relaxed);
  run("embedding", count(y), mem_of(table), off_of(table), mem_of(ids), off_of(ids), mem_of(y),
      off_of(y), static_cast<cl_ulong>(table.dim(1)), static_cast<cl_ulong>(table.dim(0)),
      id_fault_.get());
}

// embedding_backward, and embedding_backward_add (base, dy, ids), which then adds base to
// each sum: the two ops' bits, without a temporary table (kernels.cl, embedding_*).
void OpenClBackend::embedding_backward(const OpCall& call) {
  const bool onto_base = call.op == OpId::embedding_backward_add;
  const Tensor &dy = call.inputs[onto_base ? 1 : 0], &ids = call.inputs[onto_base ? 2 : 1];
  Tensor& dw = call.outputs[0];
  const auto c = static_cast<std::size_t>(dw.dim(1)), vocab = static_cast<std::size_t>(dw.dim(0));
  run_rows("embedding_zero", c, vocab, mem_of(dw), off_of(dw), cl_ulong{c});
  id_fault_possible_.store(true, std::memory_order_relaxed);
  run("embedding_scatter", c, mem_of(dy), off_of(dy), mem_of(ids), off_of(ids), mem_of(dw),
      off_of(dw), static_cast<cl_ulong>(ids.numel()), cl_ulong{c}, cl_ulong{vocab}, id_fault_.get(),
      cl_int{onto_base ? device_ops::kIdEmbeddingBackwardAdd : device_ops::kIdEmbeddingBackward});
  if (onto_base)
    run_rows("embedding_add_base", c, vocab, mem_of(call.inputs[0]), off_of(call.inputs[0]),
             mem_of(dw), off_of(dw), cl_ulong{c});
}

void OpenClBackend::report_id_fault(cl_command_queue queue) {
  if (!id_fault_possible_.exchange(false, std::memory_order_relaxed))
    return;
  std::int32_t fault[4] = {0, 0, 0, 0};
  static_assert(sizeof(cl_int) == sizeof(std::int32_t));
  ok(clEnqueueReadBuffer(queue, id_fault_.get(), CL_TRUE, 0, sizeof fault, fault, 0, nullptr,
                         nullptr),
     "clEnqueueReadBuffer (id check)");
  if (fault[0] == 0)
    return;
  const cl_int clear[4] = {0, 0, 0, 0};
  ok(clEnqueueWriteBuffer(queue, id_fault_.get(), CL_TRUE, 0, sizeof clear, clear, 0, nullptr,
                          nullptr),
     "clEnqueueWriteBuffer (id check)");
  throw device_ops::id_fault_error(fault);
}

void OpenClBackend::cross_entropy(const OpCall& call) {
  const Tensor &logits = call.inputs[0], &targets = call.inputs[1];
  auto& out = call.outputs;
  std::size_t rows = static_cast<std::size_t>(logits.dim(0));
  if (rows == 0) {
    run("fill", 1, mem_of(out[0]), off_of(out[0]), 0.0f);
    return;
  }
  Tensor row_loss = Tensor::empty({logits.dim(0)}, DType::f32, *this);
  id_fault_possible_.store(true, std::memory_order_relaxed);
  run("cross_entropy_rows", rows, mem_of(logits), off_of(logits), mem_of(targets), off_of(targets),
      mem_of(out[1]), off_of(out[1]), mem_of(row_loss), static_cast<cl_ulong>(logits.dim(1)),
      id_fault_.get());
  run("reduce_rows", 1, cl_int{0}, mem_of(row_loss), cl_ulong{0}, mem_of(out[0]), off_of(out[0]),
      static_cast<cl_ulong>(rows), 1.0f / static_cast<float>(rows));
}

void OpenClBackend::cross_entropy_backward(const OpCall& call) {
  const auto& in = call.inputs;
  Tensor& dx = call.outputs[0];
  const Tensor& logits = in[1];
  float inv = 1.0f / static_cast<float>(std::max<std::int64_t>(logits.dim(0), 1));
  id_fault_possible_.store(true, std::memory_order_relaxed);
  run("cross_entropy_backward", count(dx), mem_of(in[0]), off_of(in[0]), mem_of(logits),
      off_of(logits), mem_of(in[2]), off_of(in[2]), mem_of(in[3]), off_of(in[3]), mem_of(dx),
      off_of(dx), static_cast<cl_ulong>(logits.dim(1)), inv, id_fault_.get());
}

void OpenClBackend::layer_norm_backward(const OpCall& call) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  const Tensor& x = in[1];
  std::size_t c = static_cast<std::size_t>(x.dim(-1)), rows = c == 0 ? 0 : count(x) / c;
  run("layer_norm_backward_rows", rows, mem_of(in[0]), off_of(in[0]), mem_of(x), off_of(x),
      mem_of(in[2]), off_of(in[2]), mem_of(in[3]), off_of(in[3]), mem_of(in[4]), off_of(in[4]),
      mem_of(out[0]), off_of(out[0]), static_cast<cl_ulong>(c));
  run("layer_norm_backward_cols", c, mem_of(in[0]), off_of(in[0]), mem_of(x), off_of(x),
      mem_of(in[3]), off_of(in[3]), mem_of(in[4]), off_of(in[4]), mem_of(out[1]), off_of(out[1]),
      mem_of(out[2]), off_of(out[2]), static_cast<cl_ulong>(rows), static_cast<cl_ulong>(c));
}

// causal_attention, attention and their backwards: one work item per (batch, head, query
// row) for the output and dq, per (batch, key/value head, key row) for dk and dv.
void OpenClBackend::attention(const OpCall& call) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  const bool fused =
      call.op == OpId::causal_attention || call.op == OpId::causal_attention_backward;
  const bool forward = call.op == OpId::causal_attention || call.op == OpId::attention;
  const device_ops::AttentionLayout a =
      fused ? device_ops::fused_attention_layout(in[forward ? 0 : 1], call.attrs.heads)
            : device_ops::grouped_attention_layout(in[forward ? 0 : 1], in[forward ? 1 : 2]);
  // q, k, v (and dq, dk, dv) as buffer and offset: the fused tensor's thirds, or three tensors.
  const std::size_t first = forward ? 0 : 1;
  const Tensor& q = in[first];
  const Tensor& k = fused ? q : in[first + 1];
  const Tensor& v = fused ? q : in[first + 2];
  const cl_ulong third = static_cast<cl_ulong>(a.h * a.d);
  const cl_ulong q_off = off_of(q), k_off = off_of(k) + (fused ? third : 0),
                 v_off = off_of(v) + (fused ? 2 * third : 0);
  auto layout = [&](auto launch) {
    launch(static_cast<cl_ulong>(a.tq), static_cast<cl_ulong>(a.tk), static_cast<cl_ulong>(a.h),
           static_cast<cl_ulong>(a.g), static_cast<cl_ulong>(a.d), static_cast<cl_ulong>(a.ld_q),
           static_cast<cl_ulong>(a.ld_kv), static_cast<cl_ulong>(a.ld_o),
           static_cast<cl_ulong>(a.batch_q), static_cast<cl_ulong>(a.batch_kv),
           static_cast<cl_ulong>(a.batch_o), a.scale());
  };
  const std::size_t query_items = static_cast<std::size_t>(a.b * a.h * a.tq);
  if (forward) {
    layout([&](auto... l) {
      run("attention_forward", query_items, mem_of(q), q_off, mem_of(k), k_off, mem_of(v), v_off,
          mem_of(out[0]), off_of(out[0]), mem_of(out[1]), off_of(out[1]), l...);
    });
    return;
  }
  const Tensor& o = in[fused ? 2 : 4];
  const Tensor& lse = in[fused ? 3 : 5];
  const Tensor& dq = out[0];
  const Tensor& dk = fused ? dq : out[1];
  const Tensor& dv = fused ? dq : out[2];
  const cl_ulong dk_off = off_of(dk) + (fused ? third : 0),
                 dv_off = off_of(dv) + (fused ? 2 * third : 0);
  layout([&](auto... l) {
    run("attention_backward_dq", query_items, mem_of(in[0]), off_of(in[0]), mem_of(q), q_off,
        mem_of(k), k_off, mem_of(v), v_off, mem_of(o), off_of(o), mem_of(lse), off_of(lse),
        mem_of(dq), off_of(dq), l...);
    run("attention_backward_dkv", static_cast<std::size_t>(a.b * a.g * a.tk), mem_of(in[0]),
        off_of(in[0]), mem_of(q), q_off, mem_of(k), k_off, mem_of(v), v_off, mem_of(o), off_of(o),
        mem_of(lse), off_of(lse), mem_of(dk), dk_off, mem_of(dv), dv_off, l...);
  });
}

void OpenClBackend::rms_norm(const OpCall& call) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  std::size_t c = static_cast<std::size_t>(in[0].dim(-1)), rows = c == 0 ? 0 : count(in[0]) / c;
  run("rms_norm_rows", rows, mem_of(in[0]), off_of(in[0]), mem_of(in[1]), off_of(in[1]),
      mem_of(out[0]), off_of(out[0]), mem_of(out[1]), off_of(out[1]), static_cast<cl_ulong>(c),
      static_cast<cl_float>(call.attrs.eps));
}

void OpenClBackend::rms_norm_backward(const OpCall& call) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  const Tensor& x = in[1];
  std::size_t c = static_cast<std::size_t>(x.dim(-1)), rows = c == 0 ? 0 : count(x) / c;
  run("rms_norm_backward_rows", rows, mem_of(in[0]), off_of(in[0]), mem_of(x), off_of(x),
      mem_of(in[2]), off_of(in[2]), mem_of(in[3]), off_of(in[3]), mem_of(out[0]), off_of(out[0]),
      static_cast<cl_ulong>(c));
  run("rms_norm_backward_cols", c, mem_of(in[0]), off_of(in[0]), mem_of(x), off_of(x),
      mem_of(in[3]), off_of(in[3]), mem_of(out[1]), off_of(out[1]), static_cast<cl_ulong>(rows),
      static_cast<cl_ulong>(c));
}

void OpenClBackend::rope(const OpCall& call) {
  const auto& in = call.inputs;
  Tensor& y = call.outputs[0];
  const Tensor& x = in[0];
  run("rope", count(x) / 2, mem_of(x), off_of(x), mem_of(in[1]), off_of(in[1]), mem_of(in[2]),
      off_of(in[2]), mem_of(y), off_of(y), static_cast<cl_ulong>(x.dim(-3)),
      static_cast<cl_ulong>(x.dim(-2)), static_cast<cl_ulong>(x.dim(-1) / 2));
}

// silu, silu_backward, swiglu, swiglu_backward: one work item per element, each input and
// output passed as buffer and offset in the op's order.
void OpenClBackend::gated(const OpCall& call) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  const std::size_t n = count(in[0]);
  switch (call.op) {
    case OpId::silu:
      run("silu", n, mem_of(in[0]), off_of(in[0]), mem_of(out[0]), off_of(out[0]));
      break;
    case OpId::silu_backward:
      run("silu_backward", n, mem_of(in[0]), off_of(in[0]), mem_of(in[1]), off_of(in[1]),
          mem_of(out[0]), off_of(out[0]));
      break;
    case OpId::swiglu:
      run("swiglu", n, mem_of(in[0]), off_of(in[0]), mem_of(in[1]), off_of(in[1]), mem_of(out[0]),
          off_of(out[0]));
      break;
    default:  // swiglu_backward
      run("swiglu_backward", n, mem_of(in[0]), off_of(in[0]), mem_of(in[1]), off_of(in[1]),
          mem_of(in[2]), off_of(in[2]), mem_of(out[0]), off_of(out[0]), mem_of(out[1]),
          off_of(out[1]));
  }
}

void OpenClBackend::adamw(const OpCall& call) {
  const auto& in = call.inputs;
  auto& out = call.outputs;
  const Attrs& a = call.attrs;
  auto [step_size, inv_sqrt_bc2, decay] = device_ops::adamw_scalars(a);
  run("adamw", count(out[0]), mem_of(in[0]), off_of(in[0]), mem_of(in[1]), off_of(in[1]),
      mem_of(in[2]), off_of(in[2]), mem_of(in[3]), off_of(in[3]), mem_of(out[0]), off_of(out[0]),
      mem_of(out[1]), off_of(out[1]), mem_of(out[2]), off_of(out[2]),
      static_cast<cl_float>(a.beta1), static_cast<cl_float>(a.beta2), step_size, inv_sqrt_bc2,
      decay, static_cast<cl_float>(a.eps));
}

// The native kernels, once: supports() and launch() both read this table.
const KernelTable<OpenClBackend>& OpenClBackend::kernels() {
  using B = OpenClBackend;
  static const KernelTable<B> table(
      "opencl", device_ops::SharedKernelRows<B, kMaxCopyRank>::with({
                    {OpId::expand, f32_expand, &B::expand},
                    {OpId::concat, any_dtype, &B::concat},
                    {OpId::top_k, any_dtype, &B::top_k},
                    {OpId::top_k_backward, any_dtype, &B::top_k},
                    {OpId::matmul_elementwise, f32_cheap_epilogue, &B::matmul_elementwise},
                    {OpId::causal_attention, f32_attention, &B::attention},
                    {OpId::causal_attention_backward, f32_attention, &B::attention},
                    {OpId::attention, f32_attention, &B::attention},
                    {OpId::attention_backward, f32_attention, &B::attention},
                    {OpId::fused_elementwise, fused_rank_fits, &B::fused},
                }));
  return table;
}

bool OpenClBackend::supports(const OpCall& call) const {
  return kernels().supports(call);
}

}  // namespace loom::opencl
