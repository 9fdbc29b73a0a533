"""Where a loaded model runs: ``--device auto|cpu|cuda[:N]`` resolved once, the dtype that device computes in.

Every loader that hands a model to generation (``toolgym eval`` / ``rollout``, ``toolgym serve model``, the demo)
goes through :func:`place`, so a machine with a GPU uses it without being told, and the line it prints
(``model on cuda:0, bfloat16``) says what ran. ``auto`` is the first CUDA device when torch sees one, else the CPU.
On a GPU whose compute capability has bfloat16 (Ampere and later) the weights are cast to bfloat16; elsewhere
they keep the dtype they were loaded in (float32 for the embedded model).
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEVICE_CHOICES_HELP", "DeviceError", "describe", "place", "placement_dtype", "resolve_device"]

DEVICE_CHOICES_HELP = ("where the model runs: auto (the first CUDA GPU when torch sees one, else the CPU), cpu, "
                       "cuda or cuda:N")


class DeviceError(ValueError):
    """A ``--device`` that is not ``auto``, ``cpu``, ``cuda`` or ``cuda:N``, or names a GPU torch cannot see."""


def resolve_device(spec: str | None = "auto") -> Any:
    """The ``torch.device`` for ``spec`` (``None`` = ``auto``); :class:`DeviceError` for anything else or for a CUDA
    device this machine does not have."""
    import torch

    text = (spec or "auto").strip().lower()
    if text == "auto":
        return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "cuda" or (text.startswith("cuda:") and text[5:].isdigit()):
        index = int(text[5:]) if ":" in text else 0
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if index >= count:
            raise DeviceError(f"--device {spec!r}: torch sees {count} CUDA device(s) on this machine "
                              "(use --device cpu, or auto to take a GPU only when one is present)")
        return torch.device(f"cuda:{index}")
    raise DeviceError(f"--device {spec!r}: expected auto, cpu, cuda or cuda:N")


def placement_dtype(device: Any, loaded: Any) -> Any:
    """The dtype a model loaded in ``loaded`` runs in on ``device``: bfloat16 on a CUDA device that supports it,
    else ``loaded`` unchanged."""
    import torch

    if getattr(device, "type", str(device)) == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return loaded


def describe(model: Any) -> str:
    """``"model on cuda:0, bfloat16"``: the device and dtype of ``model``'s first parameter."""
    param = next(model.parameters(), None)
    if param is None:
        return "model without parameters"
    return f"model on {param.device}, {str(param.dtype).removeprefix('torch.')}"


def place(model: Any, spec: str | None = "auto") -> tuple[Any, str]:
    """``(model, description)``: ``model`` moved to the device ``spec`` resolves to (:func:`resolve_device`) in the
    dtype :func:`placement_dtype` picks for it; the description is :func:`describe` of the result."""
    device = resolve_device(spec)
    param = next(model.parameters(), None)
    if param is not None:
        dtype = placement_dtype(device, param.dtype)
        if param.device != device or param.dtype != dtype:
            model = model.to(device=device, dtype=dtype)
    return model, describe(model)
