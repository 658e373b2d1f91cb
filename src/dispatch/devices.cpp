#include "dispatch/devices.h"

#include "backends/cpu/cpu_backend.h"
#include "backends/partial/partial_backend.h"
#include "core/error.h"

namespace loom::dispatch {

std::vector<std::string> device_names() { return {"cpu", "partial"}; }

Backend& device(const std::string& name) {
  if (name == "cpu") return cpu::backend();
  if (name == "partial") return partial::backend();
  std::string known;
  for (const auto& n : device_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("device '" + name + "' is not available in this build; available: " + known);
}

}  // namespace loom::dispatch
