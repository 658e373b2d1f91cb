#include "dispatch/devices.h"

#include "backends/cpu/cpu_backend.h"
#include "backends/partial/partial_backend.h"
#include "core/error.h"
#ifdef LOOM_HAVE_OPENCL
#include "backends/opencl/opencl_backend.h"
#endif

namespace loom::dispatch {

// Optional backends are compiled in when their SDKs are found at build time, and listed
// only when a device is present at run time.
std::vector<std::string> device_names() {
  std::vector<std::string> names{"cpu", "partial"};
#ifdef LOOM_HAVE_OPENCL
  if (opencl::backend() != nullptr) names.push_back("opencl");
#endif
  return names;
}

Backend& device(const std::string& name) {
  if (name == "cpu") return cpu::backend();
  if (name == "partial") return partial::backend();
#ifdef LOOM_HAVE_OPENCL
  if (name == "opencl" && opencl::backend() != nullptr) return *opencl::backend();
#endif
  std::string known;
  for (const auto& n : device_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("device '" + name + "' is not available in this build; available: " + known);
}

}  // namespace loom::dispatch
