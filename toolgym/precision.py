"""Mixed precision for generation and training: which ``torch.autocast`` dtypes toolgym accepts
(:data:`AUTOCAST_DTYPES`, :func:`check_autocast`) and the context that runs a model under one
(:func:`autocast_context`). torch is imported only when a context is entered with a dtype.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["AUTOCAST_DTYPES", "autocast_context", "check_autocast", "cpu_bf16_units", "describe_precision"]

#: the ``torch.autocast`` dtypes a policy may generate in (``TransformersPolicy(autocast=...)``) and a checkpoint
#: may record (``None``: the model's own dtype, no autocast)
AUTOCAST_DTYPES: tuple[str, ...] = ("bfloat16", "float16")


def check_autocast(dtype: str | None) -> str | None:
    """``dtype`` if it is ``None`` or one of :data:`AUTOCAST_DTYPES`, else a ``ValueError`` naming the choices."""
    if dtype is not None and dtype not in AUTOCAST_DTYPES:
        raise ValueError(f"autocast must be one of {', '.join(AUTOCAST_DTYPES)} or None; got {dtype!r}")
    return dtype


def autocast_context(device_type: str, dtype: str | None, model: Any = None) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast(device_type, dtype)`` for a dtype name of :data:`AUTOCAST_DTYPES`, or a no-op context for
    ``None``. Autocast is per thread: enter it in the thread that runs the model.

    ``model`` (for generation, entered under ``torch.no_grad()``): its *frozen* float32 weights are cast once per
    context too. Autocast caches the low-precision copy of a weight only when the weight requires grad, so a frozen
    one (e.g. a tied embedding / LM head left out of training) would be cast again at every decoding step
    (``docs/training.md`` measures it). For the duration they are marked as
    requiring grad (no graph is built under ``no_grad``); the cast values, and so the tokens, are the same. With
    grad enabled, ``model`` is ignored."""
    if check_autocast(dtype) is None:
        return contextlib.nullcontext()
    import torch

    ctx = torch.autocast(device_type, dtype=getattr(torch, dtype))
    if model is None or torch.is_grad_enabled():
        return ctx
    stack = contextlib.ExitStack()
    stack.enter_context(_frozen_weights_cacheable(model))
    stack.enter_context(ctx)
    return stack


@contextlib.contextmanager
def _frozen_weights_cacheable(model: Any) -> Any:
    import torch

    frozen = [p for p in model.parameters() if not p.requires_grad and p.dtype == torch.float32]
    for p in frozen:
        p.requires_grad_(True)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(False)


def cpu_bf16_units(cpuinfo: str | None = None) -> list[str]:
    """The bfloat16 matrix units this CPU advertises: ``"AMX"`` (Intel's tile units, flag ``amx_bf16``) and
    ``"AVX512-BF16"`` (flag ``avx512_bf16``, Intel and AMD Zen 4 alike); empty where it has neither (bfloat16
    autocast then runs on emulated kernels). ``cpuinfo``: the text of ``/proc/cpuinfo`` (read when ``None``; empty
    where it cannot be read)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[-1].split())
            break
    return [name for flag, name in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16")) if flag in flags]


def describe_precision(device_type: str, weights: str, autocast: str | None, units: list[str] | None = None) -> str:
    """One line saying what a run computes in and why, e.g. ``"float32 weights, bfloat16 autocast for generation and
    training (this CPU's AVX512-BF16 units)"``. ``device_type``: ``cpu`` or ``cuda``; ``weights``: the parameters'
    dtype name; ``autocast``: the autocast dtype name or ``None``; ``units``: :func:`cpu_bf16_units` (read when
    ``None`` on a CPU)."""
    check_autocast(autocast)
    if autocast is None:
        return f"{weights} weights, no autocast (every product in {weights})"
    head = f"{weights} weights, {autocast} autocast for generation and training"
    if device_type != "cpu":
        return f"{head} ({device_type})"
    units = cpu_bf16_units() if units is None else units
    if autocast == "bfloat16" and units:
        return f"{head} (this CPU's {' and '.join(units)} units compute bfloat16 products)"
    return (f"{head}; this CPU has no {autocast} matrix units, so its products run on emulated kernels, "
            "usually slower than float32 (set bf16: false)")

