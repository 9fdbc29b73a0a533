"""Parameter schemas as the text-valued families read them: references resolved, unions split into branches.

Formats that write argument values as text (qwen3_coder, glm45/glm47) type each value with its parameter's JSON
schema. Real tool schemas (Pydantic's ``model_json_schema()``, MCP servers) use more than ``{"type": ...}``:
``$ref`` into ``$defs``, a root ``oneOf``/``anyOf`` of parameter sets, nested ``anyOf``, ``const`` and ``enum``
without a ``type``. This module turns a tool's ``parameters`` schema into one resolved schema per property
(:func:`property_schemas`) and a property schema into its union branches in schema order (:func:`branches`).

References are resolved with ``jsonschema``'s own ``referencing`` registry (the same lookup its validators use);
a recursive reference stops being inlined after a few levels (the deeper part stays a ``$ref``, which the
validator still resolves through :func:`validates`).

**The union rule** (every text-valued family): a value is read with each branch in schema order and the first
reading that validates against its branch wins; a ``null`` branch takes ``null``/``None``; when no branch
validates, the first branch's reading is kept (the schema check then reports it).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

__all__ = ["SchemaTypedParameters", "branch_type", "branches", "pick_branch", "property_schemas",
           "reject_underscored_numbers", "validates"]

_BASE = "urn:toolgym:parameters"
_MAX_DEPTH = 8


def _registry(root: Mapping[str, Any]) -> Registry:
    resource = Resource.from_contents(dict(root), default_specification=DRAFT202012)
    return Registry().with_resource(_BASE, resource)


def _inline(spec: Any, resolver: Any, depth: int = 0) -> Any:
    """``spec`` with its ``$ref``s replaced by their targets (``depth`` levels at most; sibling keys kept)."""
    if isinstance(spec, list):
        return [_inline(s, resolver, depth) for s in spec]
    if not isinstance(spec, Mapping):
        return spec
    out = dict(spec)
    ref = out.get("$ref")
    if isinstance(ref, str) and depth < _MAX_DEPTH:
        try:
            target = resolver.lookup(ref).contents
        except (Unresolvable, Exception):  # noqa: BLE001 - an unresolvable reference stays as written
            target = None
        if isinstance(target, Mapping):
            del out["$ref"]
            merged = {**_inline(target, resolver, depth + 1), **{k: v for k, v in out.items() if k != "$defs"}}
            return {k: _inline(v, resolver, depth + 1) if k != "$defs" else v for k, v in merged.items()}
    return {k: (v if k in ("$defs", "definitions", "const", "enum", "default", "examples") else _inline(v, resolver, depth))
            for k, v in out.items()}


class SchemaTypedParameters:
    """A parser mixin (listed before ``ToolCallParser``) for the formats that type argument values with the tool's
    schema: :meth:`set_tools` also keeps :attr:`param_schemas`, ``{tool name: {property: resolved schema}}``
    (:func:`property_schemas`); a tool that declares no property has no entry (its arguments are not checked by
    name)."""

    param_schemas: dict[str, dict[str, Any]] = {}  # replaced, never mutated, by set_tools

    def set_tools(self, schemas: Sequence[Mapping[str, Any]]) -> None:
        super().set_tools(schemas)  # type: ignore[misc]
        found: dict[str, dict[str, Any]] = {}
        for s in schemas or ():
            f = s.get("function", s) if isinstance(s, Mapping) else {}
            if isinstance(f, Mapping) and isinstance(f.get("name"), str) and (props := property_schemas(f.get("parameters"))):
                found[f["name"]] = props
        self.param_schemas = found


def property_schemas(parameters: Any) -> dict[str, Any]:
    """Each property's schema, references inlined, from a tool's ``parameters`` schema. Properties of a root
    ``oneOf``/``anyOf``/``allOf`` (each branch a parameter set) are merged: a property several branches declare
    differently becomes an ``anyOf`` of its declarations, in branch order."""
    if not isinstance(parameters, Mapping):
        return {}
    resolver = _registry(parameters).resolver(base_uri=_BASE)
    root = _inline(parameters, resolver)
    out: dict[str, list[Any]] = {}

    def collect(node: Any, depth: int = 0) -> None:
        if not isinstance(node, Mapping) or depth > _MAX_DEPTH:
            return
        props = node.get("properties")
        if isinstance(props, Mapping):
            for k, v in props.items():
                if isinstance(v, Mapping) and v not in out.setdefault(k, []):
                    out[k].append(v)
        for key in ("allOf", "anyOf", "oneOf"):
            alts = node.get(key)
            for alt in alts if isinstance(alts, list) else ():
                collect(alt, depth + 1)

    collect(root)
    return {k: (v[0] if len(v) == 1 else {"anyOf": v}) for k, v in out.items() if v}


def branches(spec: Any, depth: int = 0) -> list[Mapping[str, Any]]:
    """The union branches of a (resolved) property schema, in schema order: ``anyOf``/``oneOf`` flattened
    (nested ones too), a type list split into one branch per type, a one-element ``allOf`` unwrapped. A schema
    that is no union is its own single branch."""
    if not isinstance(spec, Mapping) or depth > _MAX_DEPTH:
        return [{}]
    base = {k: v for k, v in spec.items() if k not in ("anyOf", "oneOf")}
    for key in ("anyOf", "oneOf"):
        alts = spec.get(key)
        if isinstance(alts, list) and alts:
            out: list[Mapping[str, Any]] = []
            for alt in alts:
                merged = {**{k: v for k, v in base.items() if k not in ("description", "title", "default")},
                          **alt} if isinstance(alt, Mapping) else alt
                out.extend(branches(merged, depth + 1))
            return out
    all_of = spec.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], Mapping):
        return branches({**{k: v for k, v in spec.items() if k != "allOf"}, **all_of[0]}, depth + 1)
    t = spec.get("type")
    if isinstance(t, list) and t:
        return [{**spec, "type": one} for one in t]
    return [spec]


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return "array" if isinstance(value, list) else "object"


def branch_type(spec: Any) -> str | None:
    """The type a branch declares: its ``type``; else the one JSON type of its ``const`` or all its ``enum``
    values; else ``None`` (untyped)."""
    if not isinstance(spec, Mapping):
        return None
    t = spec.get("type")
    if isinstance(t, str):
        return t.strip().lower()
    if "const" in spec:
        return _json_type(spec["const"])
    enum = spec.get("enum")
    if isinstance(enum, list) and enum:
        kinds = {_json_type(v) for v in enum}
        if kinds == {"integer", "number"}:
            return "number"
        if len(kinds) == 1:
            return kinds.pop()
    return None


def validates(value: Any, spec: Mapping[str, Any]) -> bool:
    """Whether ``value`` is valid against ``spec`` (draft 2020-12; an invalid schema validates nothing)."""
    try:
        return jsonschema.Draft202012Validator(dict(spec)).is_valid(value)
    except Exception:  # noqa: BLE001 - a malformed or unresolvable schema accepts no value
        return False


def pick_branch(raw: str, spec: Any, read: Callable[[str, Mapping[str, Any]], Any]) -> tuple[bool, Any]:
    """The union rule for a text value ``raw`` of a parameter with schema ``spec``: ``read(raw, branch)`` reads
    it with each branch in order and the first value that validates wins. Returns ``(True, value)``; or
    ``(False, None)`` when ``spec`` is no union (one non-null branch: the family reads it its usual way) or no
    branch validates. ``read`` may raise ValueError for a text its branch cannot read (the branch is skipped)."""
    parts = branches(spec)
    non_null = [b for b in parts if branch_type(b) != "null"]
    if len(non_null) <= 1:
        return False, None
    if raw.strip() in ("null", "None") and len(non_null) < len(parts):
        return True, None
    for b in non_null:
        try:
            value = read(raw, b)
        except ValueError:
            continue
        if validates(value, b):
            return True, value
    return False, None


def reject_underscored_numbers(text: str, tree: ast.AST) -> None:
    """ValueError when a number literal in ``tree`` (parsed from ``text``) is written with ``_`` separators:
    ``123_456`` is Python syntax, not a number a tool-call format writes."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float | complex) \
                and not isinstance(node.value, bool):
            seg = ast.get_source_segment(text, node) or ""
            if "_" in seg:
                raise ValueError(f"number written with underscores: {seg[:40]!r}")
