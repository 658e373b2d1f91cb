// dispatch/devices.h — the backends this build has, by name ("cpu", "partial").
#pragma once

#include <string>
#include <vector>

#include "core/backend.h"

namespace loom::dispatch {

// The backend called `name`; throws listing the available ones.
Backend& device(const std::string& name);
// The device host tensors live on and fallbacks run on (the CPU): shape arithmetic,
// integer inputs, checkpoint loading for text generation.
Backend& host();
std::vector<std::string> device_names();

}  // namespace loom::dispatch
