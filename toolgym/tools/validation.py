"""JSON-schema validation of tool arguments whose regular expressions are bounded in time.

A tool's schema may carry ``pattern`` / ``patternProperties`` regular expressions, and the model chooses the string
matched against them: a pattern that backtracks (``^(a+)+$`` against ``"aaaa…b"``) took seconds on a 27-character
argument. jsonschema matches them with :mod:`re`, which holds the GIL while it backtracks, so not even a worker
thread keeps the event loop running. Here those keywords (and ``additionalProperties``, which matches the same
patterns) use the ``regex`` module with ``concurrent=True`` (the GIL is released while matching) and a ``timeout``
per match: a match past :data:`MATCH_TIMEOUT_S` makes the argument invalid, with a message that says so. The
executor runs such schemas' validation in a worker thread, under the call's timeout.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import regex

__all__ = ["MATCH_TIMEOUT_S", "first_error", "has_patterns", "make_validator"]

MATCH_TIMEOUT_S = 1.0
"""Longest time (seconds) one regular-expression match of a schema may take; past it the argument is invalid."""


class _SlowMatch(Exception):
    pass


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str) -> Any:
    return regex.compile(pattern)


def _search(pattern: str, text: str) -> bool:
    try:
        return _compiled(pattern).search(text, concurrent=True, timeout=MATCH_TIMEOUT_S) is not None
    except TimeoutError:
        raise _SlowMatch(pattern) from None
    except regex.error as e:
        raise ValueError(f"the tool's schema has a pattern that cannot be used: {pattern!r} ({e})") from None


def _short(text: str, n: int = 40) -> str:
    return repr(text) if len(text) <= n else repr(text[:n]) + f"... ({len(text)} characters)"


def _slow(pattern: str, text: str) -> jsonschema.ValidationError:
    return jsonschema.ValidationError(
        f"{_short(text)} could not be matched against the pattern {pattern!r} within {MATCH_TIMEOUT_S:g} s"
    )


def _pattern(validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]) -> Iterator[Any]:
    if not validator.is_type(instance, "string"):
        return
    try:
        if not _search(pattern, instance):
            yield jsonschema.ValidationError(f"{_short(instance)} does not match {pattern!r}")
    except _SlowMatch:
        yield _slow(pattern, instance)


def _pattern_properties(validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            try:
                hit = _search(pattern, key)
            except _SlowMatch:
                yield _slow(pattern, key)
                continue
            if hit:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, extra: Any, instance: Any, schema: Mapping[str, Any]) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    unexpected = []
    for key in instance:
        if key in properties:
            continue
        try:
            if any(_search(p, key) for p in patterns):
                continue
        except _SlowMatch as e:
            yield _slow(str(e), key)
            continue
        unexpected.append(key)
    if validator.is_type(extra, "object"):
        for key in unexpected:
            yield from validator.descend(instance[key], extra, path=key)
    elif not extra and unexpected:
        names = ", ".join(repr(k) for k in sorted(unexpected))
        yield jsonschema.ValidationError(
            f"Additional properties are not allowed ({names} {'was' if len(unexpected) == 1 else 'were'} unexpected)"
        )


def make_validator(schema: Mapping[str, Any]) -> Any:
    """A jsonschema validator for ``schema`` (its declared draft, else 2020-12) whose pattern keywords are bounded
    (see the module docstring). Raises ``jsonschema.SchemaError`` for an invalid schema."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    bounded = jsonschema.validators.extend(cls, {
        "pattern": _pattern, "patternProperties": _pattern_properties, "additionalProperties": _additional_properties,
    })  # fmt: skip
    return bounded(schema)


def has_patterns(schema: Mapping[str, Any]) -> bool:
    """Whether ``schema`` carries any regular expression (then validating may take up to a match timeout)."""
    text = json.dumps(schema, default=str)
    return '"pattern"' in text or '"patternProperties"' in text


def first_error(validator: Any, arguments: Any) -> str | None:
    """The most relevant validation error of ``arguments`` as ``path: message``, or ``None`` when they are valid."""
    err = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if err is None:
        return None
    where = "/".join(str(p) for p in err.absolute_path)
    return f"{where + ': ' if where else ''}{err.message}"
