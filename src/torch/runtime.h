// torch/runtime.h — Loom's devices as PyTorch's PrivateUse1 device "loom" (docs/pytorch.md).
//
// loom:N is the N-th Loom backend of this build in a fixed order: cpu, opencl, cuda,
// partial, as present. A PyTorch tensor on loom:N keeps its bytes in a Loom Buffer of that
// backend (the allocator below), so Loom kernels run on it without a copy: the storage's
// context holds the Buffer, and bridge.h views it as a loom::Tensor.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"

namespace loom::torch_device {

// The Loom backends behind loom:0, loom:1, ... and their names ("cpu", "opencl", ...).
const std::vector<std::string>& device_names();
Backend& backend(c10::DeviceIndex index);  // throws naming the index and the devices there are
c10::DeviceIndex device_count();
c10::DeviceIndex current_device();  // this thread's (the device guard's)
void set_current_device(c10::DeviceIndex index);

// The Loom Buffer behind a loom storage's data pointer (its context).
std::shared_ptr<Buffer> buffer_of(const c10::DataPtr& data);
// A data pointer for storage on `device` that shares `buffer` (a Loom kernel's result handed
// to PyTorch without a copy).
c10::DataPtr data_ptr_of(std::shared_ptr<Buffer> buffer, const c10::Device& device);

// Grows or shrinks `storage` (on a loom device) to `bytes`: new memory on its device, the old
// bytes copied there as far as both reach.
void resize_storage(const c10::Storage& storage, std::size_t bytes);

// Allocates on the current device (c10::GetAllocator(PrivateUse1) is this).
class LoomAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t bytes) override;
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  // Copies between two allocations of this allocator (storage resizes): on the device of
  // the destination, through Loom's copy.
  void copy_data(void* dest, const void* src, std::size_t count) const override;
};
LoomAllocator& allocator();

}  // namespace loom::torch_device
