"""A test double for device placement on a CPU-only machine: which tensors code creates without naming a device.

CUDA cannot run here, yet the bug class "a tensor made on the default device meets one on the GPU" can be caught
on the CPU: inside :class:`UnplacedFactories`, every call of a tensor factory (``torch.arange``, ``torch.zeros``,
``torch.tensor`` ...) that gives no ``device=`` is recorded with its name. Code that must run unchanged on any device
makes its tensors on the device of the tensors they meet (``device=x.device``, ``torch.zeros_like``), so the
record stays empty; a factory left on the default device shows up here as it would crash on a GPU.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

#: factories whose result lands on the default device unless ``device=`` is given
FACTORIES = frozenset({
    torch.arange, torch.zeros, torch.ones, torch.full, torch.empty, torch.tensor, torch.as_tensor, torch.rand,
    torch.randn, torch.randint, torch.randperm, torch.linspace, torch.eye,
})


class UnplacedFactories(TorchFunctionMode):
    """Records (in :attr:`calls`) the name of every tensor factory called without ``device=`` while active."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            self.calls.append(getattr(func, "__name__", repr(func)))
        return func(*args, **kwargs)
