"""The training form's typed widgets and saved setups.

* :func:`field_kinds`: for every config field of an algorithm (the keys of :func:`trainers.ui.commands.field_helps`),
  the widget its type calls for: ``bool`` (a checkbox), ``int`` / ``float`` (a number box), ``choice`` (a list: a
  ``Literal`` or an ``Enum``, TRL's strategies among them) or ``text``; read from the ``Config`` dataclass's type
  hints (and TRL's ``TrainingArguments`` fields) so the form follows the code, not a hand-kept list.
* :class:`SetupStore`: named setups (algorithm, config, the fields changed) saved as JSON under
  ``<runs>/ui/setups/NAME.json`` and loaded back, so a setup survives the browser and the UI.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import os
import types
import typing
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from trainers.ui.playground import UIError, safe_name

__all__ = ["SetupStore", "field_kinds", "kind_of"]


def kind_of(hint: Any) -> dict[str, Any]:
    """The widget for a type hint: ``{"type": "bool"|"int"|"float"|"choice"|"text", "choices"?: [...],
    "nullable"?: True}`` (``X | None`` is ``X``'s widget, nullable; a union with an ``Enum`` is that choice)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        kinds = [kind_of(a) for a in args]
        pick = next((k for k in kinds if k["type"] == "choice"), None) or (kinds[0] if len(kinds) == 1 else None)
        out = dict(pick) if pick else {"type": "text"}
        if len(args) < len(typing.get_args(hint)):
            out["nullable"] = True
        return out
    if origin is typing.Literal:
        return {"type": "choice", "choices": [str(v).lower() if isinstance(v, bool) else str(v)
                                              for v in typing.get_args(hint)]}
    if isinstance(hint, type):
        if issubclass(hint, bool):
            return {"type": "bool"}
        if issubclass(hint, enum.Enum):
            return {"type": "choice", "choices": [str(m.value) for m in hint]}
        if issubclass(hint, int):
            return {"type": "int"}
        if issubclass(hint, float):
            return {"type": "float"}
    return {"type": "text"}


def _kinds(cls: Any, prefix: str = "", depth: int = 0) -> dict[str, dict[str, Any]]:
    if not dataclasses.is_dataclass(cls) or depth > 2:
        return {}
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - unresolved annotations: text boxes
        hints = {}
    out: dict[str, dict[str, Any]] = {}
    for f in dataclasses.fields(cls):
        hint = hints.get(f.name)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            out.update(_kinds(hint, f"{prefix}{f.name}.", depth + 1))
            continue
        kind = kind_of(hint)
        choices = f.metadata.get("choices") if isinstance(f.metadata, Mapping) else None
        if kind["type"] == "text" and isinstance(choices, list | tuple) and choices:
            kind = {"type": "choice", "choices": [str(c) for c in choices]}
        out[prefix + f.name] = kind
    return out


@cache
def field_kinds(algorithm: str) -> dict[str, dict[str, Any]]:
    """Dotted config key -> widget (see :func:`kind_of`), under the keys :func:`field_helps` uses (TRL's fields
    at the top, the algorithm's own under ``toolgym.`` when it wraps a TRL config). Empty for an unknown name."""
    import trainers

    if algorithm not in trainers.ALGORITHMS:
        return {}
    out: dict[str, dict[str, Any]] = {}
    try:
        cfg = trainers.config_class(algorithm)
        fields = dataclasses.fields(cfg)
        trl_field = next((f for f in fields if "trl_config" in f.metadata), None)
        if trl_field is not None:
            out.update(_kinds(getattr(importlib.import_module("trl"), trl_field.metadata["trl_config"])))
        prefix = "toolgym." if trl_field is not None else ""
        out.update({f"{prefix}{k}": v for k, v in _kinds(cfg).items() if k != getattr(trl_field, "name", None)})
    except Exception:  # noqa: BLE001 - without types the form falls back to text boxes
        pass
    return out


class SetupStore:
    """Named training setups under ``<runs>/ui/setups/`` (one JSON file each, written whole then renamed)."""

    def __init__(self, runs: Path) -> None:
        self.root = runs / "ui" / "setups"

    def _path(self, name: str) -> Path:
        return self.root / f"{safe_name(name, 'setup name')}.json"

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.root.glob("*.json")) if self.root.is_dir() else []

    def save(self, name: str, setup: Mapping[str, Any]) -> str:
        """Save ``{"algorithm", "config", "overrides": {key: value}, "run_name"?}``; returns the name."""
        if not isinstance(setup, Mapping) or not isinstance(setup.get("overrides", {}), Mapping):
            raise UIError("a setup is {algorithm, config, overrides: {field: value}}")
        keep = {"algorithm": str(setup.get("algorithm", "")), "config": str(setup.get("config", "")),
                "overrides": {str(k): str(v) for k, v in dict(setup.get("overrides") or {}).items()}}
        path = self._path(name)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(keep, indent=1), encoding="utf-8")
        os.replace(tmp, path)
        return path.stem

    def load(self, name: str) -> dict[str, Any]:
        path = self._path(name)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UIError(f"no saved setup {name!r}") from None
        except (OSError, ValueError) as e:
            raise UIError(f"cannot read setup {name!r}: {e}") from None
