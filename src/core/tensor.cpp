#include "core/tensor.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "core/error.h"

namespace loom {

// The product of the non-zero dimensions is checked, not only the count: it bounds the
// strides too, and a zero dimension must not hide an overflow elsewhere in the shape.
// A few dims per call, so cheap enough for the hot path.
std::int64_t shape_numel(const Shape& shape) {
  std::int64_t product = 1;
  bool empty = false;
  for (std::int64_t d : shape) {
    if (d == 0) {
      empty = true;
      continue;
    }
    if (__builtin_mul_overflow(product, d, &product))
      throw Error("shape " + shape_str(shape) + ": the element count overflows int64");
  }
  return empty ? 0 : product;
}

Strides contiguous_strides(const Shape& shape) {
  shape_numel(shape);  // throws when the strides below would overflow
  Strides strides(shape.size());
  std::int64_t stride = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i)
      s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Backend& backend) {
  for (std::int64_t d : shape)
    check(d >= 0, [&] { return "Tensor::empty: negative dimension in shape " + shape_str(shape); });
  const auto numel = static_cast<std::size_t>(shape_numel(shape));
  check(numel <= SIZE_MAX / dtype_size(dtype), [&] {
    return "Tensor::empty: shape " + shape_str(shape) + " of " + std::string(dtype_name(dtype)) +
           " needs more bytes than size_t holds";
  });
  Tensor t;
  std::size_t bytes = numel * dtype_size(dtype);
  t.storage_ = std::make_shared<Buffer>(backend.allocate(bytes));
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::from_host(const Shape& shape, DType dtype, const void* host, Backend& backend) {
  Tensor t = empty(shape, dtype, backend);
  if (t.nbytes() > 0)
    backend.upload(host, *t.storage_, 0, t.nbytes());
  return t;
}

Tensor Tensor::from_floats(const Shape& shape, std::span<const float> values, Backend& backend) {
  check(static_cast<std::int64_t>(values.size()) == shape_numel(shape), [&] {
    return "Tensor::from_floats: " + std::to_string(values.size()) + " values for shape " +
           shape_str(shape);
  });
  return from_host(shape, DType::f32, values.data(), backend);
}

Tensor Tensor::from_ints(const Shape& shape, std::span<const std::int32_t> values,
                         Backend& backend) {
  check(static_cast<std::int64_t>(values.size()) == shape_numel(shape), [&] {
    return "Tensor::from_ints: " + std::to_string(values.size()) + " values for shape " +
           shape_str(shape);
  });
  return from_host(shape, DType::i32, values.data(), backend);
}

Tensor Tensor::view_of(std::shared_ptr<Buffer> storage, std::int64_t offset, const Shape& shape,
                       const Strides& strides, DType dtype) {
  check(storage != nullptr && shape.size() == strides.size() && offset >= 0, [&] {
    return "Tensor::view_of: needs storage and one stride per dimension of " + shape_str(shape);
  });
  const bool empty = shape_numel(shape) == 0;
  std::int64_t end = offset;  // one past the highest element index the view reaches
  for (std::size_t i = 0; i < shape.size(); ++i) {
    check(shape[i] >= 0 && strides[i] >= 0,
          [&] { return "Tensor::view_of: negative size or stride in " + shape_str(shape); });
    if (!empty)
      end += (shape[i] - 1) * strides[i];
  }
  if (!empty)
    ++end;
  check(static_cast<std::size_t>(end) * dtype_size(dtype) <= storage->bytes(), [&] {
    return "Tensor::view_of: " + shape_str(shape) + " at element " + std::to_string(offset) +
           " reaches past the " + std::to_string(storage->bytes()) + "-byte storage";
  });
  Tensor t;
  t.storage_ = std::move(storage);
  t.offset_ = offset;
  t.shape_ = shape;
  t.strides_ = strides;
  t.dtype_ = dtype;
  return t;
}

std::int64_t Tensor::dim(int axis) const {
  int r = rank();
  int a = axis < 0 ? axis + r : axis;
  check(a >= 0 && a < r, [&] {
    return "Tensor::dim: axis " + std::to_string(axis) + " out of range for " + describe();
  });
  return shape_[a];
}

bool Tensor::is_contiguous() const {
  std::int64_t expected = 1;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != expected)
      return false;
    expected *= shape_[i];
  }
  return true;
}

void* Tensor::host_address() const {
  check(defined(), "Tensor::data: undefined tensor");
  check(backend().host_accessible(), [&] {
    return "Tensor::data: " + describe() + " is not host-accessible; copy it with to(cpu) first";
  });
  return static_cast<std::byte*>(storage_->data()) +
         offset_ * static_cast<std::int64_t>(dtype_size(dtype_));
}

void* Tensor::device_address() const {
  return static_cast<std::byte*>(storage_->data()) +
         offset_ * static_cast<std::int64_t>(dtype_size(dtype_));
}

Tensor Tensor::reshape(const Shape& shape) const {
  check(is_contiguous(),
        [&] { return "Tensor::reshape: " + describe() + " is not contiguous; copy it first"; });
  Shape resolved = shape;
  int inferred = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i] == -1) {
      check(inferred < 0,
            [&] { return "Tensor::reshape: more than one -1 in " + shape_str(shape); });
      inferred = static_cast<int>(i);
    } else {
      known *= resolved[i];
    }
  }
  if (inferred >= 0) {
    check(known > 0 && numel() % known == 0, [&] {
      return "Tensor::reshape: cannot infer -1 in " + shape_str(shape) + " for " + describe();
    });
    resolved[inferred] = numel() / known;
  }
  check(shape_numel(resolved) == numel(), [&] {
    return "Tensor::reshape: " + describe() + " has " + std::to_string(numel()) +
           " elements, shape " + shape_str(shape) + " needs " +
           std::to_string(shape_numel(resolved));
  });
  Tensor t = *this;
  t.shape_ = resolved;
  t.strides_ = contiguous_strides(resolved);
  return t;
}

Tensor Tensor::permute(const std::vector<int>& order) const {
  check(static_cast<int>(order.size()) == rank(),
        [&] { return "Tensor::permute: order has wrong length for " + describe(); });
  std::vector<bool> seen(order.size(), false);
  Tensor t = *this;
  for (std::size_t i = 0; i < order.size(); ++i) {
    int a = order[i];
    check(a >= 0 && a < rank() && !seen[a],
          [&] { return "Tensor::permute: invalid axis order for " + describe(); });
    seen[a] = true;
    t.shape_[i] = shape_[a];
    t.strides_[i] = strides_[a];
  }
  return t;
}

Tensor Tensor::transpose(int axis_a, int axis_b) const {
  int r = rank();
  int a = axis_a < 0 ? axis_a + r : axis_a;
  int b = axis_b < 0 ? axis_b + r : axis_b;
  std::vector<int> order(r);
  std::iota(order.begin(), order.end(), 0);
  check(a >= 0 && a < r && b >= 0 && b < r,
        [&] { return "Tensor::transpose: axis out of range for " + describe(); });
  std::swap(order[a], order[b]);
  return permute(order);
}

Tensor Tensor::slice(int axis, std::int64_t start, std::int64_t end) const {
  int r = rank();
  int a = axis < 0 ? axis + r : axis;
  check(a >= 0 && a < r, [&] { return "Tensor::slice: axis out of range for " + describe(); });
  check(0 <= start && start <= end && end <= shape_[a], [&] {
    return "Tensor::slice: range [" + std::to_string(start) + "," + std::to_string(end) +
           ") outside " + describe();
  });
  Tensor t = *this;
  t.offset_ += start * strides_[a];
  t.shape_[a] = end - start;
  return t;
}

Tensor Tensor::select(int axis, std::int64_t index) const {
  int a = axis < 0 ? axis + rank() : axis;
  Tensor t = slice(a, index, index + 1);
  t.shape_.erase(t.shape_.begin() + a);
  t.strides_.erase(t.strides_.begin() + a);
  return t;
}

std::vector<std::byte> Tensor::gather_host_bytes() const {
  std::size_t esize = dtype_size(dtype_);
  std::vector<std::byte> out(nbytes());
  if (numel() == 0)
    return out;
  // Bring the whole referenced span of storage to the host, then gather by strides.
  std::int64_t max_offset = 0;
  for (int i = 0; i < rank(); ++i)
    max_offset += (shape_[i] - 1) * strides_[i];
  std::size_t span_bytes = static_cast<std::size_t>(max_offset + 1) * esize;
  std::vector<std::byte> span(span_bytes);
  backend().download(*storage_, static_cast<std::size_t>(offset_) * esize, span.data(), span_bytes);
  if (is_contiguous())
    return span;
  std::vector<std::int64_t> index(shape_.size(), 0);
  for (std::int64_t n = 0; n < numel(); ++n) {
    std::int64_t src = 0;
    for (int i = 0; i < rank(); ++i)
      src += index[i] * strides_[i];
    std::memcpy(out.data() + n * esize, span.data() + src * esize, esize);
    for (int i = rank() - 1; i >= 0; --i) {
      if (++index[i] < shape_[i])
        break;
      index[i] = 0;
    }
  }
  return out;
}

Tensor Tensor::to(Backend& target) const {
  std::vector<std::byte> bytes = gather_host_bytes();
  return from_host(shape_, dtype_, bytes.data(), target);
}

std::vector<float> Tensor::to_floats() const {
  check(dtype_ == DType::f32, [&] { return "Tensor::to_floats: " + describe() + " is not f32"; });
  std::vector<std::byte> bytes = gather_host_bytes();
  std::vector<float> out(numel());
  if (!out.empty())
    std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::vector<std::int32_t> Tensor::to_ints() const {
  check(dtype_ == DType::i32, [&] { return "Tensor::to_ints: " + describe() + " is not i32"; });
  std::vector<std::byte> bytes = gather_host_bytes();
  std::vector<std::int32_t> out(numel());
  if (!out.empty())
    std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

float Tensor::item() const {
  check(numel() == 1,
        [&] { return "Tensor::item: " + describe() + " does not hold exactly one element"; });
  return to_floats()[0];
}

std::string Tensor::describe() const {
  if (!defined())
    return "undefined tensor";
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " on " +
         std::string(backend().name());
}

}  // namespace loom
