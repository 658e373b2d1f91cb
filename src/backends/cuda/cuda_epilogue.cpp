// The CUDA backend's matmul_elementwise: a GEMM whose product an elementwise chain reads
// next (graph/fusion.cpp, fold_gemm_epilogues). Where the chain is one of cuBLASLt's
// epilogues (a bias, ReLU, GELU, GELU keeping its input, GELU's gradient), or adds a
// tensor whole after the bias (a residual connection, as cuBLASLt's C with beta 1), it
// runs as one cublasLtMatmul, the chain applied as each value is stored; any other
// chain, or operands cuBLASLt's epilogues do not take, runs as cuBLAS's GEMM and then the
// chain's interpreter kernel (the bits of the unfused matmul and fused_elementwise).
#include <memory>
#include <optional>
#include <type_traits>

#include "backends/cuda/cuda_backend_internal.h"
#include "core/fused_elementwise.h"

namespace loom::cuda {

using namespace detail;

std::optional<LtEpilogue> lt_epilogue_of(const ElementwiseProgram& program) {
  // Registers: 0 the product, 1.. the op's inputs from its third on, then the steps'.
  const int n = program.num_inputs;
  const std::vector<ElementwiseStep>& steps = program.steps;
  const std::vector<int> written = program.output_registers();
  auto is = [&](std::size_t s, OpId op) { return s < steps.size() && steps[s].op == op; };
  auto input = [&](int r) { return r >= 1 && r < n; };  // an input other than the product
  // add(product, x) or add(x, product): x's register, else -1.
  auto bias_of = [&](const ElementwiseStep& s) {
    if (s.op != OpId::add)
      return -1;
    if (s.args[0] == 0 && input(s.args[1]))
      return s.args[1];
    if (s.args[1] == 0 && input(s.args[0]))
      return s.args[0];
    return -1;
  };
  LtEpilogue e;
  if (steps.size() == 1) {
    if (written != std::vector<int>{n})
      return std::nullopt;
    const ElementwiseStep& s = steps[0];
    if (s.op == OpId::relu && s.args[0] == 0)
      e.epilogue = CUBLASLT_EPILOGUE_RELU;
    else if (s.op == OpId::gelu && s.args[0] == 0)
      e.epilogue = CUBLASLT_EPILOGUE_GELU;
    else if (int b = bias_of(s); b >= 0)
      e.epilogue = CUBLASLT_EPILOGUE_BIAS, e.bias_input = b + 1;
    else if (s.op == OpId::gelu_backward && s.args[0] == 0 && input(s.args[1]))
      e.epilogue = CUBLASLT_EPILOGUE_DGELU, e.aux_input = s.args[1] + 1;
    else
      return std::nullopt;
    return e;
  }
  if (steps.size() != 2)
    return std::nullopt;
  const int b = bias_of(steps[0]);
  if (b < 0)
    return std::nullopt;
  e.bias_input = b + 1;
  // The bias, then a tensor added whole (a residual connection): cuBLASLt's C.
  if (is(1, OpId::add) && written == std::vector<int>{n + 1}) {
    const auto [first, second] = steps[1].args;
    const int residual = first == n ? second : second == n ? first : -1;
    if (!input(residual) || residual == b)
      return std::nullopt;
    e.epilogue = CUBLASLT_EPILOGUE_BIAS;
    e.residual_input = residual + 1;
    return e;
  }
  // The bias, then ReLU or GELU on the sum: the result alone, or (GELU) with the sum too.
  if ((!is(1, OpId::relu) && !is(1, OpId::gelu)) || steps[1].args[0] != n)
    return std::nullopt;
  const bool gelu = steps[1].op == OpId::gelu;
  if (written == std::vector<int>{n + 1}) {
    e.epilogue = gelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_RELU_BIAS;
    return e;
  }
  if (!gelu || written.size() != 2 ||
      (written != std::vector<int>{n + 1, n} && written != std::vector<int>{n, n + 1}))
    return std::nullopt;
  e.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  e.result_output = written[0] == n + 1 ? 0 : 1;
  e.aux_output = 1 - e.result_output;
  return e;
}

namespace {

// cuBLASLt's descriptors, destroyed with the call that made them.
template <class Handle, auto Member>
struct LtDestroy {
  const Api* api;
  void operator()(std::remove_pointer_t<Handle>* handle) const { (api->*Member)(handle); }
};
using MatmulDesc =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>,
                    LtDestroy<cublasLtMatmulDesc_t, &Api::cublasLtMatmulDescDestroy>>;
using Layout =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>,
                    LtDestroy<cublasLtMatrixLayout_t, &Api::cublasLtMatrixLayoutDestroy>>;

Layout layout(const Api& api, cudaDataType type, std::uint64_t rows, std::uint64_t cols,
              std::int64_t ld) {
  cublasLtMatrixLayout_t made = nullptr;
  check_cublas(api.cublasLtMatrixLayoutCreate(&made, type, rows, cols, ld),
               "cublasLtMatrixLayoutCreate");
  return Layout(made, {&api});
}

template <class T>
void set(const Api& api, cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
         const T& value) {
  check_cublas(api.cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof value),
               "cublasLtMatmulDescSetAttribute");
}

// A dense row-major tensor of `shape` (a bias: `n` values in its last dimension).
bool dense(const Tensor& t, const Shape& shape) {
  return t.defined() && t.dtype() == DType::f32 && t.is_contiguous() && t.shape() == shape;
}

}  // namespace

bool CudaBackend::lt_matmul_elementwise(const OpCall& call) {
  if (cublas_lt_ == nullptr)
    return false;
  const std::optional<LtEpilogue> e = lt_epilogue_of(*call.attrs.program);
  if (!e)
    return false;
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  const bool ta = call.attrs.trans_a, tb = call.attrs.trans_b;
  const Shape& shape = call.attrs.shape;
  // One product, the batch (if any) folded into M, as matmul folds it.
  if (b.rank() != 2 || (ta && a.rank() != 2) || shape.empty() || !a.is_contiguous() ||
      !b.is_contiguous())
    return false;
  const i64 n = shape.back(), m = shape_numel(shape) / std::max<i64>(n, 1),
            k = ta ? a.dim(-2) : a.dim(-1);
  if (m == 0 || n == 0 || k == 0)
    return false;
  for (const Tensor& y : call.outputs)
    if (!dense(y, shape))
      return false;
  const void* bias = nullptr;
  const void* residual = nullptr;  // cuBLASLt's C, added with beta 1
  cublasLtEpilogue_t epilogue = e->epilogue;
  if (e->bias_input >= 0) {
    const Tensor& x = call.inputs[static_cast<std::size_t>(e->bias_input)];
    if (e->residual_input < 0 && epilogue == CUBLASLT_EPILOGUE_BIAS && dense(x, shape)) {
      residual = ptr<const void>(x);  // add(product, x) with x whole: C, not a bias
      epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    } else if (!x.defined() || x.dtype() != DType::f32 || !x.is_contiguous() || numel(x) != n ||
               x.rank() == 0 || x.dim(-1) != n) {
      return false;  // not one value per column of the product
    } else {
      bias = ptr<const void>(x);
    }
  }
  if (e->residual_input >= 0) {
    const Tensor& x = call.inputs[static_cast<std::size_t>(e->residual_input)];
    if (!dense(x, shape))
      return false;
    residual = ptr<const void>(x);
  }
  // GELU's input (kept forward, read backward): the product's layout, rows a multiple of 8
  // values apart (cuBLASLt's rule for that matrix).
  void* aux = nullptr;
  if (e->aux_input >= 0 || e->aux_output >= 0) {
    if (n % 8 != 0)
      return false;
    if (e->aux_input >= 0) {
      const Tensor& x = call.inputs[static_cast<std::size_t>(e->aux_input)];
      if (!dense(x, shape))
        return false;
      aux = ptr<void>(x);
    } else {
      aux = ptr<void>(call.outputs[static_cast<std::size_t>(e->aux_output)]);
    }
  }
  // Column-major, as cuBLAS: the row-major C = op(A) op(B) is C^T = op(B)^T op(A)^T, so
  // cuBLASLt's A is Loom's B and its B is Loom's A; D is C^T, n x m with n apart, and the
  // bias (one value per row of D) is one per column of C.
  cublasLtMatmulDesc_t made = nullptr;
  check_cublas(api_.cublasLtMatmulDescCreate(&made, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate");
  MatmulDesc desc(made, {&api_});
  const std::int32_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  set(api_, desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set(api_, desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  set(api_, desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<std::uint32_t>(epilogue));
  if (bias != nullptr)
    set(api_, desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (aux != nullptr) {
    set(api_, desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    set(api_, desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<std::int64_t>(n));
  }
  // Under bf16 products the operands are their bf16 copies (as gemm() multiplies them),
  // accumulated in f32 into an f32 D.
  const bool bf16 = matmul_precision_ == DType::bf16;
  const cudaDataType operand_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const Tensor a16 = bf16 ? bf16_copy_of(ptr(a), numel(a)) : Tensor(),
               b16 = bf16 ? bf16_copy_of(ptr(b), numel(b)) : Tensor();
  const void* a_data = bf16 ? ptr<const void>(a16) : ptr<const void>(a);
  const void* b_data = bf16 ? ptr<const void>(b16) : ptr<const void>(b);
  const Layout a_layout = layout(api_, operand_type, static_cast<std::uint64_t>(tb ? k : n),
                                 static_cast<std::uint64_t>(tb ? n : k), b.dim(-1));
  const Layout b_layout = layout(api_, operand_type, static_cast<std::uint64_t>(ta ? m : k),
                                 static_cast<std::uint64_t>(ta ? k : m), a.dim(-1));
  const Layout d_layout =
      layout(api_, CUDA_R_32F, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(m), n);
  float* d = ptr(call.outputs[static_cast<std::size_t>(e->result_output)]);
  // D = epilogue(A B + C): C the residual (beta 1), else D itself, not read (beta 0). No
  // algorithm is named (cuBLASLt asks its heuristics) and no workspace is given, so it picks
  // among the algorithms that need none; a workspace may widen that choice, which is for a
  // measurement on a GPU to decide.
  const float alpha = 1.0f, beta = residual != nullptr ? 1.0f : 0.0f;
  const cublasStatus_t status = api_.cublasLtMatmul(
      cublas_lt_, desc.get(), &alpha, b_data, a_layout.get(), a_data, b_layout.get(), &beta,
      residual != nullptr ? residual : d, d_layout.get(), d, d_layout.get(), nullptr, nullptr, 0,
      reinterpret_cast<cudaStream_t>(current_stream()));
  if (status == CUBLAS_STATUS_NOT_SUPPORTED)
    return false;  // no algorithm for these operands (alignment, device): the general path
  check_cublas(status, "cublasLtMatmul");
  lt_epilogue_calls_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void CudaBackend::matmul_elementwise(const OpCall& call) {
  if (shape_numel(call.attrs.shape) == 0)
    return;
  if (lt_matmul_elementwise(call))
    return;
  // The product, then the chain on it with the product as the chain's input 0.
  Tensor product[] = {Tensor::empty(call.attrs.shape, DType::f32, *this)};
  matmul(OpCall{OpId::matmul, call.inputs.first(2), product, call.attrs});
  std::vector<Tensor> chain{product[0]};
  chain.insert(chain.end(), call.inputs.begin() + 2, call.inputs.end());
  fused(OpCall{OpId::fused_elementwise, chain, call.outputs, call.attrs});
}

}  // namespace loom::cuda
