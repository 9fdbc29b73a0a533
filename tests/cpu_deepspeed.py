"""Launch shim: DeepSpeed ZeRO-2/3 on CPU processes (gloo), for emulating the GPU path in CI.

``accelerate launch`` with a DeepSpeed config starts one process per rank and sets ``ACCELERATE_USE_DEEPSPEED``;
without CUDA, accelerate 1.15 finds no distributed backend for a non-``cpu`` run and falls back to a
single-process state (``num_processes == 1`` on every rank, ``accelerate/state.py`` ``_prepare_backend``), and
with ``use_cpu`` it skips DeepSpeed altogether. This shim makes that one decision: a DeepSpeed rank without CUDA
uses ``gloo`` (DeepSpeed's CPU accelerator), then runs the script. GPUs never need it (it does nothing when CUDA
is available)::

    accelerate launch --config_file trainers/configs/accelerate_zero3.yaml --num_processes 2 \\
        --mixed_precision no -m tests.cpu_deepspeed SCRIPT.py [script args]

DeepSpeed itself installs without CUDA from its sdist: ``DS_BUILD_OPS=0 pip install --no-build-isolation
deepspeed`` (the Makefile does).
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence

__all__ = ["main", "patch_accelerate"]


def patch_accelerate() -> bool:
    """Make accelerate pick ``gloo`` for a DeepSpeed rank on a machine without CUDA; ``True`` if patched."""
    import torch
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    if torch.cuda.is_available() or getattr(PartialState._prepare_backend, "_toolgym_cpu_deepspeed", False):
        return False
    original = PartialState._prepare_backend

    def _prepare_backend(self, cpu: bool = False, sagemaker_dp: bool = False, backend: str | None = None):
        deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
        if deepspeed and not cpu and int(os.environ.get("LOCAL_RANK", -1)) != -1:
            return "gloo", DistributedType.MULTI_CPU
        return original(self, cpu, sagemaker_dp, backend)

    _prepare_backend._toolgym_cpu_deepspeed = True  # type: ignore[attr-defined]
    PartialState._prepare_backend = _prepare_backend
    return True


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m tests.cpu_deepspeed SCRIPT.py [args]``: patch, then run ``SCRIPT.py`` as ``__main__``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        raise SystemExit("usage: python -m tests.cpu_deepspeed SCRIPT.py [args ...]")
    patch_accelerate()
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
