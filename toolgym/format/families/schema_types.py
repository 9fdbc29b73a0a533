"""Parameter schemas as the text-valued families read them: references resolved, unions split into branches.

Formats that write argument values as text (qwen3_coder, glm45/glm47) type each value with its parameter's JSON
schema. Real tool schemas (Pydantic's ``model_json_schema()``, MCP servers) use more than ``{"type": ...}``:
``$ref`` into ``$defs``, a root ``oneOf``/``anyOf`` of parameter sets, nested ``anyOf``, ``const`` and ``enum``
without a ``type``. This module turns a tool's ``parameters`` schema into one resolved schema per property
(:func:`property_schemas`) and a property schema into its union branches in schema order (:func:`branches`).

References are resolved with ``jsonschema``'s own ``referencing`` registry (the same lookup its validators use);
a recursive reference stops being inlined after a few levels (the deeper part stays a ``$ref``, which the
validator still resolves through :func:`validates`).

**The union rule** (qwen3_coder, minimax_m2): a value is read with each branch in schema order and the first
reading that validates against its branch wins; a ``null`` branch takes ``null``/``None``; when no branch
validates, the first branch's reading is kept (the schema check then reports it). glm45/glm47 read unions by the
types they admit instead (:func:`value_types`, :func:`admits`).

**Root unions** (qwen3_coder, glm45/glm47): when a tool's parameters are a root ``oneOf``/``anyOf`` of parameter
sets, the sibling arguments already read pick the sets a value belongs to (:func:`root_sets`,
:meth:`SchemaTypedParameters.read_arguments`), as the serving engines do.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from toolgym.tools.base import ToolCall

__all__ = ["ArgumentError", "SchemaTypedParameters", "admits", "branch_type", "branches", "fitting_schema",
           "pick_branch", "property_schemas", "reject_underscored_numbers", "root_sets", "validates", "value_types"]

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
    (:func:`property_schemas`; a tool that declares no property has no entry, its arguments are not checked by
    name), :attr:`root_unions`, ``{tool name: its root union's parameter sets}`` (:func:`root_sets`; only the
    tools whose parameters are a root ``oneOf``/``anyOf``), and :attr:`union_only`, ``{tool name: the parameters
    only its root union's branches declare}`` (read through :meth:`read_union_member`)."""

    param_schemas: dict[str, dict[str, Any]] = {}  # replaced, never mutated, by set_tools
    root_unions: dict[str, list[dict[str, Any]]] = {}  # replaced, never mutated, by set_tools
    union_only: dict[str, frozenset[str]] = {}  # replaced, never mutated, by set_tools

    def set_tools(self, schemas: Sequence[Mapping[str, Any]]) -> None:
        super().set_tools(schemas)  # type: ignore[misc]
        found: dict[str, dict[str, Any]] = {}
        unions: dict[str, list[dict[str, Any]]] = {}
        only: dict[str, frozenset[str]] = {}
        for s in schemas or ():
            f = s.get("function", s) if isinstance(s, Mapping) else {}
            if isinstance(f, Mapping) and isinstance(f.get("name"), str) and (props := property_schemas(f.get("parameters"))):
                found[f["name"]] = props
                if sets := root_sets(f.get("parameters")):
                    unions[f["name"]] = sets
                    root_props = f["parameters"].get("properties")
                    only[f["name"]] = frozenset(props) - frozenset(root_props if isinstance(root_props, Mapping) else ())
        self.param_schemas, self.root_unions, self.union_only = found, unions, only

    def read_union_member(self, raw: str, spec: Any, read: Callable[[str, Any], Any]) -> Any:
        """The reading of a parameter that only the branches of a root ``oneOf``/``anyOf`` declare (the root's own
        ``properties`` lack it); ``spec``: its declarations in the fitting sets. Default: ``read(raw, spec)``.
        A family overrides it where the serving engines read such parameters their own way."""
        return read(raw, spec)

    def read_arguments(self, tool: str, pairs: Sequence[tuple[str, str]],
                       read: Callable[[str, Any], Any]) -> dict[str, Any]:
        """The arguments ``{key: value}`` of a call to ``tool`` from its ``(key, value text)`` pairs, each read by
        ``read(text, schema)`` (schema ``None``: the tool's schema lacks the key). For a tool with a root union, a
        key's schema is the declarations of the parameter sets its siblings fit (:func:`fitting_schema`): the
        siblings already read, and before them every sibling whose reading needs no branch (a text, or a value
        of a parameter that admits no string). A ValueError from ``read`` is raised as :class:`ArgumentError`, which
        names the key."""
        schemas = self.param_schemas.get(tool, {})
        sets = self.root_unions.get(tool)
        only = self.union_only.get(tool, frozenset())

        def read_key(key: str, raw: str, spec: Any) -> Any:
            return self.read_union_member(raw, spec, read) if key in only else read(raw, spec)

        known: dict[str, Any] = {}
        if sets and len(pairs) > 1:
            for key, raw in pairs:
                try:
                    value = read_key(key, raw, schemas.get(key))
                except ValueError:
                    continue
                types = value_types(schemas.get(key)) if key in schemas else None
                if isinstance(value, str) or (types is not None and "string" not in types):
                    known[key] = value
        args: dict[str, Any] = {}
        for key, raw in pairs:
            spec = schemas.get(key)
            if sets and spec is not None:
                spec = fitting_schema(key, sets, {k: v for k, v in known.items() if k != key}, spec)
            try:
                args[key] = known[key] = read_key(key, raw, spec)
            except ValueError as e:
                raise ArgumentError(key, str(e)) from None
        return args

    def typed_call(self, tool: str, pairs: Mapping[str, str], read: Callable[[str, Any], Any], raw: str,
                   what: str) -> ToolCall:
        """A call to ``tool`` with the ``{key: value text}`` ``pairs`` read by :meth:`read_arguments`, or with the
        parse error of the first value that cannot be read (``what``: how the format names an argument)."""
        try:
            args = self.read_arguments(tool, list(pairs.items()), read)
        except ArgumentError as e:
            return ToolCall(tool, raw=raw, parse_error=f"{what} {e.key!r} of {tool!r}: {e}")
        return ToolCall(tool, args, raw=raw)


class ArgumentError(ValueError):
    """A value that cannot be read with its schema; :attr:`key` names the argument."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def root_sets(parameters: Any) -> list[dict[str, Any]]:
    """The parameter sets of a tool's root ``oneOf``/``anyOf``, references inlined: one ``{property: schema}`` per
    branch (a property the branch lacks but the root declares is the root's); ``[]`` when the root is no union."""
    if not isinstance(parameters, Mapping):
        return []
    root = _inline(parameters, _registry(parameters).resolver(base_uri=_BASE))
    alts = [a for key in ("oneOf", "anyOf") for a in (root.get(key) if isinstance(root.get(key), list) else ())]
    if not alts:
        return []
    shared = root.get("properties") if isinstance(root.get("properties"), Mapping) else {}
    return [{**shared, **property_schemas(alt)} for alt in alts if isinstance(alt, Mapping)]


def fitting_schema(key: str, sets: Sequence[Mapping[str, Any]], siblings: Mapping[str, Any], merged: Any) -> Any:
    """The schema of ``key`` given the ``siblings`` already read: the ``anyOf`` of its declarations in the root
    parameter ``sets`` every sibling fits (a sibling fits a set when the set does not declare it, or admits its
    value: :func:`admits`); ``merged`` (the schema of all sets) when no fitting set declares ``key``."""
    decls: list[Any] = []
    for s in sets:
        if key in s and s[key] not in decls and all(n not in s or admits(s[n], v) for n, v in siblings.items()):
            decls.append(s[key])
    if not decls:
        return merged
    return decls[0] if len(decls) == 1 else {"anyOf": decls}


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


_UNSET: Any = object()


def _value_kind(value: Any) -> str:
    """The JSON type of a value, an integral float counting as an integer."""
    if isinstance(value, float) and value.is_integer():
        return "integer"
    return _json_type(value)


def _same_json(a: Any, b: Any) -> bool:
    if _json_type(a) != _json_type(b) and {_json_type(a), _json_type(b)} != {"integer", "number"}:
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_json(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def value_types(spec: Any, value: Any = _UNSET) -> frozenset[str] | None:
    """The JSON types a (resolved) property schema admits, over its union branches (:func:`branches`); a
    ``number`` admits integers too. ``None``: some branch gives no type (untyped). With ``value``, a branch with
    ``const``/``enum`` admits only the types of the allowed values equal to it (``enum: ["7", 8]`` admits no
    integer 7)."""
    out: set[str] = set()
    for b in branches(spec):
        allowed = [b["const"]] if "const" in b else b.get("enum") if isinstance(b.get("enum"), list) else None
        t = b.get("type")
        if isinstance(t, str):
            kinds = {t.strip().lower()}
        elif allowed is not None:
            kinds = {_value_kind(v) for v in allowed}
        else:
            return None
        if allowed is not None and value is not _UNSET:
            kinds &= {_value_kind(v) for v in allowed if _same_json(v, value)}
        out |= kinds | ({"integer"} if "number" in kinds else set())
    return frozenset(out)


def admits(spec: Any, value: Any) -> bool:
    """Whether ``value``'s JSON type is one the schema ``spec`` admits for it (:func:`value_types` with the
    value; an untyped schema admits anything)."""
    types = value_types(spec, value)
    return types is None or _value_kind(value) in types


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
