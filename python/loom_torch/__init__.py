"""Loom's devices as a PyTorch device named "loom" (docs/pytorch.md).

    import torch                          # loads this package (the "torch.backends" entry point)
    x = torch.randn(4, 4).to("loom")      # loom:0, Loom's first backend (see devices())
    torch.loom.coverage()                 # which ATen ops ran, and how

loom:N is the N-th of Loom's backends in this build, in the order cpu, opencl, cuda, partial
(as present): `torch.loom.devices()` lists them.
"""


def _autoload():
    """The "torch.backends" entry point: `import torch` imports this package and calls this.
    Importing does the work; TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns it off. Defined before
    `import torch` below: a script that imports this package first has torch's autoload find
    it half-imported, and calling this then is right (the import goes on after torch's)."""


import torch  # noqa: E402

torch.utils.rename_privateuse1_backend("loom")


def _load_extension():
    """Imports _C after loading the oneDNN library of Loom's CPU backend with its own symbols
    first (RTLD_DEEPBIND): torch's statically linked oneDNN exports some of its internals
    (call_once thunks of its GEMM's JIT set-up), which would otherwise take the place of the
    library's own and leave its GEMM unimplemented."""
    import ctypes
    import os

    from ._libraries import deepbind
    for path in deepbind:
        ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_DEEPBIND)
    from . import _C
    return _C


_C = _load_extension()  # the registrations: allocator, guard, hooks, kernels
from . import device as _device  # noqa: E402

torch._register_device_module("loom", _device)
torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
# Module.to("loom") keeps shared parameters shared (a tied embedding and LM head) only when
# parameters are swapped rather than re-created: PyTorch re-creates them for a device it
# does not count as "dense" (CPU, CUDA and a few others).
torch.__future__.set_swap_module_params_on_conversion(True)

devices = _device.devices
coverage = _device.coverage
write_report = _device.write_report
mapped_ops = _device.mapped_ops


def _report_at_exit():
    """LOOM_TORCH_REPORT=path: the coverage report written there when the script ends."""
    import atexit
    import os
    path = os.environ.get("LOOM_TORCH_REPORT")
    if path:
        atexit.register(write_report, path)


_report_at_exit()

