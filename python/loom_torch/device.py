"""torch.loom: the functions PyTorch expects of a device module, and Loom's own."""
import torch

from . import _C


def devices():
    """Loom's backends behind loom:0, loom:1, ...: cpu, opencl, cuda, partial, as present."""
    return list(_C.devices())


def device_count():
    return _C.device_count()


def is_available():
    return _C.device_count() > 0


def is_initialized():
    return True


def _is_in_bad_fork():
    return False


def current_device():
    return _C.current_device()


def set_device(device):
    _C.set_device(torch.device(device).index if not isinstance(device, int) else device)


def synchronize(device=None):
    if device is None:
        index = current_device()
    elif isinstance(device, int):
        index = device
    else:
        index = torch.device(device).index or 0
    _C.synchronize(index)


def manual_seed(seed):
    """Seeds the current loom device's default generator (random ops on loom tensors)."""
    _C.manual_seed(current_device(), int(seed))


def manual_seed_all(seed):
    """Seeds every loom device's default generator (torch.manual_seed calls this)."""
    for i in range(device_count()):
        _C.manual_seed(i, int(seed))


class device:
    """Context manager making a loom device current (torch.load restores loom tensors in one)."""

    def __init__(self, device):
        self.index = device if isinstance(device, int) else (torch.device(device).index or 0)
        self.previous = None

    def __enter__(self):
        self.previous = current_device()
        _C.set_device(self.index)

    def __exit__(self, *exc):
        _C.set_device(self.previous)
        return False


def coverage():
    """Every ATen op called on loom devices since the start (or reset_coverage()): a list of
    dicts with op, calls, native, decomposed, loom_fallback, pytorch_fallback, seconds and
    bytes_copied."""
    return list(_C.coverage())


def reset_coverage():
    _C.reset_coverage()


def write_report(path):
    """Writes the coverage report `loom ops --torch_report PATH` shows: {"schema_version": 1,
    "torch", "devices", "ops": coverage()}, atomically (a temporary file renamed into place)."""
    import json
    import os
    report = {"schema_version": 1, "torch": torch.__version__.split("+")[0],
              "devices": devices(), "ops": coverage()}
    temporary = f"{path}.tmp.{os.getpid()}"
    with open(temporary, "w") as f:
        json.dump(report, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def mapped_ops():
    """The ATen operators registered for the loom device, sorted ("add.out", ...): the list in
    docs/pytorch.md, which tests/torch/test_device.py keeps equal to this."""
    key = "PrivateUse1"
    return sorted(name[len("aten::"):] for name in
                  torch._C._dispatch_get_registrations_for_dispatch_key(key)
                  if name.startswith("aten::"))
