"""The one config reader of every algorithm: a YAML file plus ``--field value`` overrides -> the algorithm's
``Config`` (``toolgym train <name>``, the web UI's launcher, ``python -m trainers.<name>``).

Why our own reader and not TRL's ``TrlParser``/``HfArgumentParser``: those read a flat namespace of dataclass
fields and exit the process (argparse) on a bad key, while toolgym configs nest the toolgym fields in a
``toolgym:`` section beside TRL's, dotted keys set nested values (``--toolgym.env_kwargs.split test``), and a bad
key must be a one-line error naming the close matches with a stable exit code (:class:`toolgym.errors.ConfigError`).
TRL's config classes still do TRL's own checks: the ``trl`` fields are built into ``trl.GRPOConfig`` etc. by
:func:`trl_config`.

Layout of a config file:

* an algorithm whose ``Config`` has a ``trl`` field (``metadata["trl_config"]`` names the TRL class: ``grpo``,
  ``sft``): the top-level keys are fields of that TRL class and the ``toolgym:`` section holds the other
  ``Config`` fields;
* every other algorithm: the top-level keys are the ``Config`` fields.

Overrides: ``--key value``, ``--key=value`` or ``--flag`` alone (= ``true``); dashes in names are read as
underscores; a dotted key sets a nested value. Values are YAML scalars or flow collections (``2``, ``1.0e-5``,
``true``, ``null``, ``[a, b]``, ``{split: test}``), converted to the field's type where it is a plain
``int``/``float``/``bool``/``str``.
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import difflib
import importlib
import os
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from toolgym.errors import ConfigError

__all__ = [
    "SECTION",
    "as_mapping",
    "describe",
    "find_config",
    "opt",
    "parse_overrides",
    "read_config",
    "resolve",
    "shipped_configs_dir",
    "trl_config",
    "trl_field",
]

#: the section of a config file that holds the toolgym fields of an algorithm with a ``trl`` field
SECTION = "toolgym"
#: top-level modules whose absence means the ``[train]`` extra is not installed
_TRAIN_DEPS = {"trl", "torch", "accelerate", "datasets", "peft", "transformers"}


def opt(default: Any, help: str, **metadata: Any) -> Any:  # noqa: A002 - the argparse word
    """A dataclass field with its default and its help text (``metadata["help"]``); a mutable default (dict,
    list) is copied for every instance."""
    meta = {"help": help, **metadata}
    if isinstance(default, dict | list | set):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def trl_field(cls: type) -> tuple[str, str] | None:
    """``(field name, TRL config class name)`` of the field of ``cls`` that holds a TRL trainer's config (its
    ``metadata["trl_config"]``), or ``None``."""
    for f in dataclasses.fields(cls):
        if "trl_config" in f.metadata:
            return f.name, f.metadata["trl_config"]
    return None


def describe(cls: type) -> list[dict[str, Any]]:
    """The fields of a ``Config`` for a form or ``--help``: ``name``, ``type`` (as written), ``default`` (``None``
    when it has none), ``help``; imports nothing."""
    out = []
    for f in dataclasses.fields(cls):
        default = (f.default_factory() if f.default_factory is not dataclasses.MISSING  # type: ignore[misc]
                   else None if f.default is dataclasses.MISSING else f.default)
        out.append({"name": f.name, "type": f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type)),
                    "default": default, "help": f.metadata.get("help", "")})
    return out


# ---------------------------------------------------------------------------------------------------------------
# Command-line overrides
# ---------------------------------------------------------------------------------------------------------------


def parse_value(text: str) -> Any:
    """A command-line value as YAML (``2`` -> int, ``true`` -> bool, ``[a, b]`` -> list); unparsable text stays a
    string."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_overrides(tokens: Sequence[str]) -> dict[str, Any]:
    """``["--a.b", "1", "--c=x", "--flag"]`` -> ``{"a.b": 1, "c": "x", "flag": True}`` (dashes in names become
    underscores; a name not followed by a value is ``True``).

    Raises:
        ConfigError: a token that is not an option (``value`` without ``--name``), or an empty name.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--") or tok == "--":
            raise ConfigError(f"unexpected argument {tok!r}: overrides are --name value (or --name=value)")
        name, eq, value = tok[2:].partition("=")
        if not name:
            raise ConfigError(f"empty option name in {tok!r}")
        name = ".".join(part.replace("-", "_") for part in name.split("."))
        if eq:
            out[name] = parse_value(value)
            i += 1
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            out[name] = parse_value(tokens[i + 1])
            i += 2
        else:
            out[name] = True
            i += 1
    return out


def _set_dotted(cfg: dict[str, Any], key: str, value: Any) -> None:
    """``cfg["a"]["b"] = value`` for ``key="a.b"`` (sections created as needed)."""
    parts = key.split(".")
    node = cfg
    for k, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"--{key}: {'.'.join(parts[:k + 1])} is a value, not a section")
        node = child
    node[parts[-1]] = value


# ---------------------------------------------------------------------------------------------------------------
# Checking keys and types
# ---------------------------------------------------------------------------------------------------------------


def _hints(cls: type) -> dict[str, Any]:
    """Field name -> type of the dataclass ``cls`` (string annotations resolved one by one; ``object`` for
    what cannot be resolved, i.e. not checked)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - some annotation does not resolve: resolve the others
        pass
    module = sys.modules.get(cls.__module__)
    namespace = {**vars(builtins), **(vars(module) if module is not None else {})}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        tp = f.type
        if isinstance(tp, str):
            try:
                tp = eval(tp, namespace)  # what typing.get_type_hints does for each annotation
            except Exception:  # noqa: BLE001
                tp = object
        out[f.name] = tp
    return out


def _scalar_types(tp: Any) -> set[type]:
    """The plain scalar types (``int``, ``float``, ``bool``, ``str``) a type hint admits; ``{object}`` = anything."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_scalar_types(a) for a in typing.get_args(tp)))
    if tp in (int, float, bool, str, type(None)):
        return {tp}
    if origin is typing.Literal:
        return {type(a) for a in typing.get_args(tp)}
    return {object}  # containers, enums, classes: leave the value alone


def _coerce(key: str, value: Any, tp: Any, where: str) -> Any:
    """``value`` converted to the scalar type ``tp`` admits (``"1e-5"`` -> 1e-05 for a float field)."""
    allowed = _scalar_types(tp)
    if object in allowed or value is None or type(value) in allowed:
        return value
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        return value  # an int is a fine float
    if float in allowed and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if int in allowed and isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    if str in allowed and isinstance(value, int | float | bool):
        return str(value)
    names = "/".join(sorted(t.__name__ for t in allowed if t is not type(None)))
    raise ConfigError(f"{where}{key}: expected {names}, got {value!r}")


def _check(section: Mapping[str, Any], cls: type, prefix: str, where: str, skip: str | None = None) -> dict[str, Any]:
    """Check the keys of ``section`` against the dataclass ``cls`` (without field ``skip``), converting scalar
    values to the field types.

    Raises:
        ConfigError: an unknown key (the message names up to 3 close matches) or a value of the wrong type.
    """
    hints = _hints(cls)
    known = [f.name for f in dataclasses.fields(cls) if f.name != skip]
    noun = "option" if prefix.startswith("--") else "key"
    out: dict[str, Any] = {}
    for key, value in section.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
            hint = (f"; did you mean {' or '.join(prefix + c for c in close)}?" if close
                    else f" (not a field of {cls.__module__}.{cls.__qualname__})")
            raise ConfigError(f"{where}unknown {noun} {prefix}{key}{hint}")
        out[key] = _coerce(prefix + key, value, hints[key], where) if key in hints else value
    return out


# ---------------------------------------------------------------------------------------------------------------
# Resolving a config
# ---------------------------------------------------------------------------------------------------------------


def import_train(name: str) -> Any:
    """``importlib.import_module(name)``; a missing ``[train]`` dependency is a :class:`ConfigError` (code 3)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in _TRAIN_DEPS:
            raise ConfigError(
                f"`toolgym train` needs the [train] extra (missing module {e.name!r}): "
                "pip install torch==2.13.0 && pip install 'toolgym[train]'", code=3
            ) from None
        raise


def _trl_class(name: str) -> type:
    return getattr(import_train("trl"), name)


def trl_config(cls_name: str, value: Any) -> Any:
    """``trl.<cls_name>`` built from ``value`` (a mapping of its fields, or already such an object).

    Raises:
        ConfigError: TRL rejects the fields (e.g. a batch size not divisible by ``num_generations``).
    """
    cls = _trl_class(cls_name)
    if isinstance(value, cls):
        return value
    try:
        return cls(**dict(value or {}))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"invalid {cls_name}: {' '.join(str(e).split())}") from None


def shipped_configs_dir() -> Path:
    """The folder of configurations shipped in the ``trainers`` package (``trainers/configs/`` in a checkout, the
    same folder inside an installed wheel)."""
    return Path(str(resources.files("trainers") / "configs"))


def find_config(config: str | os.PathLike[str]) -> Path:
    """The file ``config`` names: an existing path as it is; otherwise a shipped configuration found by its name
    (``grpo_calculator_cpu``, ``grpo_calculator_cpu.yaml``) or by its path in a checkout
    (``trainers/configs/grpo_calculator_cpu.yaml``, so the documented commands also work from an installed wheel).

    Raises:
        ConfigError: (code 3) no such file and no shipped configuration of that name; the message lists them.
    """
    path = Path(config)
    if path.is_file():
        return path
    shipped = shipped_configs_dir()
    name = path.name if path.parent in (Path("."), Path("trainers/configs"), Path("trainers") / "configs") else None
    if name is not None:
        for cand in (shipped / name, shipped / f"{name}.yaml"):
            if cand.is_file():
                return cand
    known = sorted(p.stem for p in shipped.glob("*.yaml"))
    raise ConfigError(f"cannot read config {config}: no such file, and no shipped config of that name "
                      f"(shipped: {', '.join(known)})", code=3)


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The YAML mapping in ``path`` (a file, or a shipped configuration's name: :func:`find_config`). Raises
    :class:`ConfigError` (code 3) when it cannot be read or is not one."""
    import yaml

    path = find_config(path)
    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh) or {}
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror or e}", code=3) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config {path} is not valid YAML: {' '.join(str(e).split())}", code=3) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config {path} must be a YAML mapping, got {type(raw).__name__}", code=3)
    return raw


def resolve(cls: type, config: str | os.PathLike[str] | Mapping[str, Any] | None = None,
            overrides: Mapping[str, Any] | None = None, *, check_trl: bool = False) -> Any:
    """``cls`` (an algorithm's ``Config``) from ``config`` (a YAML path, a mapping laid out like one, or ``None``
    for the defaults) and dotted ``overrides`` (:func:`parse_overrides`); every key and scalar type is checked.

    The ``trl`` field (if ``cls`` has one) gets its default mapping updated with the file's top-level keys, then
    the overrides'. ``check_trl=True`` also builds the TRL config once (TRL's own checks) without keeping it.

    Raises:
        ConfigError: an unknown key (with the close matches), a wrong scalar type, an unreadable file (code 3), a
            missing ``[train]`` extra (code 3), a value ``cls`` or TRL rejects.
    """
    raw = dict(read_config(config) if isinstance(config, str | os.PathLike) else (config or {}))
    where = f"{config}: " if isinstance(config, str | os.PathLike) else ""
    tf = trl_field(cls)
    if tf is None:
        fields = _check(raw, cls, "", where)
        for key, value in (overrides or {}).items():
            _set_dotted(fields, key, value)
        fields = _check(fields, cls, "--", "")
        trl_fields: dict[str, Any] = {}
    else:
        name, trl_name = tf
        trl_cls = _trl_class(trl_name)
        raw_tg = raw.pop(SECTION, None) or {}
        if not isinstance(raw_tg, dict):
            raise ConfigError(f"{where}the {SECTION} section must be a mapping")
        # the file first (errors name the file), then the file + the overrides (errors name the option)
        trl_fields = _check(raw, trl_cls, "", where)
        fields = _check(raw_tg, cls, f"{SECTION}.", where, skip=name)
        merged: dict[str, Any] = {**trl_fields, SECTION: fields}
        for key, value in (overrides or {}).items():
            _set_dotted(merged, key, value)
        fields = _check(merged.pop(SECTION) or {}, cls, f"--{SECTION}.", "", skip=name)
        trl_fields = _check(merged, trl_cls, "--", "")
        default = next(f for f in dataclasses.fields(cls) if f.name == name)
        base = default.default_factory() if default.default_factory is not dataclasses.MISSING else {}  # type: ignore[misc]
        fields[name] = {**(base or {}), **trl_fields}
    try:
        cfg = cls(**fields)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}invalid {cls.__module__}.{cls.__qualname__}: {' '.join(str(e).split())}") from None
    if tf is not None and check_trl:
        trl_config(tf[1], getattr(cfg, tf[0]))
    return cfg


def as_mapping(cfg: Any) -> dict[str, Any]:
    """A resolved ``Config`` laid out like its config file (TRL fields at the top and the rest under ``toolgym:``
    when it has a ``trl`` field; flat otherwise): ``resolve(type(cfg), as_mapping(cfg)) == cfg``."""
    data = dataclasses.asdict(cfg)  # a TRL config object in the trl field becomes its dict of fields too
    tf = trl_field(type(cfg))
    if tf is None:
        return data
    trl = data.pop(tf[0])
    return {**dict(trl or {}), SECTION: data}
