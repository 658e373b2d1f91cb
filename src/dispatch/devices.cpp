#include "dispatch/devices.h"

#include "backends/cpu/cpu_backend.h"
#include "backends/partial/partial_backend.h"
#include "core/error.h"
#ifdef LOOM_HAVE_OPENCL
#include "backends/opencl/opencl_backend.h"
#endif
#ifdef LOOM_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace loom::dispatch {

// Optional backends are compiled in when their SDKs are found at build time, and listed
// only when a device is present at run time.
std::vector<std::string> device_names() {
  std::vector<std::string> names{"cpu", "partial"};
#ifdef LOOM_HAVE_OPENCL
  if (opencl::backend() != nullptr)
    names.push_back("opencl");
#endif
#ifdef LOOM_HAVE_CUDA
  if (cuda::backend() != nullptr)
    names.push_back("cuda");
#endif
  return names;
}

Backend& host() {
  return cpu::backend();
}

Backend& device(const std::string& name) {
  if (name == "cpu")
    return cpu::backend();
  if (name == "partial")
    return partial::backend();
#ifdef LOOM_HAVE_OPENCL
  if (name == "opencl" && opencl::backend() != nullptr)
    return *opencl::backend();
#endif
#ifdef LOOM_HAVE_CUDA
  if (name == "cuda" && cuda::backend() != nullptr)
    return *cuda::backend();
#endif
  std::string known;
  for (const auto& n : device_names())
    known += (known.empty() ? "" : ", ") + n;
  std::string why = "is not available in this build";
#ifdef LOOM_HAVE_CUDA
  if (name == "cuda")
    why = "is not available here: " + cuda::unavailable_reason();
#endif
  throw DeviceUnavailable("device '" + name + "' " + why + "; available: " + known);
}

}  // namespace loom::dispatch
