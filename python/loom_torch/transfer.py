"""Runs a script written for CUDA on the loom device: `import loom_torch.transfer` at its top
(opt-in; as torch_npu's transfer_to_npu) rewrites

  - device arguments "cuda", "cuda:N" and torch.device("cuda", N) to "loom" / "loom:N" in
    Tensor.to, Tensor.cuda, Module.to, Module.cuda, torch.load(map_location=...) and the
    factory functions (torch.tensor, zeros, ones, empty, full, rand, randn, randint,
    arange, linspace, eye, the *_like functions, as_tensor, ...);
  - torch.cuda.is_available, device_count, current_device, set_device, synchronize,
    manual_seed, manual_seed_all, get_device_name, empty_cache to torch.loom's;
  - torch.autocast / torch.amp.autocast / torch.cuda.amp.autocast for "cuda" to float32
    (autocast off: Loom's kernels are float32 today; bf16 comes with Loom's bf16 kernels),
    and GradScaler for "cuda" to a disabled scaler (float32 needs no loss scaling: scale()
    returns the loss, step() steps, update() does nothing).

and says what it rewrote: rewrites() returns the counts, and at exit a summary goes to stderr
(LOOM_TORCH_TRANSFER_QUIET=1 silences it). torch.Generator("cuda") is left as it is (a type
annotations name: a wrapper would break them). Device objects a script builds itself with
torch.device("cuda") stay CUDA devices until passed to one of the calls above (torch.device
is PyTorch's own type); `x.is_cuda` is False on loom tensors.
"""
import atexit
import collections
import functools
import os
import sys

import torch

import loom_torch  # noqa: F401  (the device)

_counts = collections.Counter()


def rewrites():
    """What was rewritten so far: {"Tensor.to": 12, "torch.cuda.is_available": 1, ...}."""
    return dict(_counts)


def _loom_device(device, where):
    """device with "cuda" replaced by "loom" (strings, torch.device, indices stay)."""
    if isinstance(device, str) and (device == "cuda" or device.startswith("cuda:")):
        _counts[where] += 1
        return "loom" + device[4:]
    if isinstance(device, torch.device) and device.type == "cuda":
        _counts[where] += 1
        return torch.device("loom", device.index) if device.index is not None else torch.device("loom")
    return device


def _wrap_device_arguments(owner, name, where):
    """Wraps owner.name so that its `device` keyword has cuda rewritten to loom."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _loom_device(kwargs["device"], where)
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def _to_loom(original, where):
    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _loom_device(kwargs["device"], where)
        if args:
            args = (_loom_device(args[0], where),) + args[1:]
        return original(self, *args, **kwargs)
    return wrapper


def _cuda_method(target, where):
    """Tensor.cuda / Module.cuda(device=None): to loom:device."""
    def cuda(self, device=None, non_blocking=False, **kwargs):
        _counts[where] += 1
        index = device.index if isinstance(device, torch.device) else device
        name = "loom" if index is None else f"loom:{index}"
        return target(self, name, non_blocking=non_blocking) if target is torch.Tensor.to \
            else target(self, name)
    return cuda


def _load(original):
    @functools.wraps(original)
    def load(*args, **kwargs):
        if "map_location" in kwargs:
            kwargs["map_location"] = _loom_device(kwargs["map_location"], "torch.load")
        return original(*args, **kwargs)
    return load


def _counted(function, where):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        _counts[where] += 1
        return function(*args, **kwargs)
    return wrapper


def _autocast_for_loom(original):
    """autocast("cuda", ...) -> off: the script's math runs in float32 on loom (Loom's
    kernels are float32; bf16 autocast on the device waits for bf16 kernels)."""
    @functools.wraps(original)
    def autocast(device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type != "cuda":
            return original(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        _counts["autocast (to float32)"] += 1
        return original("cpu", enabled=False)
    return autocast


def _cuda_amp_autocast(enabled=True, dtype=None, cache_enabled=True):
    """torch.cuda.amp.autocast's own argument order."""
    return torch.autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


_GradScaler = torch.amp.GradScaler


def _grad_scaler(device="cuda", *args, **kwargs):
    """GradScaler("cuda"): a disabled scaler (loss scaling is for float16; float32 needs
    none): scale() returns the loss, step() steps, update() does nothing."""
    if device != "cuda":
        return _GradScaler(device, *args, **kwargs)
    _counts["GradScaler (disabled)"] += 1
    return _GradScaler("cpu", enabled=False)


_FACTORIES = ["tensor", "as_tensor", "zeros", "ones", "empty", "full", "rand", "randn",
              "randint", "randperm", "arange", "linspace", "logspace", "eye", "zeros_like",
              "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
              "randint_like", "empty_strided", "tril_indices", "triu_indices"]


def _install():
    for name in _FACTORIES:
        if hasattr(torch, name):
            _wrap_device_arguments(torch, name, f"torch.{name}")
    torch.Tensor.to = _to_loom(torch.Tensor.to, "Tensor.to")
    torch.nn.Module.to = _to_loom(torch.nn.Module.to, "Module.to")
    torch.Tensor.cuda = _cuda_method(torch.Tensor.to, "Tensor.cuda")
    torch.nn.Module.cuda = _cuda_method(torch.nn.Module.to, "Module.cuda")
    torch.load = _load(torch.load)
    loom = torch.loom
    for name, replacement in (("is_available", loom.is_available),
                              ("device_count", loom.device_count),
                              ("current_device", loom.current_device),
                              ("set_device", loom.set_device),
                              ("synchronize", loom.synchronize),
                              ("manual_seed", loom.manual_seed),
                              ("manual_seed_all", loom.manual_seed_all),
                              ("get_device_name", lambda device=None: "loom"),
                              ("empty_cache", lambda: None)):
        setattr(torch.cuda, name, _counted(replacement, f"torch.cuda.{name}"))
    torch.autocast = _autocast_for_loom(torch.autocast)
    torch.amp.autocast = torch.autocast
    torch.cuda.amp.autocast = _cuda_amp_autocast
    torch.amp.GradScaler = _grad_scaler
    torch.cuda.amp.GradScaler = lambda *args, **kwargs: _grad_scaler("cuda")


def _summary():
    if _counts and os.environ.get("LOOM_TORCH_TRANSFER_QUIET") != "1":
        listed = ", ".join(f"{name} x{count}" for name, count in sorted(_counts.items()))
        print(f"loom_torch.transfer: rewrote cuda to loom in {listed}", file=sys.stderr)


_install()
atexit.register(_summary)
