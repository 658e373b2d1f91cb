// torch/module.cpp — loom_torch._C: what Python needs beyond the registrations (which the
// library's static initialisers make when it is loaded).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mutex>

#include "torch/coverage.h"
#include "torch/runtime.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "Loom's devices as PyTorch's PrivateUse1 device 'loom' (docs/pytorch.md)";
  m.def(
      "devices", [] { return loom::torch_device::device_names(); },
      "Loom's backends behind loom:0, loom:1, ... (cpu, opencl, cuda, partial, as present)");
  m.def("device_count", [] { return static_cast<int>(loom::torch_device::device_count()); });
  m.def("current_device", [] { return static_cast<int>(loom::torch_device::current_device()); });
  m.def("set_device", [](int index) {
    loom::torch_device::set_current_device(static_cast<c10::DeviceIndex>(index));
  });
  m.def("manual_seed", [](int index, std::uint64_t seed) {
    at::Generator g =
        at::detail::getPrivateUse1Hooks().getDefaultGenerator(static_cast<c10::DeviceIndex>(index));
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_current_seed(seed);
  });
  m.def("synchronize", [](int index) {
    loom::torch_device::backend(static_cast<c10::DeviceIndex>(index))
        .default_stream()
        .synchronize();
  });
  m.def(
      "coverage",
      [] {
        py::list out;
        for (const auto& [name, c] : loom::torch_device::coverage()) {
          py::dict d;
          d["op"] = name;
          d["calls"] = c.calls;
          d["native"] = c.native;
          d["decomposed"] = c.decomposed;
          d["loom_fallback"] = c.loom_fallback;
          d["pytorch_fallback"] = c.pytorch_fallback;
          d["seconds"] = c.seconds;
          d["bytes_copied"] = c.bytes_copied;
          out.append(d);
        }
        return out;
      },
      "Every ATen op called on loom devices: calls, and how many ran natively, by "
      "decomposition, through Loom's CPU fallback or PyTorch's; seconds; bytes copied");
  m.def("reset_coverage", [] { loom::torch_device::reset_coverage(); });
}
