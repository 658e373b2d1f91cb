// torch/ops_core.cpp — the ATen operators every PyTorch device must have: allocation, views,
// storage, copies between devices, reading one value, filling; and the boxed fallback that
// sends every ATen op without a Loom mapping to PyTorch's CPU kernels, counted.
#include <ATen/EmptyTensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <chrono>

#include "dispatch/dispatch.h"
#include "torch/bridge.h"
#include "torch/coverage.h"
#include "torch/fallback.h"
#include "torch/runtime.h"

namespace loom::torch_device {
namespace {

constexpr c10::DispatchKeySet kLoomKeys(c10::DispatchKey::PrivateUse1);

void check_options(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "loom: only strided tensors (layout ", c10::layout_or_default(layout), " asked)");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "loom: pinned memory is the CPU's");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  check_options(layout, pin_memory);
  const c10::Device d = c10::device_or_default(device);
  const c10::ScalarType type = c10::dtype_or_default(dtype);
  const c10::DeviceGuard guard(d);
  return at::detail::empty_generic(size, &allocator(), kLoomKeys, type, memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  check_options(layout, pin_memory);
  const c10::Device d = c10::device_or_default(device);
  const c10::ScalarType type = c10::dtype_or_default(dtype);
  const c10::DeviceGuard guard(d);
  return at::detail::empty_strided_generic(size, stride, &allocator(), kLoomKeys, type);
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(storage_offset));
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size,
                         c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size),
                                    C10_AS_INTARRAYREF_SLOW(stride));
}

// resize_: the storage grown on its device when the new sizes need more (the old bytes
// kept), then the sizes and contiguous strides set (PyTorch's resize_ semantics).
const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size,
                         std::optional<at::MemoryFormat> memory_format) {
  const c10::IntArrayRef sizes = C10_AS_INTARRAYREF_SLOW(size);
  int64_t numel = 1;
  for (int64_t n : sizes) {
    TORCH_CHECK(n >= 0, "loom: resize_: negative dimension ", n, " in ", sizes);
    numel *= n;
  }
  const std::size_t needed =
      static_cast<std::size_t>(self.storage_offset() + numel) * self.element_size();
  if (numel > 0 && needed > self.storage().nbytes())
    resize_storage(self.storage(), needed);
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(sizes);
  if (memory_format.has_value() && *memory_format != at::MemoryFormat::Preserve)
    impl->empty_tensor_restride(*memory_format);
  return self;
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source) {
  return at::native::set_(self, std::move(source));
}

at::Tensor& set_storage_offset(at::Tensor& self, at::Storage source, int64_t offset,
                               c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::cpu::set_(self, std::move(source), offset, size, stride);
}

// Bytes of `t`'s elements from the start of its storage's buffer.
std::size_t byte_offset(const at::Tensor& t) {
  return static_cast<std::size_t>(t.storage_offset()) * t.element_size();
}

bool host_accessible(const at::Tensor& t) {
  return backend(t.device().index()).host_accessible();
}

// A CPU tensor aliasing the loom tensor `t` (its strides, its bytes): only where the
// backend's memory is host memory.
at::Tensor host_alias(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

// A contiguous host copy of the loom tensor `t` (its dtype): its bytes as they are when
// contiguous, else gathered by Loom's copy on its device (any dtype on host memory).
at::Tensor to_host(const at::Tensor& t, const char* op) {
  if (host_accessible(t))
    return host_alias(t).clone(at::MemoryFormat::Contiguous);
  at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU));
  if (host.numel() == 0)
    return host;
  if (t.is_non_overlapping_and_dense()) {  // its bytes are one span: read as they lie
    at::Tensor lying = at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kCPU));
    backend(t.device().index())
        .download(*buffer_of(t.storage().data_ptr()), byte_offset(t), lying.data_ptr(),
                  lying.nbytes());
    return lying.contiguous();
  }
  const Tensor values = dispatch::contiguous(as_loom(t, op));
  values.backend().download(*values.storage(),
                            static_cast<std::size_t>(values.offset()) * t.element_size(),
                            host.data_ptr(), host.nbytes());
  return host;
}

// PyTorch's copy_ between devices, and within one, arrives here (copy_ itself has checked
// the shapes broadcast).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  RecordedCall record("_copy_from", dst.device().is_privateuseone() ? dst.device() : self.device());
  if (dst.device().is_privateuseone() && host_accessible(dst)) {
    // Host memory: PyTorch's own CPU copy into an alias (any strides, dtypes, broadcast).
    const at::Tensor source =
        self.device().is_privateuseone()
            ? (host_accessible(self) ? host_alias(self) : to_host(self, "copy_"))
            : self;
    host_alias(dst).copy_(source);
  } else if (self.device() == dst.device() && self.scalar_type() == dst.scalar_type() &&
             self.sizes() == dst.sizes() && dst.is_contiguous() &&
             self.scalar_type() == c10::ScalarType::Float) {
    // On the device: Loom's copy gathers the source's strides into the destination.
    write_into(dst, dispatch::contiguous(as_loom(self, "copy_")), "copy_");
  } else if (dst.device().is_privateuseone()) {
    const at::Tensor source = self.is_cpu() ? self : to_host(self, "copy_");
    if (dst.is_non_overlapping_and_dense()) {  // one span: laid out on the host, then sent
      at::Tensor lying =
          at::empty_strided(dst.sizes(), dst.strides(), dst.options().device(at::kCPU));
      lying.copy_(source);
      if (lying.numel() > 0)
        backend(dst.device().index())
            .upload(lying.data_ptr(), *buffer_of(dst.storage().data_ptr()), byte_offset(dst),
                    lying.nbytes());
    } else {
      const at::Tensor host = source.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
      const Tensor staged = Tensor::from_host(Shape(host.sizes().begin(), host.sizes().end()),
                                              loom_dtype(host.scalar_type(), "copy_", dst.device()),
                                              host.data_ptr(), backend(dst.device().index()));
      write_into(dst, staged, "copy_");
    }
  } else {  // to the CPU
    dst.copy_(to_host(self, "copy_"));
  }
  record.done();
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize(dst, c10::fromIntArrayRefSlow(self.sizes()), std::nullopt);
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  return at::native::_local_scalar_dense_cpu(to_host(self, "item"));
}

at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  if (self.scalar_type() != c10::ScalarType::Float) {  // Loom's fill makes f32: the others
    at::Tensor host = at::empty(self.sizes(), self.options().device(at::kCPU));  // on the host
    host.fill_(value);
    copy_from(host, self, false);
    return self;
  }
  RecordedCall record("fill_.Scalar", self.device());
  Attrs attrs;
  attrs.shape = Shape(self.sizes().begin(), self.sizes().end());
  attrs.alpha = value.toDouble();
  const Tensor filled =
      dispatch::call(OpId::fill, {}, attrs, &backend(self.device().index())).front();
  write_into(self, filled, "fill_");
  record.done();
  return self;
}

at::Tensor& zero(at::Tensor& self) {
  return fill_scalar(self, 0);
}

// start, start + step, ... below end: made on the host and sent (positions and indices are
// int64, which Loom's kernels do not compute in; Loom's catalog has no counting op).
at::Tensor& arange_out(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step,
                       at::Tensor& out) {
  RecordedCall record("arange.start_out", out.device());
  at::Tensor host = at::empty({0}, out.options().device(at::kCPU));
  at::arange_out(host, start, end, step);
  if (out.sizes() != host.sizes())
    out.resize_(host.sizes());
  copy_from(host, out, false);
  record.done();
  return out;
}

}  // namespace

namespace {
std::uint64_t tensor_bytes(const torch::jit::Stack& stack, std::size_t first) {
  std::uint64_t bytes = 0;
  for (std::size_t i = first; i < stack.size(); ++i)
    if (stack[i].isTensor() && stack[i].toTensor().defined() &&
        stack[i].toTensor().device().is_privateuseone())
      bytes += stack[i].toTensor().nbytes();
  return bytes;
}

}  // namespace

// ATen ops Loom does not map: PyTorch's CPU kernels, the tensors copied there and back.
void pytorch_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::OperatorName& name = op.schema().operator_name();
  const std::string full = name.name.substr(name.name.rfind(':') + 1) +
                           (name.overload_name.empty() ? "" : "." + name.overload_name);
  const std::size_t arguments = op.schema().arguments().size();
  if (fallback_is_error()) {
    std::string operands;  // each tensor argument's device and dtype
    for (std::size_t i = stack->size() - arguments; i < stack->size(); ++i)
      if ((*stack)[i].isTensor() && (*stack)[i].toTensor().defined()) {
        const at::Tensor& t = (*stack)[i].toTensor();
        operands += (operands.empty() ? "" : ", ") + t.device().str() + " " +
                    std::string(c10::toString(t.scalar_type()));
      }
    TORCH_CHECK_NOT_IMPLEMENTED(false, "loom: aten::", full, " (", operands,
                                ") has no Loom mapping and would run on PyTorch's CPU kernels "
                                "(LOOM_TORCH_FALLBACK=error)");
  }
  const std::uint64_t in = tensor_bytes(*stack, stack->size() - arguments);
  const auto t0 = std::chrono::steady_clock::now();
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
  const std::uint64_t out = tensor_bytes(*stack, 0);
  record_pytorch_fallback(
      full, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), in + out);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("resize_", resize);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("fill_.Scalar", fill_scalar);
  m.impl("zero_", zero);
  m.impl("arange.start_out", arange_out);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&pytorch_fallback>());
}

}  // namespace loom::torch_device
