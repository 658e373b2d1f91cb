#include "torch/bridge.h"

#include <ATen/core/TensorBody.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include "dispatch/dispatch.h"
#include "torch/runtime.h"

namespace loom::torch_device {

DType loom_dtype(c10::ScalarType type, const char* op, const c10::Device& device) {
  switch (type) {
    case c10::ScalarType::Float:
      return DType::f32;
    case c10::ScalarType::BFloat16:
      return DType::bf16;
    case c10::ScalarType::Half:
      return DType::f16;
    case c10::ScalarType::Int:
      return DType::i32;
    case c10::ScalarType::Long:
      return DType::i64;
    case c10::ScalarType::Byte:
    case c10::ScalarType::Bool:  // one byte, 0 or 1
      return DType::u8;
    default:
      TORCH_CHECK_TYPE(false, "loom: ", op, " on ", device, ": dtype ", c10::toString(type),
                       " is not one Loom holds (float32, bfloat16, float16, int32, int64, "
                       "uint8, bool)");
  }
}

c10::ScalarType torch_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return c10::ScalarType::Float;
    case DType::bf16:
      return c10::ScalarType::BFloat16;
    case DType::f16:
      return c10::ScalarType::Half;
    case DType::i32:
      return c10::ScalarType::Int;
    case DType::i64:
      return c10::ScalarType::Long;
    case DType::u8:
      return c10::ScalarType::Byte;
  }
  return c10::ScalarType::Undefined;
}

Tensor as_loom(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.device().is_privateuseone(), "loom: ", op, ": a tensor on ", t.device(),
              " where a loom tensor was expected");
  const DType dtype = loom_dtype(t.scalar_type(), op, t.device());
  return Tensor::view_of(buffer_of(t.storage().data_ptr()), t.storage_offset(),
                         Shape(t.sizes().begin(), t.sizes().end()),
                         Strides(t.strides().begin(), t.strides().end()), dtype);
}

at::Tensor as_torch(const Tensor& t, const c10::Device& device) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), t.storage()->bytes(),
                       data_ptr_of(t.storage(), device), &allocator(), /*resizable=*/true);
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      caffe2::TypeMeta::fromScalarType(torch_dtype(t.dtype())));
  out.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(t.shape()),
                                                   c10::IntArrayRef(t.strides()), t.offset());
  return out;
}

void write_into(const at::Tensor& to, const Tensor& from, const char* op) {
  if (to.numel() == 0)
    return;
  const Tensor target = as_loom(to, op);
  if (target.is_contiguous()) {
    Tensor out = target;
    dispatch::call_into(OpId::copy, std::span<const Tensor>(&from, 1), std::span<Tensor>(&out, 1),
                        {});
    return;
  }
  if (target.backend().host_accessible()) {  // host memory: written in place
    const at::Tensor source =
        at::from_blob(from.device_address(), to.sizes(), to.options().device(at::kCPU));
    at::Tensor alias =
        at::from_blob(to.data_ptr(), to.sizes(), to.strides(), to.options().device(at::kCPU));
    alias.copy_(source);
    return;
  }
  // A strided view of a device's memory: the span of storage it covers is read to the host,
  // the values written into it there, and the span written back (the elements between the
  // view's, which belong to others, go back unchanged).
  std::int64_t last = 0;  // the view's last element, from its first
  for (std::int64_t d = 0; d < to.dim(); ++d)
    last += (to.size(d) - 1) * to.stride(d);
  const std::size_t span = static_cast<std::size_t>(last + 1) * to.element_size();
  const std::size_t first = static_cast<std::size_t>(to.storage_offset()) * to.element_size();
  at::Tensor bytes = at::empty({static_cast<int64_t>(span)}, at::TensorOptions().dtype(at::kByte));
  Backend& device = target.backend();
  Buffer& storage = *target.storage();
  device.download(storage, first, bytes.data_ptr(), span);
  std::vector<std::byte> values(from.nbytes());
  device.download(*from.storage(), static_cast<std::size_t>(from.offset()) * to.element_size(),
                  values.data(), values.size());
  at::from_blob(bytes.data_ptr(), to.sizes(), to.strides(), to.options().device(at::kCPU))
      .copy_(at::from_blob(values.data(), to.sizes(), to.options().device(at::kCPU)));
  device.upload(bytes.data_ptr(), storage, first, span);
}

at::Tensor& write_result(at::Tensor& out, const Tensor& result, const char* op) {
  const Shape& shape = result.shape();
  at::native::resize_output(out, c10::IntArrayRef(shape.data(), shape.size()));
  write_into(out, result, op);
  return out;
}

void check_one_device(const char* op, const at::Tensor& out,
                      std::initializer_list<const at::Tensor*> operands) {
  for (const at::Tensor* t : operands)
    TORCH_CHECK(!t->device().is_privateuseone() || t->device() == out.device(), "loom: aten::", op,
                ": expected every tensor on ", out.device(), ", got one on ", t->device(),
                " (dtype ", t->scalar_type(), ")");
}

bool takes_float(const at::Tensor& t, const at::Tensor& out) {
  return (t.device() == out.device() && t.scalar_type() == c10::ScalarType::Float) ||
         (t.is_cpu() && t.dim() == 0);
}

Tensor float_operand(const at::Tensor& t, const at::Tensor& out, const char* op) {
  if (t.device() == out.device())
    return as_loom(t, op);
  const float value = t.item<float>();
  return Tensor::from_floats({}, std::span<const float>(&value, 1), backend(out.device().index()));
}

bool is_float_on(const at::Tensor& t, const c10::Device& device) {
  return t.defined() && t.device() == device && t.scalar_type() == c10::ScalarType::Float;
}

}  // namespace loom::torch_device
