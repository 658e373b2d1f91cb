// Shape and dtype inference for every catalog op, and the catalog table itself.
#include "core/op_catalog.h"

#include <algorithm>
#include <array>
#include <string>

#include "core/error.h"
#include "core/fused_elementwise.h"

namespace loom {
namespace {

using Inputs = std::span<const Tensor>;
using Specs = std::vector<TensorSpec>;

std::string where(std::string_view op, int input) {
  return std::string(op) + ": input " + std::to_string(input);
}

void expect_dtype(Inputs in, int i, DType dtype, std::string_view op) {
  check(in[i].defined(), [&] { return where(op, i) + " is undefined"; });
  check(in[i].dtype() == dtype, [&] {
    return where(op, i) + " is " + in[i].describe() + ", expected " +
           std::string(dtype_name(dtype));
  });
}

void expect_rank(Inputs in, int i, int rank, std::string_view op) {
  check(in[i].rank() == rank, [&] {
    return where(op, i) + " is " + in[i].describe() + ", expected rank " + std::to_string(rank);
  });
}

void expect_same_shape(Inputs in, int i, int j, std::string_view op) {
  check(in[i].shape() == in[j].shape(), [&] {
    return std::string(op) + ": inputs " + std::to_string(i) + " and " + std::to_string(j) +
           " differ: " + in[i].describe() + " vs " + in[j].describe();
  });
}

Specs infer_copy(Inputs in, const Attrs&) {
  return {{in[0].shape(), in[0].dtype()}};
}

Specs infer_fill(Inputs, const Attrs& a) {
  for (auto d : a.shape)
    check(d >= 0, [&] { return "fill: negative dimension in " + shape_str(a.shape); });
  return {{a.shape, a.dtype}};
}

Specs infer_cast(Inputs in, const Attrs& a) {
  return {{in[0].shape(), a.dtype}};
}

Specs infer_expand(Inputs in, const Attrs& a) {
  expect_dtype(in, 0, DType::f32, "expand");
  check(
      in[0].rank() <= static_cast<int>(a.shape.size()) &&
          broadcast_shapes(in[0].shape(), a.shape, "expand") == a.shape,
      [&] { return "expand: " + in[0].describe() + " cannot broadcast to " + shape_str(a.shape); });
  return {{a.shape, DType::f32}};
}

Specs infer_concat(Inputs in, const Attrs& a) {
  check(!in.empty(), "concat: needs at least one input");
  int axis = normalize_axis(a.axis, in[0].rank(), "concat");
  Shape out = in[0].shape();
  for (std::size_t i = 1; i < in.size(); ++i) {
    check(in[i].rank() == in[0].rank() && in[i].dtype() == in[0].dtype(), [&] {
      return where("concat", static_cast<int>(i)) + " is " + in[i].describe() +
             ", unlike input 0 " + in[0].describe();
    });
    for (int d = 0; d < in[0].rank(); ++d) {
      if (d == axis)
        continue;
      check(in[i].shape()[d] == out[d], [&] {
        return where("concat", static_cast<int>(i)) + " is " + in[i].describe() +
               ", must match input 0 except on axis " + std::to_string(axis);
      });
    }
    out[axis] += in[i].shape()[axis];
  }
  return {{out, in[0].dtype()}};
}

Specs infer_slice_backward(Inputs in, const Attrs& a) {
  expect_dtype(in, 0, DType::f32, "slice_backward");
  check(in[0].rank() == static_cast<int>(a.shape.size()), [&] {
    return "slice_backward: dy " + in[0].describe() + " and shape " + shape_str(a.shape) +
           " differ in rank";
  });
  int axis = normalize_axis(a.axis, in[0].rank(), "slice_backward");
  for (int d = 0; d < in[0].rank(); ++d) {
    if (d == axis) {
      check(a.start >= 0 && a.start + in[0].shape()[d] <= a.shape[d], [&] {
        return "slice_backward: slice [" + std::to_string(a.start) + ", +" +
               std::to_string(in[0].shape()[d]) + ") outside " + shape_str(a.shape);
      });
    } else {
      check(in[0].shape()[d] == a.shape[d], [&] {
        return "slice_backward: dy " + in[0].describe() + " does not fit " + shape_str(a.shape);
      });
    }
  }
  return {{a.shape, DType::f32}};
}

Specs infer_binary(Inputs in, const Attrs&, std::string_view op) {
  expect_dtype(in, 0, DType::f32, op);
  expect_dtype(in, 1, DType::f32, op);
  return {{broadcast_shapes(in[0].shape(), in[1].shape(), op), DType::f32}};
}
Specs infer_add(Inputs in, const Attrs& a) {
  return infer_binary(in, a, "add");
}
Specs infer_sub(Inputs in, const Attrs& a) {
  return infer_binary(in, a, "sub");
}
Specs infer_mul(Inputs in, const Attrs& a) {
  return infer_binary(in, a, "mul");
}
Specs infer_div(Inputs in, const Attrs& a) {
  return infer_binary(in, a, "div");
}

Specs infer_where(Inputs in, const Attrs&) {
  expect_dtype(in, 0, DType::u8, "where");
  expect_dtype(in, 1, DType::f32, "where");
  expect_dtype(in, 2, DType::f32, "where");
  return {{broadcast_shapes(broadcast_shapes(in[0].shape(), in[1].shape(), "where"), in[2].shape(),
                            "where"),
           DType::f32}};
}
Specs infer_compare(Inputs in, const Attrs&) {
  expect_dtype(in, 0, DType::f32, "compare");
  expect_dtype(in, 1, DType::f32, "compare");
  return {{broadcast_shapes(in[0].shape(), in[1].shape(), "compare"), DType::u8}};
}

Specs infer_unary_f32(Inputs in, std::string_view op) {
  expect_dtype(in, 0, DType::f32, op);
  return {{in[0].shape(), DType::f32}};
}
Specs infer_scale(Inputs in, const Attrs&) {
  return infer_unary_f32(in, "scale");
}
Specs infer_exp(Inputs in, const Attrs&) {
  return infer_unary_f32(in, "exp");
}
Specs infer_log(Inputs in, const Attrs&) {
  return infer_unary_f32(in, "log");
}
Specs infer_tanh(Inputs in, const Attrs&) {
  return infer_unary_f32(in, "tanh");
}
Specs infer_math(Inputs in, const Attrs&) {
  return infer_unary_f32(in, "math");
}
Specs infer_sqrt(Inputs in, const Attrs&) {
  return infer_unary_f32(in, "sqrt");
}
Specs infer_erf(Inputs in, const Attrs&) {
  return infer_unary_f32(in, "erf");
}
Specs infer_relu(Inputs in, const Attrs&) {
  return infer_unary_f32(in, "relu");
}
Specs infer_gelu(Inputs in, const Attrs&) {
  return infer_unary_f32(in, "gelu");
}
Specs infer_softmax(Inputs in, const Attrs&) {
  return infer_unary_f32(in, "softmax");
}
Specs infer_log_softmax(Inputs in, const Attrs&) {
  return infer_unary_f32(in, "log_softmax");
}

Specs infer_pair_f32(Inputs in, std::string_view op) {
  expect_dtype(in, 0, DType::f32, op);
  expect_dtype(in, 1, DType::f32, op);
  expect_same_shape(in, 0, 1, op);
  return {{in[0].shape(), DType::f32}};
}
Specs infer_relu_backward(Inputs in, const Attrs&) {
  return infer_pair_f32(in, "relu_backward");
}
Specs infer_gelu_backward(Inputs in, const Attrs&) {
  return infer_pair_f32(in, "gelu_backward");
}
Specs infer_silu(Inputs in, const Attrs&) {
  return infer_unary_f32(in, "silu");
}
Specs infer_silu_backward(Inputs in, const Attrs&) {
  return infer_pair_f32(in, "silu_backward");
}
Specs infer_swiglu(Inputs in, const Attrs&) {
  return infer_pair_f32(in, "swiglu");
}
Specs infer_swiglu_backward(Inputs in, const Attrs&) {
  for (int i = 0; i < 3; ++i)
    expect_dtype(in, i, DType::f32, "swiglu_backward");
  expect_same_shape(in, 0, 1, "swiglu_backward");
  expect_same_shape(in, 1, 2, "swiglu_backward");
  return {{in[1].shape(), DType::f32}, {in[2].shape(), DType::f32}};
}
Specs infer_tanh_backward(Inputs in, const Attrs&) {
  return infer_pair_f32(in, "tanh_backward");
}
Specs infer_softmax_backward(Inputs in, const Attrs&) {
  return infer_pair_f32(in, "softmax_backward");
}
Specs infer_log_softmax_backward(Inputs in, const Attrs&) {
  return infer_pair_f32(in, "log_softmax_backward");
}

Specs infer_dropout_like(Inputs in, const Attrs& a, std::string_view op) {
  check(a.p >= 0.0 && a.p < 1.0,
        [&] { return std::string(op) + ": p = " + std::to_string(a.p) + ", expected 0 <= p < 1"; });
  return infer_unary_f32(in, op);
}
Specs infer_dropout(Inputs in, const Attrs& a) {
  return infer_dropout_like(in, a, "dropout");
}
Specs infer_dropout_backward(Inputs in, const Attrs& a) {
  return infer_dropout_like(in, a, "dropout_backward");
}

Specs infer_fused_elementwise(Inputs in, const Attrs& a) {
  check_elementwise_program(a.program.get(), in, a.shape);
  std::vector<Shape> shapes;
  for (const Tensor& x : in)
    shapes.push_back(x.shape());
  Specs specs;
  for (const Shape& s : fused_output_shapes(*a.program, shapes, a.shape))
    specs.push_back(TensorSpec{s, DType::f32});
  return specs;
}

Specs infer_matmul(Inputs in, const Attrs& a);

Specs infer_matmul_elementwise(Inputs in, const Attrs& a) {
  check(in.size() >= 2, [&] {
    return "matmul_elementwise: " + std::to_string(in.size()) +
           " inputs, expected the two operands of the product and the chain's others";
  });
  const Shape product = infer_matmul(in.first(2), a).front().shape;
  check_matmul_elementwise_program(a.program.get(), product, in.subspan(2), a.shape);
  Specs specs;
  for (std::size_t k = 0; k < a.program->output_registers().size(); ++k)
    specs.push_back(TensorSpec{a.shape, DType::f32});
  return specs;
}

Shape reduced_shape(const Tensor& x, const std::vector<std::int64_t>& axes, bool keepdim,
                    std::string_view op) {
  std::vector<bool> reduce(x.rank(), axes.empty());
  for (auto axis : axes)
    reduce[normalize_axis(axis, x.rank(), op)] = true;
  Shape out;
  for (int d = 0; d < x.rank(); ++d) {
    if (!reduce[d])
      out.push_back(x.shape()[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}
Specs infer_sum(Inputs in, const Attrs& a) {
  expect_dtype(in, 0, DType::f32, "sum");
  return {{reduced_shape(in[0], a.axes, a.keepdim, "sum"), DType::f32}};
}
Specs infer_mean(Inputs in, const Attrs& a) {
  expect_dtype(in, 0, DType::f32, "mean");
  return {{reduced_shape(in[0], a.axes, a.keepdim, "mean"), DType::f32}};
}
Specs infer_max(Inputs in, const Attrs& a) {
  expect_dtype(in, 0, DType::f32, "max");
  check(in[0].rank() >= 1, "max: input 0 is a scalar; expected rank >= 1");
  return {{reduced_shape(in[0], {a.axis}, a.keepdim, "max"), DType::f32}};
}
Specs infer_max_backward(Inputs in, const Attrs& a) {
  expect_dtype(in, 1, DType::f32, "max_backward");
  Shape reduced = reduced_shape(in[1], {a.axis}, a.keepdim, "max_backward");
  check(in[0].shape() == reduced && in[2].shape() == reduced, [&] {
    return "max_backward: dy " + in[0].describe() + " and y " + in[2].describe() + " must be " +
           shape_str(reduced);
  });
  return {{in[1].shape(), DType::f32}};
}
Specs infer_sum_squares(Inputs in, const Attrs&) {
  expect_dtype(in, 0, DType::f32, "sum_squares");
  return {{Shape{}, DType::f32}};
}

Specs infer_cross_entropy(Inputs in, const Attrs&) {
  expect_dtype(in, 0, DType::f32, "cross_entropy");
  expect_rank(in, 0, 2, "cross_entropy");
  expect_dtype(in, 1, DType::i32, "cross_entropy");
  check(in[1].rank() == 1 && in[1].dim(0) == in[0].dim(0), [&] {
    return "cross_entropy: targets " + in[1].describe() + " must be [N] for logits " +
           in[0].describe();
  });
  return {{Shape{}, DType::f32}, {Shape{in[0].dim(0)}, DType::f32}};
}
Specs infer_cross_entropy_backward(Inputs in, const Attrs&) {
  check(in[0].numel() == 1, [&] {
    return "cross_entropy_backward: dloss " + in[0].describe() + " must hold one element";
  });
  Specs fwd = infer_cross_entropy(in.subspan(1, 2), Attrs{});
  check(in[3].shape() == fwd[1].shape, [&] {
    return "cross_entropy_backward: lse " + in[3].describe() + " must be " +
           shape_str(fwd[1].shape);
  });
  return {{in[1].shape(), DType::f32}};
}

Specs infer_matmul(Inputs in, const Attrs& a) {
  expect_dtype(in, 0, DType::f32, "matmul");
  expect_dtype(in, 1, DType::f32, "matmul");
  check(in[0].rank() >= 2 && in[1].rank() >= 2, [&] {
    return "matmul: inputs " + in[0].describe() + " and " + in[1].describe() + " need rank >= 2";
  });
  std::int64_t m = a.trans_a ? in[0].dim(-1) : in[0].dim(-2);
  std::int64_t ka = a.trans_a ? in[0].dim(-2) : in[0].dim(-1);
  std::int64_t kb = a.trans_b ? in[1].dim(-1) : in[1].dim(-2);
  std::int64_t n = a.trans_b ? in[1].dim(-2) : in[1].dim(-1);
  check(ka == kb, [&] {
    return "matmul: inner dimensions differ: " + in[0].describe() + (a.trans_a ? "^T" : "") +
           " x " + in[1].describe() + (a.trans_b ? "^T" : "");
  });
  Shape batch_a(in[0].shape().begin(), in[0].shape().end() - 2);
  Shape batch_b(in[1].shape().begin(), in[1].shape().end() - 2);
  Shape out = broadcast_shapes(batch_a, batch_b, "matmul");
  out.push_back(m);
  out.push_back(n);
  return {{out, DType::f32}};
}

Specs infer_linear(Inputs in, const Attrs& a) {
  expect_dtype(in, 0, DType::f32, "linear");
  expect_dtype(in, 1, DType::f32, "linear");
  expect_dtype(in, 2, DType::f32, "linear");
  expect_rank(in, 1, 2, "linear");
  check(in[0].rank() >= 1, "linear: input 0 is a scalar");
  std::int64_t k = a.trans_b ? in[1].dim(1) : in[1].dim(0);
  std::int64_t n = a.trans_b ? in[1].dim(0) : in[1].dim(1);
  check(in[0].dim(-1) == k, [&] {
    return "linear: x " + in[0].describe() + " does not match weight " + in[1].describe() +
           (a.trans_b ? " [out,in]" : " [in,out]");
  });
  check(in[2].rank() == 1 && in[2].dim(0) == n, [&] {
    return "linear: bias " + in[2].describe() + " must be [" + std::to_string(n) + "]";
  });
  Shape out = in[0].shape();
  out.back() = n;
  return {{out, DType::f32}};
}

Specs infer_layer_norm(Inputs in, const Attrs& a) {
  for (int i = 0; i < 3; ++i)
    expect_dtype(in, i, DType::f32, "layer_norm");
  check(in[0].rank() >= 1, "layer_norm: input 0 is a scalar");
  std::int64_t c = in[0].dim(-1);
  check(in[1].shape() == Shape{c} && in[2].shape() == Shape{c}, [&] {
    return "layer_norm: weight " + in[1].describe() + " and bias " + in[2].describe() +
           " must be [" + std::to_string(c) + "]";
  });
  check(a.eps > 0, "layer_norm: eps must be > 0");
  Shape rows(in[0].shape().begin(), in[0].shape().end() - 1);
  return {{in[0].shape(), DType::f32}, {rows, DType::f32}, {rows, DType::f32}};
}
Specs infer_layer_norm_backward(Inputs in, const Attrs&) {
  for (int i = 0; i < 5; ++i)
    expect_dtype(in, i, DType::f32, "layer_norm_backward");
  expect_same_shape(in, 0, 1, "layer_norm_backward");
  Shape rows(in[1].shape().begin(), in[1].shape().end() - 1);
  check(in[3].shape() == rows && in[4].shape() == rows,
        [&] { return "layer_norm_backward: mean/rstd must be " + shape_str(rows); });
  check(in[2].shape() == Shape{in[1].dim(-1)},
        [&] { return "layer_norm_backward: weight " + in[2].describe() + " does not match x"; });
  return {{in[1].shape(), DType::f32}, {in[2].shape(), DType::f32}, {in[2].shape(), DType::f32}};
}

Specs infer_rms_norm(Inputs in, const Attrs& a) {
  for (int i = 0; i < 2; ++i)
    expect_dtype(in, i, DType::f32, "rms_norm");
  check(in[0].rank() >= 1, "rms_norm: input 0 is a scalar");
  std::int64_t c = in[0].dim(-1);
  check(in[1].shape() == Shape{c}, [&] {
    return "rms_norm: weight " + in[1].describe() + " must be [" + std::to_string(c) + "]";
  });
  check(a.eps > 0, "rms_norm: eps must be > 0");
  Shape rows(in[0].shape().begin(), in[0].shape().end() - 1);
  return {{in[0].shape(), DType::f32}, {rows, DType::f32}};
}
Specs infer_rms_norm_backward(Inputs in, const Attrs&) {
  for (int i = 0; i < 4; ++i)
    expect_dtype(in, i, DType::f32, "rms_norm_backward");
  expect_same_shape(in, 0, 1, "rms_norm_backward");
  check(in[1].rank() >= 1, "rms_norm_backward: x is a scalar");
  Shape rows(in[1].shape().begin(), in[1].shape().end() - 1);
  check(in[3].shape() == rows, [&] {
    return "rms_norm_backward: rstd " + in[3].describe() + " must be " + shape_str(rows);
  });
  check(in[2].shape() == Shape{in[1].dim(-1)},
        [&] { return "rms_norm_backward: weight " + in[2].describe() + " does not match x"; });
  return {{in[1].shape(), DType::f32}, {in[2].shape(), DType::f32}};
}

// x [..., T, N, D] with D even; cos and sin [T, D/2], one row per position.
Specs infer_rope(Inputs in, const Attrs&) {
  for (int i = 0; i < 3; ++i)
    expect_dtype(in, i, DType::f32, "rope");
  check(in[0].rank() >= 3 && in[0].dim(-1) % 2 == 0,
        [&] { return "rope: x " + in[0].describe() + " must be [...,T,N,D] with D even"; });
  Shape table{in[0].dim(-3), in[0].dim(-1) / 2};
  check(in[1].shape() == table && in[2].shape() == table, [&] {
    return "rope: cos " + in[1].describe() + " and sin " + in[2].describe() + " must be " +
           shape_str(table) + " for x " + in[0].describe();
  });
  return {{in[0].shape(), DType::f32}};
}

Specs infer_embedding(Inputs in, const Attrs&) {
  expect_dtype(in, 0, DType::f32, "embedding");
  expect_rank(in, 0, 2, "embedding");
  expect_dtype(in, 1, DType::i32, "embedding");
  Shape out = in[1].shape();
  out.push_back(in[0].dim(1));
  return {{out, DType::f32}};
}
// dy [..., C] (input `dy`) and ids [...] (input dy + 1) scattered into a table of `shape`.
Specs infer_scatter(Inputs in, int dy, const Shape& shape, const char* op) {
  expect_dtype(in, dy, DType::f32, op);
  expect_dtype(in, dy + 1, DType::i32, op);
  check(shape.size() == 2,
        [&] { return std::string(op) + ": shape " + shape_str(shape) + " must be [V,C]"; });
  Shape expected = in[dy + 1].shape();
  expected.push_back(shape[1]);
  check(in[dy].shape() == expected, [&] {
    return std::string(op) + ": dy " + in[dy].describe() + " must be " + shape_str(expected);
  });
  return {{shape, DType::f32}};
}
Specs infer_embedding_backward(Inputs in, const Attrs& a) {
  return infer_scatter(in, 0, a.shape, "embedding_backward");
}
Specs infer_embedding_backward_add(Inputs in, const Attrs&) {
  expect_dtype(in, 0, DType::f32, "embedding_backward_add");
  expect_rank(in, 0, 2, "embedding_backward_add");
  return infer_scatter(in, 1, in[0].shape(), "embedding_backward_add");
}

Specs infer_causal_attention(Inputs in, const Attrs& a) {
  expect_dtype(in, 0, DType::f32, "causal_attention");
  expect_rank(in, 0, 3, "causal_attention");
  std::int64_t c3 = in[0].dim(2);
  check(c3 % 3 == 0 && a.heads > 0 && (c3 / 3) % a.heads == 0, [&] {
    return "causal_attention: qkv " + in[0].describe() +
           " must be [B,T,3C] with C divisible by heads = " + std::to_string(a.heads);
  });
  std::int64_t b = in[0].dim(0), t = in[0].dim(1);
  return {{Shape{b, t, c3 / 3}, DType::f32}, {Shape{b, a.heads, t}, DType::f32}};
}
Specs infer_causal_attention_backward(Inputs in, const Attrs& a) {
  Specs fwd = infer_causal_attention(in.subspan(1, 1), a);
  check(in[0].shape() == fwd[0].shape && in[2].shape() == fwd[0].shape &&
            in[3].shape() == fwd[1].shape,
        [&] {
          return "causal_attention_backward: dout/out/lse do not match qkv " + in[1].describe();
        });
  return {{in[1].shape(), DType::f32}};
}

// q [B,Tq,H,D], k and v [B,Tk,G,D] with G dividing H and Tq <= Tk.
Specs infer_attention(Inputs in, const Attrs&) {
  for (int i = 0; i < 3; ++i) {
    expect_dtype(in, i, DType::f32, "attention");
    expect_rank(in, i, 4, "attention");
  }
  expect_same_shape(in, 1, 2, "attention");
  const Tensor &q = in[0], &k = in[1];
  check(q.dim(0) == k.dim(0) && q.dim(3) == k.dim(3) && k.dim(2) > 0 && q.dim(2) % k.dim(2) == 0 &&
            q.dim(1) <= k.dim(1),
        [&] {
          return "attention: q " + q.describe() + " and k/v " + k.describe() +
                 " must be [B,Tq,H,D] and [B,Tk,G,D] with G dividing H and Tq <= Tk";
        });
  return {{q.shape(), DType::f32}, {Shape{q.dim(0), q.dim(2), q.dim(1)}, DType::f32}};
}
Specs infer_attention_backward(Inputs in, const Attrs& a) {
  Specs fwd = infer_attention(in.subspan(1, 3), a);
  for (int i : {0, 4, 5})
    expect_dtype(in, i, DType::f32, "attention_backward");
  check(in[0].shape() == fwd[0].shape && in[4].shape() == fwd[0].shape &&
            in[5].shape() == fwd[1].shape,
        [&] { return "attention_backward: dout/out/lse do not match q " + in[1].describe(); });
  return {{in[1].shape(), DType::f32}, {in[2].shape(), DType::f32}, {in[3].shape(), DType::f32}};
}

std::int64_t conv_out(std::int64_t size, std::int64_t kernel, std::int64_t stride,
                      std::int64_t padding) {
  return (size + 2 * padding - kernel) / stride + 1;
}
Specs infer_conv2d(Inputs in, const Attrs& a) {
  for (int i = 0; i < 3; ++i)
    expect_dtype(in, i, DType::f32, "conv2d");
  expect_rank(in, 0, 4, "conv2d");
  expect_rank(in, 1, 4, "conv2d");
  check(in[1].dim(1) == in[0].dim(1), [&] {
    return "conv2d: weight " + in[1].describe() + " channels differ from x " + in[0].describe();
  });
  check(in[2].shape() == Shape{in[1].dim(0)},
        [&] { return "conv2d: bias " + in[2].describe() + " must be [O]"; });
  check(a.stride > 0 && a.padding >= 0, "conv2d: stride must be > 0 and padding >= 0");
  std::int64_t oh = conv_out(in[0].dim(2), in[1].dim(2), a.stride, a.padding);
  std::int64_t ow = conv_out(in[0].dim(3), in[1].dim(3), a.stride, a.padding);
  check(oh > 0 && ow > 0, [&] {
    return "conv2d: kernel " + in[1].describe() + " larger than padded input " + in[0].describe();
  });
  return {{Shape{in[0].dim(0), in[1].dim(0), oh, ow}, DType::f32}};
}
Specs infer_conv2d_backward(Inputs in, const Attrs& a) {
  for (int i = 0; i < 3; ++i)
    expect_dtype(in, i, DType::f32, "conv2d_backward");
  expect_rank(in, 1, 4, "conv2d_backward");
  expect_rank(in, 2, 4, "conv2d_backward");
  Shape expected{in[1].dim(0), in[2].dim(0),
                 conv_out(in[1].dim(2), in[2].dim(2), a.stride, a.padding),
                 conv_out(in[1].dim(3), in[2].dim(3), a.stride, a.padding)};
  check(in[0].shape() == expected, [&] {
    return "conv2d_backward: dy " + in[0].describe() + " must be " + shape_str(expected);
  });
  return {
      {in[1].shape(), DType::f32}, {in[2].shape(), DType::f32}, {Shape{in[2].dim(0)}, DType::f32}};
}

Specs infer_pool(Inputs in, const Attrs& a, std::string_view op) {
  expect_dtype(in, 0, DType::f32, op);
  expect_rank(in, 0, 4, op);
  check(a.kernel > 0 && a.stride > 0,
        [&] { return std::string(op) + ": kernel and stride must be > 0"; });
  std::int64_t oh = conv_out(in[0].dim(2), a.kernel, a.stride, 0);
  std::int64_t ow = conv_out(in[0].dim(3), a.kernel, a.stride, 0);
  check(oh > 0 && ow > 0, [&] {
    return std::string(op) + ": kernel " + std::to_string(a.kernel) + " larger than " +
           in[0].describe();
  });
  return {{Shape{in[0].dim(0), in[0].dim(1), oh, ow}, DType::f32}};
}
Specs infer_max_pool2d(Inputs in, const Attrs& a) {
  Specs s = infer_pool(in, a, "max_pool2d");
  s.push_back({s[0].shape, DType::i32});
  return s;
}
Specs infer_avg_pool2d(Inputs in, const Attrs& a) {
  return infer_pool(in, a, "avg_pool2d");
}
Specs infer_pool_backward(Inputs in, const Attrs& a, std::string_view op) {
  check(a.shape.size() == 4,
        [&] { return std::string(op) + ": shape " + shape_str(a.shape) + " must be [N,C,H,W]"; });
  Shape expected{a.shape[0], a.shape[1], conv_out(a.shape[2], a.kernel, a.stride, 0),
                 conv_out(a.shape[3], a.kernel, a.stride, 0)};
  check(in[0].shape() == expected, [&] {
    return std::string(op) + ": dy " + in[0].describe() + " must be " + shape_str(expected);
  });
  return {{a.shape, DType::f32}};
}
Specs infer_max_pool2d_backward(Inputs in, const Attrs& a) {
  expect_dtype(in, 1, DType::i32, "max_pool2d_backward");
  expect_same_shape(in, 0, 1, "max_pool2d_backward");
  return infer_pool_backward(in, a, "max_pool2d_backward");
}
Specs infer_avg_pool2d_backward(Inputs in, const Attrs& a) {
  return infer_pool_backward(in, a, "avg_pool2d_backward");
}

Specs infer_adamw_step(Inputs in, const Attrs& a) {
  for (int i = 0; i < 4; ++i) {
    expect_dtype(in, i, DType::f32, "adamw_step");
    expect_same_shape(in, 0, i, "adamw_step");
  }
  check(a.step >= 1, "adamw_step: step must be >= 1");
  return {{in[0].shape(), DType::f32}, {in[0].shape(), DType::f32}, {in[0].shape(), DType::f32}};
}

Specs infer_top_k(Inputs in, const Attrs& a) {
  expect_dtype(in, 0, DType::f32, "top_k");
  check(in[0].rank() >= 1 && a.k >= 1 && a.k <= in[0].dim(-1), [&] {
    return "top_k: k " + std::to_string(a.k) + " must be in [1, " +
           (in[0].rank() >= 1 ? std::to_string(in[0].dim(-1)) : std::string("the last axis")) +
           "] for x " + in[0].describe();
  });
  Shape out = in[0].shape();
  out.back() = a.k;
  return {{out, DType::f32}, {out, DType::i32}};
}
Specs infer_top_k_backward(Inputs in, const Attrs& a) {
  expect_dtype(in, 0, DType::f32, "top_k_backward");
  expect_dtype(in, 1, DType::i32, "top_k_backward");
  expect_same_shape(in, 0, 1, "top_k_backward");
  Shape rows = a.shape;
  check(!rows.empty() && in[0].rank() == static_cast<int>(rows.size()) &&
            std::equal(rows.begin(), rows.end() - 1, in[0].shape().begin()) &&
            in[0].dim(-1) <= rows.back(),
        [&] {
          return "top_k_backward: dvalues " + in[0].describe() + " does not fit shape " +
                 shape_str(rows);
        });
  return {{rows, DType::f32}};
}

constexpr OpRole forward = OpRole::forward;
constexpr OpRole backward = OpRole::backward;
constexpr OpRole optimizer = OpRole::optimizer;
constexpr OpRole utility = OpRole::utility;

const std::array<OpInfo, kNumOps> kCatalog = {{
#define LOOM_OP(name, n_in, n_out, role, doc) \
  {#name, n_in, n_out, role, doc, infer_##name, reference::name},
#include "core/ops.def"
#undef LOOM_OP
}};

}  // namespace

const OpInfo& op_info(OpId op) {
  return kCatalog[static_cast<std::size_t>(op)];
}
std::string_view op_name(OpId op) {
  return op_info(op).name;
}
std::span<const OpInfo> all_ops() {
  return kCatalog;
}

std::string_view role_name(OpRole role) {
  switch (role) {
    case OpRole::forward:
      return "forward";
    case OpRole::backward:
      return "backward";
    case OpRole::optimizer:
      return "optimizer";
    case OpRole::utility:
      return "utility";
  }
  return "?";
}

bool find_op(std::string_view name, OpId& out) {
  for (std::size_t i = 0; i < kNumOps; ++i) {
    if (kCatalog[i].name == name) {
      out = static_cast<OpId>(i);
      return true;
    }
  }
  return false;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
  std::size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    std::int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    std::int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    check(da == db || da == 1 || db == 1, [&] {
      return std::string(op) + ": shapes " + shape_str(a) + " and " + shape_str(b) +
             " do not broadcast";
    });
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int normalize_axis(std::int64_t axis, int rank, std::string_view op) {
  std::int64_t a = axis < 0 ? axis + rank : axis;
  check(a >= 0 && a < rank, [&] {
    return std::string(op) + ": axis " + std::to_string(axis) + " out of range for rank " +
           std::to_string(rank);
  });
  return static_cast<int>(a);
}

}  // namespace loom
