// backends/device_ops.h — what the device backends (OpenCL, CUDA) share about catalog
// calls: which inputs are ids, how a broadcasting binary op maps onto one kernel, the op
// codes of the elementwise kernels, AdamW's per-step scalars, and the host-side check of
// ids (kernels cannot raise errors).
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/broadcast.h"
#include "core/error.h"
#include "core/op_catalog.h"

namespace loom::device_ops {

// Every input is f32, except the i32 ids and targets of the ops that take them.
inline bool f32_except_ids(const OpCall& call) {
  for (std::size_t i = 0; i < call.inputs.size(); ++i) {
    bool ids = (i == 1 && (call.op == OpId::embedding || call.op == OpId::embedding_backward ||
                           call.op == OpId::cross_entropy)) ||
               (i == 2 && (call.op == OpId::cross_entropy_backward ||
                           call.op == OpId::embedding_backward_add));
    if (call.inputs[i].defined() && call.inputs[i].dtype() != (ids ? DType::i32 : DType::f32))
      return false;
  }
  return true;
}

// A binary op (add, sub, mul, div) as one kernel: one operand has the output's shape
// ("full"), the other repeats inside it. mode: 0 same shape, 1 scalar, 2 trailing block
// of `period`, 3 each value repeated `period` times. other_left: the repeated operand is
// the left one. nullopt when neither operand has the output's shape.
struct BinaryPlan {
  int op;  // 0 add, 1 sub, 2 mul, 3 div
  bool other_left;
  int mode;
  std::int64_t period;
};
inline std::optional<BinaryPlan> plan_binary(OpId op, const Shape& a, const Shape& b) {
  Shape out = broadcast_shapes(a, b, "binary");
  Repeat ra = classify_broadcast(a, out), rb = classify_broadcast(b, out);
  bool left_full = ra.kind == Repeat::same && rb.kind != Repeat::other;
  bool right_full = rb.kind == Repeat::same && ra.kind != Repeat::other;
  if (!left_full && !right_full)
    return std::nullopt;
  bool other_left = !left_full;
  Repeat r = other_left ? ra : rb;
  int mode = r.kind == Repeat::same       ? 0
             : r.kind == Repeat::scalar   ? 1
             : r.kind == Repeat::trailing ? 2
                                          : 3;
  int code = op == OpId::add ? 0 : op == OpId::sub ? 1 : op == OpId::mul ? 2 : 3;
  return BinaryPlan{code, other_left, mode, std::max<std::int64_t>(r.period, 1)};
}

// Codes of the `unary` kernels (kernels.cl, kernels.cu): each table entry names its own.
enum class UnaryKernel : int {
  exp = 0,
  log = 1,
  tanh = 2,
  relu = 3,
  gelu = 4,
  scale = 5,
  sqrt = 6,
  erf = 7
};
// The `unary` kernel's code for the catalog's math function f: 8 + f (kernels.cl, kernels.cu).
inline int math_unary_code(MathFunction f) {
  return 8 + static_cast<int>(f);
}
// Codes of the `unary_backward` kernels: relu (dy, x), gelu (dy, x), tanh (dy, y).
enum class UnaryBackwardKernel : int { relu = 0, gelu = 1, tanh = 2 };

// Attention's operands as strided views, for causal_attention's fused qkv [B,T,3C] and
// attention's separate q [B,Tq,H,D], k and v [B,Tk,G,D] alike: row strides of q (and dq),
// of k and v, of out (and dout); batch strides of each. Query head h reads key/value head
// h / (H/G); query i sits at position i + Tk - Tq.
struct AttentionLayout {
  std::int64_t b, tq, tk, h, g, d;
  std::int64_t ld_q, ld_kv, ld_o;
  std::int64_t batch_q, batch_kv, batch_o;
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(d)); }
  std::int64_t offset() const { return tk - tq; }  // query i sees keys 0..i + offset()
  std::int64_t group() const { return h / g; }     // query heads per key/value head
};
inline AttentionLayout fused_attention_layout(const Tensor& qkv, std::int64_t heads) {
  std::int64_t b = qkv.dim(0), t = qkv.dim(1), c = qkv.dim(2) / 3;
  return {b, t, t, heads, heads, c / heads, 3 * c, 3 * c, c, t * 3 * c, t * 3 * c, t * c};
}
inline AttentionLayout grouped_attention_layout(const Tensor& q, const Tensor& k) {
  std::int64_t b = q.dim(0), tq = q.dim(1), tk = k.dim(1), h = q.dim(2), g = k.dim(2), d = q.dim(3);
  return {b, tq, tk, h, g, d, h * d, g * d, h * d, tq * h * d, tk * g * d, tq * h * d};
}
// The head size D of an attention call (forward or backward, fused or grouped).
inline std::int64_t attention_head_dim(const OpCall& call) {
  const bool forward = call.op == OpId::causal_attention || call.op == OpId::attention;
  const Tensor& first = call.inputs[forward ? 0 : 1];
  if (call.op == OpId::attention || call.op == OpId::attention_backward)
    return first.dim(3);
  return first.dim(2) / 3 / std::max<std::int64_t>(call.attrs.heads, 1);
}

// Conditions the device backends' kernel tables share (backends/kernel_table.h).
inline bool f32_fill(const OpCall& call) {
  return f32_except_ids(call) && call.attrs.dtype == DType::f32;
}
// A broadcasting binary op that one `binary` kernel can run (plan_binary).
inline bool f32_binary_one_kernel(const OpCall& call) {
  return f32_except_ids(call) &&
         plan_binary(call.op, call.inputs[0].shape(), call.inputs[1].shape()).has_value();
}
// A sum over trailing axes (rows) or leading axes (columns).
inline bool f32_sum_rows_or_cols(const OpCall& call) {
  return f32_except_ids(call) &&
         classify_reduction(call.inputs[0], call.attrs.axes) != ReduceShape::unsupported;
}
// A max over the last axis.
inline bool f32_max_last_axis(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  return f32_except_ids(call) && x.rank() >= 1 &&
         normalize_axis(call.attrs.axis, x.rank(), "max") == x.rank() - 1;
}

// AdamW's step-dependent scalars: p <- p decay - step_size m / (sqrt(v) inv_sqrt_bc2 + eps),
// with step_size = lr / (1 - beta1^t), inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t), decay = 1 - lr wd.
struct AdamWScalars {
  float step_size, inv_sqrt_bc2, decay;
};
inline AdamWScalars adamw_scalars(const Attrs& a) {
  auto t = static_cast<double>(a.step);
  return {static_cast<float>(a.lr / (1.0 - std::pow(a.beta1, t))),
          static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(a.beta2, t))),
          static_cast<float>(1.0 - a.lr * a.weight_decay)};
}

// Token ids are checked on the device (OpenCL, CUDA): a kernel that meets an id outside
// [0, limit) uses it for nothing and records the first such in four ints, {the op's
// IdCheckOp, the id's position, the id, the limit} ({0, ...}: none yet). The backend's
// next read of a result on the host reports it, as this error, and clears the record.
enum IdCheckOp : std::int32_t {
  kIdEmbedding = 1,
  kIdEmbeddingBackward = 2,
  kIdCrossEntropy = 3,
  kIdCrossEntropyBackward = 4,
  kIdEmbeddingBackwardAdd = 5,
};
inline Error id_fault_error(const std::int32_t (&fault)[4]) {
  static const char* const ops[] = {"?",
                                    "embedding",
                                    "embedding_backward",
                                    "cross_entropy",
                                    "cross_entropy_backward",
                                    "embedding_backward_add"};
  return Error(std::string(fault[0] >= 1 && fault[0] <= 5 ? ops[fault[0]] : ops[0]) + ": index " +
               std::to_string(fault[2]) + " (position " + std::to_string(fault[1]) +
               ") outside [0, " + std::to_string(fault[3]) +
               ") (checked on the device; found at the next read of a result)");
}

// The queue (an OpenCL command queue, a CUDA stream) that the launch() in progress on
// this thread was given. A backend's kernel launchers take no stream: they enqueue on
// current(), which is the launch's queue inside a launch and the default stream's
// outside (uploads, allocator work). One launch at a time per backend.
template <class Queue>
class LaunchTarget {
 public:
  class Scope {
   public:
    Scope(LaunchTarget& target, Queue queue) : target_(target), lock_(target.mutex_) {
      target_.queue_ = queue;
      target_.thread_.store(std::this_thread::get_id());
    }
    ~Scope() { target_.thread_.store(std::thread::id()); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    LaunchTarget& target_;
    std::lock_guard<std::mutex> lock_;
  };
  Queue current(Queue outside) const {
    return thread_.load() == std::this_thread::get_id() ? queue_ : outside;
  }

 private:
  std::mutex mutex_;
  Queue queue_{};
  std::atomic<std::thread::id> thread_;
};

// A device stream: copies between buffers of this device are the subclass's; host memory
// goes through host_to_device / device_to_host (by default the backend's blocking
// upload/download). Timeline operations wait on the host unless the subclass does them
// on the device (OpenCL events).
class DeviceStream : public Stream {
 public:
  explicit DeviceStream(Backend& device) : device_(device) {}
  void copy(const Buffer& src, std::size_t src_offset, Buffer& dst, std::size_t dst_offset,
            std::size_t bytes) final {
    bool src_device = &src.owner() == &device_, dst_device = &dst.owner() == &device_;
    if (src_device && dst_device) {
      device_copy(src, src_offset, dst, dst_offset, bytes);
    } else if (dst_device) {
      host_to_device(static_cast<const std::byte*>(src.data()) + src_offset, dst, dst_offset,
                     bytes);
    } else {
      device_to_host(src, src_offset, static_cast<std::byte*>(dst.data()) + dst_offset, bytes);
    }
  }
  void signal(Timeline& timeline, std::uint64_t value) override {
    synchronize();
    timeline.signal(value);
  }
  void wait(Timeline& timeline, std::uint64_t value) override { timeline.wait(value); }

 protected:
  virtual void device_copy(const Buffer& src, std::size_t src_offset, Buffer& dst,
                           std::size_t dst_offset, std::size_t bytes) = 0;
  virtual void host_to_device(const void* host, Buffer& dst, std::size_t dst_offset,
                              std::size_t bytes) {
    device_.upload(host, dst, dst_offset, bytes);
  }
  virtual void device_to_host(const Buffer& src, std::size_t src_offset, void* host,
                              std::size_t bytes) {
    device_.download(src, src_offset, host, bytes);
  }
  Backend& device_;
};

}  // namespace loom::device_ops
