#include "conformance/op_cases.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "core/fused_elementwise.h"
#include "dispatch/dispatch.h"
#include "test_util.h"

namespace loom::testing {

std::vector<Tensor> run_reference(OpId op, const std::vector<Tensor>& inputs, const Attrs& attrs) {
  std::vector<Tensor> host;
  for (const Tensor& t : inputs) {
    Tensor c = t.to(cpu());  // contiguous host copy
    host.push_back(c);
  }
  std::vector<TensorSpec> specs = op_info(op).infer(host, attrs);
  std::vector<Tensor> outputs;
  for (const auto& s : specs)
    outputs.push_back(Tensor::empty(s.shape, s.dtype, cpu()));
  op_info(op).reference(OpCall{op, host, outputs, attrs});
  return outputs;
}

namespace {

struct Builder {
  nn::Rng rng{20261129};
  std::vector<OpCase> cases;

  Tensor r(const Shape& s, float lo = -1.0f, float hi = 1.0f) { return random(s, rng, lo, hi); }
  Tensor nc(const Shape& s) { return non_contiguous(s, rng); }
  Tensor ids(const Shape& s, std::int64_t limit) { return random_ids(s, limit, rng); }

  void add(std::string label, OpId op, std::vector<Tensor> inputs, Attrs attrs = {},
           Measure measure = Measure::elementwise, double tol = 1e-4) {
    cases.push_back({std::string(op_name(op)) + "/" + label, op, std::move(inputs),
                     std::move(attrs), measure, tol});
  }
};

Attrs axes_attrs(std::vector<std::int64_t> axes, bool keepdim = false) {
  Attrs a;
  a.axes = std::move(axes);
  a.keepdim = keepdim;
  return a;
}

void utility_cases(Builder& b) {
  b.add("transposed", OpId::copy, {b.nc({3, 5})});
  b.add("permuted3d", OpId::copy, {b.r({2, 3, 4}).permute({2, 0, 1})});
  b.add("strided1d", OpId::copy, {b.nc({9})});
  b.add("sliced", OpId::copy, {b.r({4, 7}).slice(1, 2, 5)});
  b.add("ints", OpId::copy, {b.ids({3, 4}, 100).transpose(0, 1)});
  Attrs fill;
  fill.shape = {3, 7};
  fill.alpha = 2.5;
  b.add("3x7", OpId::fill, {}, fill);
  fill.shape = {100000};
  fill.alpha = 0.0;
  b.add("large_zero", OpId::fill, {}, fill);
  for (DType d : {DType::bf16, DType::f16, DType::i32}) {
    Attrs cast;
    cast.dtype = d;
    b.add(std::string("to_") + std::string(dtype_name(d)), OpId::cast, {b.r({5, 6}, -8.0f, 8.0f)},
          cast, Measure::elementwise, 1e-2);
  }
  Attrs expand;
  expand.shape = {2, 3, 4};
  b.add("3x1_to_2x3x4", OpId::expand, {b.r({3, 1})}, expand);
  expand.shape = {5};
  b.add("1_to_5", OpId::expand, {b.r({1})}, expand);
  Attrs concat;
  concat.axis = 1;
  b.add("axis1", OpId::concat, {b.r({2, 3}), b.r({2, 5})}, concat);
  concat.axis = 0;
  b.add("axis0_three", OpId::concat, {b.r({1, 4}), b.nc({3, 4}), b.r({2, 4})}, concat);
  concat.axis = 2;
  b.add("ints_inner_axis", OpId::concat, {b.ids({2, 3, 1}, 50), b.ids({2, 3, 4}, 50)}, concat);
  Attrs sb;
  sb.shape = {2, 7};
  sb.axis = 1;
  sb.start = 2;
  b.add("middle", OpId::slice_backward, {b.r({2, 3})}, sb);
  sb.shape = {5, 3};
  sb.axis = 0;
  sb.start = 0;
  b.add("whole", OpId::slice_backward, {b.r({5, 3})}, sb);
  sb.shape = {3, 5, 4};  // a middle axis: rows before it and a row length after it
  sb.axis = 1;
  sb.start = 1;
  b.add("middle_axis", OpId::slice_backward, {b.r({3, 2, 4})}, sb);
}

void elementwise_cases(Builder& b) {
  for (OpId op : {OpId::add, OpId::sub, OpId::mul, OpId::div}) {
    bool divide = op == OpId::div;
    auto rhs = [&](const Shape& s) { return divide ? b.r(s, 0.5f, 2.0f) : b.r(s); };
    b.add("same", op, {b.r({3, 4}), rhs({3, 4})});
    b.add("odd_large", op, {b.r({67, 301}), rhs({67, 301})});
    b.add("bias", op, {b.r({2, 3, 4}), rhs({4})});
    b.add("bias_large", op, {b.r({64, 384}), rhs({384})});
    b.add("scalar", op, {b.r({5, 2}), rhs({1})});
    b.add("both_broadcast", op, {b.r({2, 1, 4}), rhs({3, 1})});
    b.add("lhs_broadcast", op, {b.r({4}), rhs({3, 4})});
    b.add("non_contiguous", op,
          {b.nc({6, 5}), divide ? b.r({5, 6}, 0.5f, 2.0f).transpose(0, 1) : b.nc({6, 5})});
    b.add("size1", op, {b.r({1}), rhs({1})});
    b.add("per_row", op, {b.r({4, 6, 33}), rhs({4, 6, 1})});
    b.add("per_row_left", op, {b.r({40, 1}), rhs({40, 700})});
    b.add("scalar_left", op, {b.r({1}), rhs({30, 700})});
  }
  Attrs scale;
  scale.alpha = -1.75;
  b.add("small", OpId::scale, {b.r({3, 5})}, scale);
  b.add("large", OpId::scale, {b.r({300, 257})}, scale);
  for (OpId op : {OpId::exp, OpId::tanh, OpId::relu, OpId::gelu}) {
    b.add("odd", op, {b.r({7, 13}, -3.0f, 3.0f)});
    b.add("large", op, {b.r({300, 257}, -5.0f, 5.0f)});
    b.add("non_contiguous", op, {b.nc({9, 4})});
    b.add("size1", op, {b.r({1})});
  }
  b.add("odd", OpId::log, {b.r({7, 13}, 0.01f, 10.0f)});
  b.add("odd", OpId::sqrt, {b.r({7, 13}, 0.0f, 10.0f)});
  b.add("large", OpId::sqrt, {b.r({300, 257}, 0.01f, 100.0f)});
  b.add("odd", OpId::erf, {b.r({7, 13}, -3.0f, 3.0f)});
  b.add("large", OpId::erf, {b.r({300, 257}, -5.0f, 5.0f)});
  b.add("size1", OpId::erf, {b.r({1})});
  b.add("large", OpId::log, {b.r({300, 257}, 0.01f, 10.0f)});
  for (OpId op : {OpId::relu_backward, OpId::gelu_backward, OpId::tanh_backward}) {
    b.add("odd", op, {b.r({7, 13}), b.r({7, 13}, -3.0f, 3.0f)});
    b.add("large", op, {b.r({300, 257}), b.r({300, 257}, -3.0f, 3.0f)});
  }
  Attrs drop;
  drop.p = 0.3;
  drop.seed = 42;
  b.add("p0.3", OpId::dropout, {b.r({40, 50})}, drop);
  b.add("p0.3_large", OpId::dropout, {b.r({300, 257})}, drop);
  b.add("p0.3", OpId::dropout_backward, {b.r({40, 50})}, drop);
}

void reduction_cases(Builder& b) {
  for (OpId op : {OpId::sum, OpId::mean}) {
    b.add("all", op, {b.r({3, 4, 5})}, axes_attrs({}), Measure::nmse, 1e-10);
    b.add("axis0", op, {b.r({7, 9})}, axes_attrs({0}), Measure::nmse, 1e-10);
    b.add("axis1_keepdim", op, {b.r({7, 9})}, axes_attrs({1}, true), Measure::nmse, 1e-10);
    b.add("axes0_2", op, {b.r({3, 4, 5})}, axes_attrs({0, 2}), Measure::nmse, 1e-10);
    b.add("prefix_large", op, {b.r({64, 8, 384})}, axes_attrs({0, 1}), Measure::nmse, 1e-10);
    b.add("suffix_large", op, {b.r({300, 257})}, axes_attrs({-1}), Measure::nmse, 1e-10);
    b.add("non_contiguous", op, {b.nc({6, 5})}, axes_attrs({0}), Measure::nmse, 1e-10);
  }
  Attrs mx;
  mx.axis = 1;
  b.add("axis1", OpId::max, {b.r({4, 7})}, mx);
  mx.axis = 0;
  mx.keepdim = true;
  b.add("axis0_keepdim", OpId::max, {b.r({5, 3, 2})}, mx);
  for (Attrs a : {[] {
                    Attrs x;
                    x.axis = 1;
                    return x;
                  }(),
                  [] {
                    Attrs x;
                    x.axis = 0;
                    x.keepdim = true;
                    return x;
                  }()}) {
    Tensor x = b.r({5, 6});
    Tensor y = run_reference(OpId::max, {x}, a)[0];
    b.add(a.keepdim ? "axis0_keepdim" : "axis1", OpId::max_backward, {b.r(y.shape()), x, y}, a);
  }
  b.add("vector", OpId::sum_squares, {b.r({1000})}, {}, Measure::nmse, 1e-10);
  b.add("large", OpId::sum_squares, {b.r({300, 257})}, {}, Measure::nmse, 1e-10);
}

void softmax_cases(Builder& b) {
  for (OpId op : {OpId::softmax, OpId::log_softmax}) {
    b.add("odd", op, {b.r({5, 11}, -4.0f, 4.0f)});
    b.add("width1", op, {b.r({3, 1})});
    b.add("3d_large", op, {b.r({8, 30, 70}, -4.0f, 4.0f)});
    b.add("non_contiguous", op, {b.nc({6, 5})});
  }
  for (auto [fwd, bwd] : {std::pair{OpId::softmax, OpId::softmax_backward},
                          std::pair{OpId::log_softmax, OpId::log_softmax_backward}}) {
    Tensor y = run_reference(fwd, {b.r({6, 9}, -3.0f, 3.0f)}, {})[0];
    b.add("odd", bwd, {b.r({6, 9}), y});
  }
  for (auto [n, v] :
       {std::pair<std::int64_t, std::int64_t>{6, 11}, {1, 3}, {128, 65}, {40, 1000}}) {
    char label[32];
    std::snprintf(label, sizeof label, "%lldx%lld", static_cast<long long>(n),
                  static_cast<long long>(v));
    Tensor logits = b.r({n, v}, -5.0f, 5.0f);
    Tensor targets = b.ids({n}, v);
    b.add(label, OpId::cross_entropy, {logits, targets}, {}, Measure::elementwise, 1e-4);
    Tensor lse = run_reference(OpId::cross_entropy, {logits, targets}, {})[1];
    b.add(label, OpId::cross_entropy_backward, {b.r({}), logits, targets, lse});
  }
}

void matmul_cases(Builder& b) {
  auto mm = [](bool ta, bool tb) {
    Attrs a;
    a.trans_a = ta;
    a.trans_b = tb;
    return a;
  };
  const double t = 1e-9;
  b.add("5x7_7x3", OpId::matmul, {b.r({5, 7}), b.r({7, 3})}, mm(false, false), Measure::nmse, t);
  b.add("trans_a", OpId::matmul, {b.r({7, 5}), b.r({7, 3})}, mm(true, false), Measure::nmse, t);
  b.add("trans_b", OpId::matmul, {b.r({5, 7}), b.r({3, 7})}, mm(false, true), Measure::nmse, t);
  b.add("trans_ab", OpId::matmul, {b.r({7, 5}), b.r({3, 7})}, mm(true, true), Measure::nmse, t);
  b.add("batched_shared_b", OpId::matmul, {b.r({2, 3, 4, 5}), b.r({5, 6})}, mm(false, false),
        Measure::nmse, t);
  b.add("batched_both", OpId::matmul, {b.r({3, 4, 5}), b.r({3, 5, 6})}, mm(false, false),
        Measure::nmse, t);
  b.add("batch_broadcast", OpId::matmul, {b.r({2, 1, 4, 5}), b.r({3, 5, 6})}, mm(false, false),
        Measure::nmse, t);
  b.add("batched_trans_a", OpId::matmul, {b.r({3, 5, 4}), b.r({5, 6})}, mm(true, false),
        Measure::nmse, t);
  // Large enough (m n k >= 2^27) for the CPU to transpose A into place first; the
  // transpose's 64 x 64 tiles do not divide the sizes.
  b.add("trans_a_large", OpId::matmul, {b.r({520, 513}), b.r({520, 515})}, mm(true, false),
        Measure::nmse, t);
  b.add("trans_ab_large", OpId::matmul, {b.r({520, 513}), b.r({515, 520})}, mm(true, true),
        Measure::nmse, t);
  // Few rows (M < 512), B's rows 1024 floats apart, m n k >= 2^27: the CPU pads B's rows
  // apart first, after transposing A in the second.
  b.add("padded_b_large", OpId::matmul, {b.r({260, 520}), b.r({520, 1024})}, mm(false, false),
        Measure::nmse, t);
  b.add("trans_a_padded_b_large", OpId::matmul, {b.r({520, 260}), b.r({520, 1024})},
        mm(true, false), Measure::nmse, t);
  b.add("1x1", OpId::matmul, {b.r({1, 1}), b.r({1, 1})}, mm(false, false), Measure::nmse, t);
  b.add("k1", OpId::matmul, {b.r({4, 1}), b.r({1, 3})}, mm(false, false), Measure::nmse, t);
  b.add("large_odd", OpId::matmul, {b.r({129, 67}), b.r({67, 130})}, mm(false, false),
        Measure::nmse, t);
  b.add("non_contiguous", OpId::matmul, {b.nc({6, 5}), b.nc({5, 4})}, mm(false, false),
        Measure::nmse, t);
  // Larger products, in each layout (GEMM libraries switch kernels with size).
  b.add("large_131x257x129", OpId::matmul, {b.r({131, 257}), b.r({257, 129})}, mm(false, false),
        Measure::nmse, t);
  b.add("large_trans_a", OpId::matmul, {b.r({257, 131}), b.r({257, 129})}, mm(true, false),
        Measure::nmse, t);
  b.add("large_trans_b_batched", OpId::matmul, {b.r({2, 131, 257}), b.r({129, 257})},
        mm(false, true), Measure::nmse, t);
  Attrs lin;
  b.add("3d", OpId::linear, {b.r({2, 3, 5}), b.r({5, 4}), b.r({4})}, lin, Measure::nmse, t);
  lin.trans_b = true;
  b.add("trans_b", OpId::linear, {b.r({7, 5}), b.r({4, 5}), b.r({4})}, lin, Measure::nmse, t);
  b.add("large", OpId::linear, {b.r({96, 128}), b.r({384, 128}), b.r({384})}, lin, Measure::nmse,
        t);
  b.add("large_3d", OpId::linear, {b.r({2, 65, 257}), b.r({257, 260}), b.r({260})}, Attrs{},
        Measure::nmse, t);
}

void nn_cases(Builder& b) {
  for (Shape s : {Shape{4, 16}, Shape{2, 3, 7}, Shape{3, 1}, Shape{64, 384}, Shape{1100, 40}}) {
    Tensor x = b.r(s, -2.0f, 3.0f), w = b.r({s.back()}), bias = b.r({s.back()});
    b.add(shape_str(s), OpId::layer_norm, {x, w, bias}, {}, Measure::elementwise, 2e-4);
    std::vector<Tensor> fwd = run_reference(OpId::layer_norm, {x, w, bias}, {});
    b.add(shape_str(s), OpId::layer_norm_backward, {b.r(s), x, w, fwd[1], fwd[2]}, {},
          Measure::nmse, 1e-9);
  }
  for (Shape s : {Shape{4, 16}, Shape{2, 3, 4, 8}, Shape{5, 3}, Shape{64, 384}}) {
    Tensor x = b.r(s, -2.0f, 3.0f), w = b.r({s.back()});
    Attrs a;
    a.eps = 1e-6;
    b.add(shape_str(s), OpId::rms_norm, {x, w}, a, Measure::elementwise, 2e-4);
    std::vector<Tensor> fwd = run_reference(OpId::rms_norm, {x, w}, a);
    b.add(shape_str(s), OpId::rms_norm_backward, {b.r(s), x, w, fwd[1]}, a, Measure::nmse, 1e-9);
  }
  for (Shape s : {Shape{2, 5, 3, 8}, Shape{7, 2, 4}, Shape{1, 64, 4, 32}}) {
    Shape table{s[s.size() - 3], s.back() / 2};
    b.add(shape_str(s), OpId::rope, {b.r(s), b.r(table), b.r(table)});
  }
  for (Shape s : {Shape{3, 7}, Shape{2, 64, 344}}) {
    b.add(shape_str(s), OpId::silu, {b.r(s, -6.0f, 6.0f)});
    b.add(shape_str(s), OpId::silu_backward, {b.r(s), b.r(s, -6.0f, 6.0f)});
    b.add(shape_str(s), OpId::swiglu, {b.r(s, -6.0f, 6.0f), b.r(s)});
    b.add(shape_str(s), OpId::swiglu_backward, {b.r(s), b.r(s, -6.0f, 6.0f), b.r(s)}, Attrs{},
          Measure::nmse, 1e-9);
  }
  b.add("11x6", OpId::embedding, {b.r({11, 6}), b.ids({2, 3}, 11)});
  b.add("large", OpId::embedding, {b.r({65, 128}), b.ids({12, 64}, 65)});
  Attrs eb;
  eb.shape = {11, 6};
  b.add("repeats", OpId::embedding_backward, {b.r({2, 9, 6}), b.ids({2, 9}, 3)}, eb, Measure::nmse,
        1e-10);
  eb.shape = {65, 128};
  b.add("large", OpId::embedding_backward, {b.r({12, 64, 128}), b.ids({12, 64}, 65)}, eb,
        Measure::nmse, 1e-10);
  b.add("repeats", OpId::embedding_backward_add, {b.r({11, 6}), b.r({2, 9, 6}), b.ids({2, 9}, 3)},
        {}, Measure::nmse, 1e-10);
  b.add("large", OpId::embedding_backward_add,
        {b.r({65, 128}), b.r({12, 64, 128}), b.ids({12, 64}, 65)}, {}, Measure::nmse, 1e-10);
  for (auto [bt, t, c, h] : std::vector<std::array<std::int64_t, 4>>{
           {2, 5, 8, 2}, {1, 1, 4, 1}, {2, 17, 16, 4}, {3, 64, 32, 2}, {2, 100, 16, 2}}) {
    char label[64];
    std::snprintf(label, sizeof label, "B%lldT%lldC%lldH%lld", static_cast<long long>(bt),
                  static_cast<long long>(t), static_cast<long long>(c), static_cast<long long>(h));
    Attrs a;
    a.heads = h;
    Tensor qkv = b.r({bt, t, 3 * c});
    b.add(label, OpId::causal_attention, {qkv}, a, Measure::nmse, 1e-9);
    std::vector<Tensor> fwd = run_reference(OpId::causal_attention, {qkv}, a);
    b.add(label, OpId::causal_attention_backward, {b.r({bt, t, c}), qkv, fwd[0], fwd[1]}, a,
          Measure::nmse, 1e-9);
  }
  // Grouped-query attention: B, Tq, Tk, H, G, D (Tq < Tk: queries after a KV cache).
  for (auto [bt, tq, tk, h, g, d] :
       std::vector<std::array<std::int64_t, 6>>{{2, 5, 5, 2, 2, 4},
                                                {1, 1, 1, 1, 1, 4},
                                                {2, 17, 17, 4, 2, 8},
                                                {1, 3, 9, 4, 1, 8},
                                                {2, 64, 64, 4, 2, 16},
                                                {1, 100, 100, 6, 3, 8}}) {
    char label[96];
    std::snprintf(label, sizeof label, "B%lldTq%lldTk%lldH%lldG%lldD%lld",
                  static_cast<long long>(bt), static_cast<long long>(tq),
                  static_cast<long long>(tk), static_cast<long long>(h), static_cast<long long>(g),
                  static_cast<long long>(d));
    Tensor q = b.r({bt, tq, h, d}), k = b.r({bt, tk, g, d}), v = b.r({bt, tk, g, d});
    b.add(label, OpId::attention, {q, k, v}, {}, Measure::nmse, 1e-9);
    std::vector<Tensor> fwd = run_reference(OpId::attention, {q, k, v}, {});
    b.add(label, OpId::attention_backward, {b.r({bt, tq, h, d}), q, k, v, fwd[0], fwd[1]}, {},
          Measure::nmse, 1e-9);
  }
  struct Conv {
    Shape x, w;
    std::int64_t stride, padding;
  };
  for (const Conv& c :
       {Conv{{2, 3, 7, 6}, {4, 3, 3, 3}, 1, 1}, Conv{{1, 2, 9, 9}, {3, 2, 3, 3}, 2, 1},
        Conv{{2, 4, 5, 5}, {2, 4, 1, 1}, 1, 0}, Conv{{3, 1, 8, 8}, {5, 1, 5, 5}, 1, 2}}) {
    Attrs a;
    a.stride = c.stride;
    a.padding = c.padding;
    char tail[32];
    std::snprintf(tail, sizeof tail, "s%lldp%lld", static_cast<long long>(c.stride),
                  static_cast<long long>(c.padding));
    std::string label = shape_str(c.x);
    label.append("*").append(shape_str(c.w)).append(tail);
    Tensor x = b.r(c.x), w = b.r(c.w), bias = b.r({c.w[0]});
    Tensor y = run_reference(OpId::conv2d, {x, w, bias}, a)[0];
    b.add(label, OpId::conv2d, {x, w, bias}, a, Measure::nmse, 1e-9);
    b.add(label, OpId::conv2d_backward, {b.r(y.shape()), x, w}, a, Measure::nmse, 1e-9);
  }
  for (auto [kernel, stride] : {std::pair<std::int64_t, std::int64_t>{2, 2}, {3, 1}}) {
    Attrs a;
    a.kernel = kernel;
    a.stride = stride;
    a.shape = {2, 3, 8, 6};
    char label[32];
    std::snprintf(label, sizeof label, "k%llds%lld", static_cast<long long>(kernel),
                  static_cast<long long>(stride));
    Tensor x = b.r(a.shape);
    std::vector<Tensor> fwd = run_reference(OpId::max_pool2d, {x}, a);
    b.add(label, OpId::max_pool2d, {x}, a);
    b.add(label, OpId::max_pool2d_backward, {b.r(fwd[0].shape()), fwd[1]}, a);
    b.add(label, OpId::avg_pool2d, {x}, a);
    b.add(label, OpId::avg_pool2d_backward, {b.r(fwd[0].shape())}, a);
  }
  // Routing: each row's k largest; equal values by the lower index; the backward's scatter.
  Attrs top;
  top.k = 3;
  const Tensor scores = b.r({6, 16});
  b.add("rows_k3", OpId::top_k, {scores}, top);
  Attrs place = top;
  place.shape = {6, 16};
  b.add("rows_k3", OpId::top_k_backward,
        {b.r({6, 3}), run_reference(OpId::top_k, {scores}, top)[1]}, place);
  top.k = 8;
  b.add("whole_rows", OpId::top_k, {b.r({2, 3, 8})}, top);
  top.k = 4;
  b.add(
      "ties", OpId::top_k,
      {Tensor::from_floats({2, 6}, std::vector<float>{1, 3, 3, 0, 3, 1, 2, 2, 2, 2, 2, 2}, cpu())},
      top);
  Attrs adam;
  adam.lr = 0.01;
  adam.weight_decay = 0.1;
  adam.step = 3;
  adam.beta2 = 0.99;
  adam.eps = 1e-8;
  b.add("small", OpId::adamw_step,
        {b.r({5, 3}), b.r({5, 3}), b.r({5, 3}, -0.1f, 0.1f), b.r({5, 3}, 0.0f, 0.01f)}, adam);
  b.add("large", OpId::adamw_step,
        {b.r({300, 257}), b.r({300, 257}), b.r({300, 257}, -0.1f, 0.1f),
         b.r({300, 257}, 0.0f, 0.01f)},
        adam);
}

}  // namespace

// Chains as the graph's fusion pass makes them: exact GELU as ONNX exports spell it, the
// tail of a layer norm written in primitives (per-row and per-column broadcasts), a
// backward pair with an expanded operand, and odd and large sizes (the threaded path).
void fused_cases(Builder& b) {
  auto attrs = [](Shape shape, int inputs, std::vector<ElementwiseStep> steps) {
    auto program = std::make_shared<ElementwiseProgram>();
    program->num_inputs = inputs;
    program->steps = std::move(steps);
    Attrs a;
    a.shape = std::move(shape);
    a.program = std::move(program);
    return a;
  };
  using S = ElementwiseStep;
  // x0 * (erf(x0 / x1) + x2) * x3 with x1 = sqrt 2, x2 = 1, x3 = 0.5 as scalars
  auto gelu_erf = [&](Shape shape) {
    return attrs(shape, 4,
                 {S{OpId::div, {0, 1}}, S{OpId::erf, {4, -1}}, S{OpId::add, {5, 2}},
                  S{OpId::mul, {0, 6}}, S{OpId::mul, {7, 3}}});
  };
  auto scalars = [&](std::vector<Tensor> in) {
    for (float v : {1.4142135f, 1.0f, 0.5f})
      in.push_back(Tensor::from_floats({}, std::vector<float>{v}, cpu()));
    return in;
  };
  b.add("gelu_erf", OpId::fused_elementwise, scalars({b.r({2, 5, 7}, -3.0f, 3.0f)}),
        gelu_erf({2, 5, 7}));
  b.add("gelu_erf_large", OpId::fused_elementwise, scalars({b.r({64, 1031}, -4.0f, 4.0f)}),
        gelu_erf({64, 1031}));
  b.add("gelu_erf_non_contiguous", OpId::fused_elementwise, scalars({b.nc({6, 9})}),
        gelu_erf({6, 9}));
  b.add("gelu_erf_size1", OpId::fused_elementwise, scalars({b.r({1})}), gelu_erf({1}));
  // (x0 - x1) / sqrt(x2 + eps) * w + bias: x1, x2 per row [.., 1], w and bias per column
  Attrs norm = attrs({3, 4, 33}, 6,
                     {S{OpId::sub, {0, 1}}, S{OpId::add, {2, 3}}, S{OpId::sqrt, {7, -1}},
                      S{OpId::div, {6, 8}}, S{OpId::mul, {9, 4}}, S{OpId::add, {10, 5}}});
  b.add("norm_tail", OpId::fused_elementwise,
        {b.r({3, 4, 33}), b.r({3, 4, 1}), b.r({3, 4, 1}, 0.1f, 2.0f),
         Tensor::from_floats({}, std::vector<float>{1e-5f}, cpu()), b.r({33}), b.r({33})},
        norm);
  Attrs norm_large = norm;
  norm_large.shape = {40, 2, 700};
  b.add("norm_tail_large", OpId::fused_elementwise,
        {b.r({40, 2, 700}), b.r({40, 2, 1}), b.r({40, 2, 1}, 0.1f, 2.0f),
         Tensor::from_floats({1}, std::vector<float>{1e-5f}, cpu()), b.r({700}), b.r({1, 2, 700})},
        norm_large);
  // gelu_backward(expand(x0) * scale(x1), tanh(x2)) - relu_backward(x1, x2) + log(exp(x1))
  Attrs pairs = attrs(
      {5, 6}, 3,
      {S{OpId::expand, {0, -1}}, S{OpId::scale, {1, -1}, -0.75}, S{OpId::mul, {3, 4}},
       S{OpId::tanh, {2, -1}}, S{OpId::gelu_backward, {5, 6}}, S{OpId::relu_backward, {1, 2}},
       S{OpId::sub, {7, 8}}, S{OpId::exp, {1, -1}}, S{OpId::log, {10, -1}}, S{OpId::add, {9, 11}},
       S{OpId::gelu, {12, -1}}, S{OpId::relu, {13, -1}}, S{OpId::tanh_backward, {14, 5}}});
  b.add("backward_pairs", OpId::fused_elementwise, {b.r({5, 1}), b.r({5, 6}), b.r({5, 6})}, pairs);
  // Three outputs: two intermediates that are read after the chain, and the end.
  Attrs three = pairs;
  auto program = std::make_shared<ElementwiseProgram>(*pairs.program);
  program->outputs = {5, 9, 3 + static_cast<int>(program->steps.size()) - 1};
  three.program = program;
  b.add("three_outputs", OpId::fused_elementwise, {b.r({5, 1}), b.r({5, 6}), b.r({5, 6})}, three);
  three.shape = {70, 300};
  b.add("three_outputs_large", OpId::fused_elementwise,
        {b.r({70, 1}), b.r({70, 300}), b.r({70, 300})}, three);

  // Row reductions: a whole layer norm in primitives, as ONNX exports spell it, after the
  // residual add: mean, centre, mean of squares, + eps, sqrt, divide, scale, shift. Three
  // outputs of both kinds: the centred rows, the per-row sqrt (a row value), the result.
  Attrs layer_norm = attrs(
      {3, 4, 33}, 5,
      {S{OpId::add, {0, 1}}, S{OpId::mean, {5, -1}}, S{OpId::sub, {5, 6}}, S{OpId::mul, {7, 7}},
       S{OpId::mean, {8, -1}}, S{OpId::add, {9, 2}}, S{OpId::sqrt, {10, -1}}, S{OpId::div, {7, 11}},
       S{OpId::mul, {12, 3}}, S{OpId::add, {13, 4}}});
  auto with_outputs = [](Attrs a, std::vector<int> outputs) {
    auto program = std::make_shared<ElementwiseProgram>(*a.program);
    program->outputs = std::move(outputs);
    a.program = program;
    return a;
  };
  layer_norm = with_outputs(layer_norm, {7, 11, 14});
  auto norm_inputs = [&](Shape shape) {
    Shape column{shape.back()};
    return std::vector<Tensor>{b.r(shape), b.r(shape),
                               Tensor::from_floats({}, std::vector<float>{1e-5f}, cpu()),
                               b.r(column), b.r(column)};
  };
  b.add("layer_norm_rows", OpId::fused_elementwise, norm_inputs({3, 4, 33}), layer_norm);
  // Rows longer than the CPU's block, rows enough to thread.
  Attrs layer_norm_large = layer_norm;
  layer_norm_large.shape = {40, 2, 1100};
  b.add("layer_norm_rows_large", OpId::fused_elementwise, norm_inputs({40, 2, 1100}),
        layer_norm_large);
  // Column inputs of two dimensions ([4, 33] over [3, 4, 33]): the collapsed space's inner
  // dimension is then longer than a row (4 x 33), so a kernel that walks rows finds each
  // element's coordinates from its index.
  auto norm_inputs_2d = [&](Shape shape) {
    Shape columns{shape[shape.size() - 2], shape.back()};
    return std::vector<Tensor>{b.r(shape), b.r(shape),
                               Tensor::from_floats({}, std::vector<float>{1e-5f}, cpu()),
                               b.r(columns), b.r(columns)};
  };
  b.add("layer_norm_rows_2d_columns", OpId::fused_elementwise, norm_inputs_2d({3, 4, 33}),
        layer_norm);
  // A row sum feeding row steps that read a row input, and a full output after it: the
  // backward of a normalisation, sum(x0 * x1) / x2 (x2 per row) scaled into x1.
  Attrs row_sum = with_outputs(
      attrs({6, 1031}, 3,
            {S{OpId::mul, {0, 1}}, S{OpId::sum, {3, -1}}, S{OpId::scale, {4, -1}, -0.5},
             S{OpId::div, {5, 2}}, S{OpId::mul, {1, 6}}, S{OpId::add, {0, 7}}}),
      {6, 8});
  b.add("row_sum_then_rows", OpId::fused_elementwise,
        {b.r({6, 1031}), b.nc({6, 1031}), b.r({6, 1}, 0.5f, 2.0f)}, row_sum);

  // A product as input 0 of a chain (matmul_elementwise): a linear layer's bias and exact
  // GELU, as the graph's epilogue pass makes them from linear + chain; a batched product
  // against a shared weight with a per-row input; B transposed; and sizes past the GEMM
  // kernels' tiles (rows not a multiple of 4, columns not of 8) with two outputs.
  auto product_chain = [&](Shape shape, bool trans_b, int inputs, std::vector<S> steps,
                           std::vector<int> outputs = {}) {
    Attrs a = attrs(std::move(shape), inputs, std::move(steps));
    a.trans_b = trans_b;
    return with_outputs(a, std::move(outputs));
  };
  // (x0 + x1) * (erf((x0 + x1) / x2) + x3) * x4: x1 the bias, x2..x4 scalars
  auto bias_gelu = [&](Shape shape, bool trans_b, std::vector<int> outputs = {}) {
    return product_chain(std::move(shape), trans_b, 5,
                         {S{OpId::add, {0, 1}}, S{OpId::div, {5, 2}}, S{OpId::erf, {6, -1}},
                          S{OpId::add, {7, 3}}, S{OpId::mul, {5, 8}}, S{OpId::mul, {9, 4}}},
                         std::move(outputs));
  };
  auto with_scalars = [&](std::vector<Tensor> in) {
    for (float v : {1.4142135f, 1.0f, 0.5f})
      in.push_back(Tensor::from_floats({}, std::vector<float>{v}, cpu()));
    return in;
  };
  b.add("bias_gelu", OpId::matmul_elementwise, with_scalars({b.r({6, 5}), b.r({5, 7}), b.r({7})}),
        bias_gelu({6, 7}, false));
  b.add("bias_gelu_trans_b", OpId::matmul_elementwise,
        with_scalars({b.r({7, 9}), b.r({8, 9}), b.r({8})}), bias_gelu({7, 8}, true));
  b.add("bias_gelu_large", OpId::matmul_elementwise,
        with_scalars({b.r({70, 33}), b.r({33, 130}), b.r({130})}),
        bias_gelu({70, 130}, false, {5, 10}));
  // Chains of adds, multiplies and selections (the ones OpenCL runs inside its GEMM
  // kernels): relu(x0 + bias) with the biased product an output too, 70 x 130 (A as
  // stored, B as stored); 0.5 x0 + x1 with B transposed and a residual; x0 * x1 with A
  // transposed and x1 per row.
  b.add("bias_relu_two_outputs", OpId::matmul_elementwise,
        {b.r({70, 33}), b.r({33, 130}), b.r({130})},
        product_chain({70, 130}, false, 2, {S{OpId::add, {0, 1}}, S{OpId::relu, {2, -1}}}, {2, 3}));
  b.add("trans_b_scale_residual", OpId::matmul_elementwise,
        {b.r({13, 9}), b.r({11, 9}), b.r({13, 11})},
        product_chain({13, 11}, true, 2, {S{OpId::scale, {0, -1}, 0.5}, S{OpId::add, {2, 1}}}));
  Attrs trans_a = product_chain({6, 5}, false, 2, {S{OpId::mul, {0, 1}}});
  trans_a.trans_a = true;
  b.add("trans_a_rows", OpId::matmul_elementwise, {b.r({9, 6}), b.r({9, 5}), b.r({6, 1})}, trans_a);
  b.add(
      "batched_rows_residual_cheap", OpId::matmul_elementwise,
      {b.r({3, 4, 5}), b.r({5, 6}), b.r({3, 4, 1}), b.r({3, 4, 6})},
      product_chain({3, 4, 6}, false, 3,
                    {S{OpId::mul, {0, 1}}, S{OpId::sub, {3, 2}}, S{OpId::relu_backward, {4, 2}}}));
  // tanh(x0 * x1) + x2: x0 the [3, 4, 6] product of a batch against one weight, x1 per row
  // [3, 4, 1], x2 a full [3, 4, 6] input (a residual).
  b.add("batched_rows_residual", OpId::matmul_elementwise,
        {b.r({3, 4, 5}), b.r({5, 6}), b.r({3, 4, 1}), b.r({3, 4, 6})},
        product_chain({3, 4, 6}, false, 3,
                      {S{OpId::mul, {0, 1}}, S{OpId::tanh, {3, -1}}, S{OpId::add, {4, 2}}}));
}

// Selection, comparison and the math functions (after the others, so their random
// inputs stay as they were).
void selection_cases(Builder& b) {
  for (MathFunction f : kMathFunctions) {
    Attrs a;
    a.function = f;
    // Inside each function's domain: (-1, 1) for asin, acos, atanh; above 1 for acosh.
    const bool unit =
        f == MathFunction::asin || f == MathFunction::acos || f == MathFunction::atanh;
    const float lo = unit ? -0.95f : f == MathFunction::acosh ? 1.05f : -3.0f;
    const float hi = unit ? 0.95f : f == MathFunction::acosh ? 4.0f : 3.0f;
    const std::string name = std::to_string(static_cast<int>(f));
    b.add("small_" + name, OpId::math, {b.r({7, 13}, lo, hi)}, a);
    b.add("large_" + name, OpId::math, {b.r({300, 17}, lo, hi)}, a);
  }
  {
    Attrs round;  // halves round to even
    round.function = MathFunction::round;
    b.add("halves", OpId::math,
          {Tensor::from_floats({6}, std::vector<float>{-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f},
                               cpu())},
          round);
  }
  // where: a 0/1 mask from a comparison of random values, broadcast against both sides;
  // one side holds infinities that the mask must keep out.
  auto mask = [&](const Shape& s) {
    Attrs gt;
    gt.comparison = Comparison::gt;
    return run_reference(OpId::compare, {b.r(s), b.r({1}, 0.0f, 0.0f)}, gt)[0];
  };
  b.add("same", OpId::where, {mask({3, 4}), b.r({3, 4}), b.r({3, 4})});
  b.add("broadcast", OpId::where, {mask({4, 1}), b.r({1, 5}), b.r({4, 5})});
  b.add("large", OpId::where, {mask({67, 301}), b.r({67, 301}), b.r({301})});
  std::vector<float> infinities(12, -std::numeric_limits<float>::infinity());
  b.add("infinite_other_side", OpId::where,
        {mask({3, 4}), b.r({3, 4}), Tensor::from_floats({3, 4}, infinities, cpu())});
  // compare: every comparison, with ties (values drawn from a few integers) and broadcasts.
  auto few = [&](const Shape& s) {
    std::vector<float> v = b.r(s, 0.0f, 3.0f).to_floats();
    for (float& x : v)
      x = std::floor(x);
    return Tensor::from_floats(s, v, cpu());
  };
  for (Comparison how :
       {Comparison::eq, Comparison::lt, Comparison::le, Comparison::gt, Comparison::ge}) {
    Attrs cmp;
    cmp.comparison = how;
    const std::string name = std::to_string(static_cast<int>(how));
    b.add("same_" + name, OpId::compare, {few({5, 7}), few({5, 7})}, cmp);
    b.add("broadcast_" + name, OpId::compare, {few({4, 1, 3}), few({2, 1})}, cmp);
  }
}

std::vector<OpCase> all_op_cases() {
  Builder b;
  utility_cases(b);
  elementwise_cases(b);
  reduction_cases(b);
  softmax_cases(b);
  matmul_cases(b);
  nn_cases(b);
  fused_cases(b);
  selection_cases(b);
  return std::move(b.cases);
}

}  // namespace loom::testing
