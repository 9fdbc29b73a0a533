"""Module paths that moved, kept importable: ``import OLD`` returns the module now at ``NEW`` (the same object, so
attributes set on one are seen through the other) and warns once with a :class:`DeprecationWarning` naming ``NEW``.

:func:`alias_moved_modules` installs a finder on :data:`sys.meta_path` for a mapping of old -> new dotted names;
``toolgym`` calls it for its own moved modules and ``trainers`` for its. Nothing is imported until an old name is.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Mapping
from types import ModuleType

__all__ = ["alias_moved_modules"]


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names of :attr:`moved` and loads them as the modules at their new names."""

    def __init__(self, moved: Mapping[str, str]) -> None:
        self.moved = dict(moved)
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.moved:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=False)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = self.moved[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import {new}", DeprecationWarning, stacklevel=3)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system sets the old name's spec on what create_module returned: give the module its own back
        module.__spec__ = self._specs[module.__spec__.name]


def alias_moved_modules(moved: Mapping[str, str]) -> None:
    """Make each old dotted name in ``moved`` import the module at its new name (idempotent per mapping)."""
    if not any(isinstance(f, _Alias) and f.moved == dict(moved) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias(moved))  # before any path finder that could still see an old file
