#include "torch/runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <mutex>

#include "dispatch/devices.h"

namespace loom::torch_device {

namespace {

thread_local c10::DeviceIndex current_index = 0;

// The order docs/pytorch.md documents: cpu first, the accelerators, the test device last.
std::vector<std::string> ordered_names() {
  std::vector<std::string> present = dispatch::device_names(), out;
  for (const char* name : {"cpu", "opencl", "cuda", "partial"})
    for (const std::string& p : present)
      if (p == name)
        out.push_back(p);
  return out;
}

// A Buffer kept alive by the storage that holds its bytes: the DataPtr's context.
struct BufferContext {
  std::shared_ptr<Buffer> buffer;
};

void delete_context(void* context) {
  std::unique_ptr<BufferContext> owned(static_cast<BufferContext*>(context));
}

// The device guard: which loom:N is current on this thread; one stream per device (Loom's
// default stream, which orders everything dispatch runs there).
struct LoomGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(c10::DeviceType::PrivateUse1, current_index);
  }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.is_privateuseone(), "loom: not a loom device: ", d);
    set_current_device(d.index() < 0 ? 0 : d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    current_index = d.index() < 0 ? 0 : d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return device_count();
    } catch (...) {
      return 0;
    }
  }
  void synchronizeDevice(c10::DeviceIndex index) const override {
    backend(index).default_stream().synchronize();
  }
  void synchronizeStream(const c10::Stream& s) const override {
    backend(s.device_index()).default_stream().synchronize();
  }
  bool queryStream(const c10::Stream& /*s*/) const override {
    return true;  // dispatch's calls return once their results are usable on the host side
  }
};

// A CPU generator (Philox/mt19937 state, seedable) that belongs to a loom device: random
// ops that fall back to PyTorch's CPU kernels draw from it.
struct LoomGenerator final : public at::CPUGeneratorImpl {
  explicit LoomGenerator(c10::DeviceIndex index) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

struct LoomHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex /*index*/) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  void setCurrentDevice(c10::DeviceIndex index) const override { set_current_device(index); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const c10::DeviceIndex old = current_device();
    set_current_device(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    static std::once_flag once;
    static std::vector<at::Generator> generators;
    std::call_once(once, [] {
      for (c10::DeviceIndex i = 0; i < device_count(); ++i)
        generators.push_back(at::make_generator<LoomGenerator>(i));
    });
    const c10::DeviceIndex i = index < 0 ? current_device() : index;
    TORCH_CHECK(i < static_cast<c10::DeviceIndex>(generators.size()), "loom: no device loom:", i);
    return generators[static_cast<std::size_t>(i)];
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<LoomGenerator>(index < 0 ? current_device() : index);
  }
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return c10::Device(c10::DeviceType::PrivateUse1, current_device());
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, std::size_t bytes) const override {
    resize_storage(storage, bytes);  // untyped_storage().resize_()
  }
};

struct Registration {
  Registration() {
    static LoomHooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
    c10::SetAllocator(c10::DeviceType::PrivateUse1, &allocator());
  }
};
const Registration registration;

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, LoomGuardImpl);

const std::vector<std::string>& device_names() {
  static const std::vector<std::string> names = ordered_names();
  return names;
}

c10::DeviceIndex device_count() {
  return static_cast<c10::DeviceIndex>(device_names().size());
}

Backend& backend(c10::DeviceIndex index) {
  const auto& names = device_names();
  if (index < 0 || static_cast<std::size_t>(index) >= names.size()) {
    std::string known;
    for (std::size_t i = 0; i < names.size(); ++i)
      known += (i ? ", " : "") + std::string("loom:") + std::to_string(i) + " (" + names[i] + ")";
    TORCH_CHECK(false, "loom: no device loom:", static_cast<int>(index), "; this build has ",
                known);
  }
  return dispatch::device(names[static_cast<std::size_t>(index)]);
}

c10::DeviceIndex current_device() {
  return current_index;
}

void set_current_device(c10::DeviceIndex index) {
  (void)backend(index);  // a named error for an index there is not
  current_index = index;
}

std::shared_ptr<Buffer> buffer_of(const c10::DataPtr& data) {
  TORCH_CHECK(data.get_deleter() == &delete_context, "loom: a storage on ", data.device(),
              " that Loom's allocator did not make");
  return static_cast<BufferContext*>(data.get_context())->buffer;
}

c10::DataPtr data_ptr_of(std::shared_ptr<Buffer> buffer, const c10::Device& device) {
  auto context = std::make_unique<BufferContext>();
  context->buffer = std::move(buffer);
  void* data = context->buffer->data();
  return c10::DataPtr(data, context.release(), &delete_context, device);
}

c10::DataPtr LoomAllocator::allocate(std::size_t bytes) {
  const c10::DeviceIndex index = current_device();
  auto context = std::make_unique<BufferContext>();
  // At least one byte: a storage of no elements still names its device's memory.
  context->buffer =
      std::make_shared<Buffer>(backend(index).allocate(std::max<std::size_t>(bytes, 1)));
  void* data = context->buffer->data();
  return c10::DataPtr(data, context.release(), &delete_context,
                      c10::Device(c10::DeviceType::PrivateUse1, index));
}

void LoomAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  TORCH_CHECK(backend(current_device()).host_accessible(),
              "loom: copying raw device memory on loom:", static_cast<int>(current_device()), " (",
              device_names()[static_cast<std::size_t>(current_device())],
              ") is not supported; copy tensors instead");
  std::memcpy(dest, src, count);
}

LoomAllocator& allocator() {
  static LoomAllocator instance;
  return instance;
}

void resize_storage(const c10::Storage& storage, std::size_t bytes) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  const c10::DeviceIndex index = impl->device().index();
  const c10::DeviceIndex saved = current_device();
  set_current_device(index);
  c10::DataPtr fresh = allocator().allocate(bytes);
  set_current_device(saved);
  const std::size_t kept = std::min(bytes, impl->nbytes());
  if (kept > 0) {
    const std::shared_ptr<Buffer> from = buffer_of(impl->data_ptr()), to = buffer_of(fresh);
    backend(index).default_stream().copy(*from, 0, *to, 0, kept);
    backend(index).default_stream().synchronize();
  }
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(bytes);
}

}  // namespace loom::torch_device
