// core/tensor.h — Tensor: a value type over shared device storage.
//
// A tensor is (buffer, element offset, shape, strides, dtype). Copying a Tensor
// copies the handle, not the data. View operations (reshape of a contiguous tensor,
// permute, transpose, slice) share storage; to() copies to another device. No tensor
// hides a host copy: data<T>() works only where the device memory is host-accessible.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/dtype.h"

namespace loom {

using Shape = std::vector<std::int64_t>;
using Strides = std::vector<std::int64_t>;  // in elements

std::int64_t shape_numel(const Shape& shape);
Strides contiguous_strides(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2,3,4]"

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor (defined() == false)

  // New, uninitialised storage on `backend`.
  static Tensor empty(const Shape& shape, DType dtype, Backend& backend);
  // New storage filled from host memory holding numel * dtype_size bytes.
  static Tensor from_host(const Shape& shape, DType dtype, const void* host, Backend& backend);
  static Tensor from_floats(const Shape& shape, std::span<const float> values, Backend& backend);
  static Tensor from_ints(const Shape& shape, std::span<const std::int32_t> values,
                          Backend& backend);
  // A view of existing storage (offset and strides in elements), e.g. a region of a
  // graph's memory arena. Throws when the view reaches outside the storage.
  static Tensor view_of(std::shared_ptr<Buffer> storage, std::int64_t offset, const Shape& shape,
                        const Strides& strides, DType dtype);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Strides& strides() const { return strides_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  std::int64_t dim(int axis) const;  // negative axes count from the end
  std::int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  std::int64_t offset() const { return offset_; }  // in elements
  Backend& backend() const { return storage_->owner(); }
  const std::shared_ptr<Buffer>& storage() const { return storage_; }
  bool is_contiguous() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }

  // Host pointer to the first element; throws unless the backend is host-accessible.
  template <class T>
  T* data() const {
    return static_cast<T*>(host_address());
  }
  // Device address of the first element (meaningful to the owning backend only).
  void* device_address() const;

  // ---- views: share storage -------------------------------------------------
  Tensor reshape(const Shape& shape) const;  // contiguous tensors only; one -1 allowed
  Tensor permute(const std::vector<int>& order) const;
  Tensor transpose(int axis_a, int axis_b) const;
  Tensor slice(int axis, std::int64_t start, std::int64_t end) const;
  Tensor select(int axis, std::int64_t index) const;  // drops `axis`, keeping one index

  // ---- copies ---------------------------------------------------------------
  Tensor to(Backend& backend) const;          // contiguous copy on `backend`
  std::vector<float> to_floats() const;       // f32 tensor, any device, any layout
  std::vector<std::int32_t> to_ints() const;  // i32 tensor, any device, any layout
  float item() const;                         // value of a one-element f32 tensor

  std::string describe() const;  // "f32[2,3] on cpu"

 private:
  void* host_address() const;
  std::vector<std::byte> gather_host_bytes() const;  // contiguous host copy of the elements

  std::shared_ptr<Buffer> storage_;
  std::int64_t offset_ = 0;
  Shape shape_;
  Strides strides_;
  DType dtype_ = DType::f32;
};

}  // namespace loom
