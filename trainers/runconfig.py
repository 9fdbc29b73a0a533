"""Run configs of the module trainers (``python -m trainers.dpo``, ``trainers.reward_model``, ``trainers.rft``).

A run config is a dataclass whose fields are declared with :func:`opt` (a default and a ``--help`` text); the DPO
and reward-model entry points read it with :func:`config_from_argv` (``--config FILE.yaml`` plus
``--field value`` flags). ``toolgym train`` reads the same dataclasses through :mod:`trainers.cli`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import MISSING, field, fields
from typing import Any

__all__ = ["config_from_argv", "opt"]


def opt(default: Any, help: str) -> Any:  # noqa: A002 - the argparse word
    """A dataclass field with a fixed (immutable) default and its ``--help`` text."""
    return field(default=default, metadata={"help": help})


def _parse_value(kind: Any, text: str) -> Any:
    if text.lower() in ("null", "none"):
        return None
    s = str(kind)
    if "dict" in s or "list" in s:
        return json.loads(text)
    if "bool" in s:
        if text.lower() in ("1", "true", "yes"):
            return True
        if text.lower() in ("0", "false", "no"):
            return False
        raise ValueError(f"not a boolean: {text!r}")
    if "int" in s:
        return int(text)
    if "float" in s:
        return float(text)
    return text


def config_from_argv(cls: type, argv: Sequence[str] | None, description: str) -> Any:
    """``cls`` (a config dataclass whose fields carry ``metadata["help"]``) from ``--config FILE`` (YAML) and
    ``--field value`` overrides; unknown YAML keys raise ``ValueError``."""
    import yaml

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--config", default=None, help="YAML file with the fields below")
    for f in fields(cls):
        flags = dict.fromkeys([f"--{f.name}", f"--{f.name.replace('_', '-')}"])
        ap.add_argument(*flags, dest=f.name, default=None,
                        type=lambda t, k=f.type: _parse_value(k, t), help=f.metadata.get("help", ""))
    a = ap.parse_args(argv)
    raw: dict[str, Any] = {}
    if a.config:
        with open(a.config) as fh:
            raw = yaml.safe_load(fh) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{a.config}: the config must be a YAML mapping")
        unknown = set(raw) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"{a.config}: unknown keys {sorted(unknown)}")
    for f in fields(cls):
        v = getattr(a, f.name)
        if v is not None:
            raw[f.name] = v
    missing = [f.name for f in fields(cls) if f.name not in raw and f.default is MISSING
               and f.default_factory is MISSING]
    if missing:
        raise ValueError(f"missing config fields: {missing}")
    return cls(**raw)
