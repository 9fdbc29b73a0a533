"""The Berkeley Function Calling Leaderboard (BFCL v4) data, read from the ``bfcl-eval`` package.

``bfcl-eval`` (Apache-2.0) ships the test entries (``bfcl_eval/data/BFCL_v4_<category>.json``), their possible
answers and the multi-turn function docs; :func:`load_category` reads them with BFCL's own loaders
(``bfcl_eval.utils.load_dataset_entry`` / ``load_ground_truth_entry``: the language hints of the Java and JavaScript
categories and the multi-turn function docs are added exactly as BFCL adds them) and turns each entry into a toolgym
task row.

The package is installed without its declared dependencies (``pip install --no-deps bfcl-eval``: they include torch,
CUDA wheels and five API SDKs that no checker imports). Its AST checker imports ``bfcl_eval.constants.model_config``,
which imports every model handler (and so every API SDK) for one mapping: ``MODEL_CONFIG_MAPPING[model].
underscore_to_dot``. :func:`toolgym.envs.bfcl.checkers.install_model_config_standin` puts a stand-in for that one module into ``sys.modules``
before the checker is imported: a mapping that answers ``underscore_to_dot=False`` for any model name. toolgym maps the
tool names back to BFCL's dotted names itself before checking (each row's ``name_map``), so ``False`` (compare the
original names) is the right answer for every call. docs/bfcl.md explains the choice.

Splits: ``"all"`` is the whole category (the leaderboard's set); ``"train"`` / ``"test"`` split each category by a
hash of the entry id (:func:`split_of`: the ``ceil(n / 2)`` ids with the smallest SHA-256 are ``test``), so a
held-out claim never trains on a test entry.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "AST_CATEGORIES",
    "CATEGORIES",
    "GROUPS",
    "IRRELEVANCE_CATEGORIES",
    "MULTI_TURN_CATEGORIES",
    "BFCLUnavailable",
    "category_kind",
    "load_category",
    "parse_categories",
    "require_bfcl",
    "split_of",
    "to_tool_schema",
]

#: the single-turn categories scored by BFCL's AST checker (``summary`` group: non_live / live)
AST_CATEGORIES: dict[str, str] = {
    "simple_python": "non_live", "multiple": "non_live", "parallel": "non_live", "parallel_multiple": "non_live",
    "simple_java": "non_live_lang", "simple_javascript": "non_live_lang",
    "live_simple": "live", "live_multiple": "live", "live_parallel": "live", "live_parallel_multiple": "live",
}
#: the single-turn categories whose right answer is no call (BFCL's relevance runner)
IRRELEVANCE_CATEGORIES: tuple[str, ...] = ("irrelevance", "live_irrelevance")
#: the multi-turn categories scored by BFCL's multi-turn checker against its Python API simulators
MULTI_TURN_CATEGORIES: tuple[str, ...] = (
    "multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context",
)
#: every category toolgym/BFCL-v0 serves (``web_search`` and ``memory`` are left out: they need the network or a
#: downloaded embedding model)
CATEGORIES: tuple[str, ...] = (*AST_CATEGORIES, *IRRELEVANCE_CATEGORIES, *MULTI_TURN_CATEGORIES)

#: category groups accepted by :func:`parse_categories`
GROUPS: dict[str, tuple[str, ...]] = {
    "all": CATEGORIES,
    "single_turn": (*AST_CATEGORIES, *IRRELEVANCE_CATEGORIES),
    "non_live": ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance"),
    "live": ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple", "live_irrelevance"),
    "multi_turn": MULTI_TURN_CATEGORIES,
}


def parse_categories(spec: str | Sequence[str]) -> list[str]:
    """Category names from a comma-separated list (or a sequence) of names and groups (:data:`GROUPS`), in order,
    without repeats. ``ValueError`` names an unknown one."""
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    out: list[str] = []
    for s in items:
        names = GROUPS.get(s, (s,))
        for n in names:
            if n not in CATEGORIES:
                category_kind(n)  # raises: not served (web_search, memory) or unknown
            if n not in out:
                out.append(n)
    if not out:
        raise ValueError("no BFCL category given")
    return out


class BFCLUnavailable(ImportError):
    """``bfcl-eval`` is not installed (``make install`` installs it; docs/bfcl.md says how by hand)."""


def require_bfcl() -> None:
    """Raise :class:`BFCLUnavailable` with the install command when ``bfcl_eval`` cannot be imported."""
    try:
        import bfcl_eval  # noqa: F401
    except ImportError as e:
        raise BFCLUnavailable(
            "toolgym/BFCL-v0 needs the bfcl-eval package: pip install --no-deps bfcl-eval==2026.3.23 "
            "(and pip install 'toolgym[bfcl]' for the few packages its checkers import; see docs/bfcl.md)"
        ) from e


def category_kind(category: str) -> str:
    """``"ast"``, ``"irrelevance"`` or ``"multi_turn"``; ``ValueError`` naming the served categories otherwise."""
    if category in AST_CATEGORIES:
        return "ast"
    if category in IRRELEVANCE_CATEGORIES:
        return "irrelevance"
    if category in MULTI_TURN_CATEGORIES:
        return "multi_turn"
    if category in ("web_search", "memory") or category.startswith(("web_search", "memory")):
        raise ValueError(f"BFCL category {category!r} is not served: it needs the network or a downloaded "
                         "embedding model (docs/bfcl.md)")
    raise ValueError(f"unknown BFCL category {category!r}; one of: {', '.join(CATEGORIES)}; groups: "
                     f"{', '.join(GROUPS)}")


def split_of(entry_ids: list[str]) -> dict[str, str]:
    """``{entry id: "test" | "train"}`` for the entries of one category: the ids ordered by SHA-256 of the id, the
    first ``ceil(n / 2)`` in ``test`` (so ``test`` holds at least half), the rest in ``train``. A fixed function
    of the category's ids: the split never changes for a given ``bfcl-eval`` version."""
    order = sorted(entry_ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())
    n_test = (len(order) + 1) // 2
    return {i: ("test" if j < n_test else "train") for j, i in enumerate(order)}


#: BFCL's type names -> JSON-schema types (the table of BFCL's FC handlers, ``GORILLA_TO_OPENAPI``)
def _type_table() -> dict[str, str]:
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    return dict(GORILLA_TO_OPENAPI)


def _cast_types(schema: dict[str, Any], table: Mapping[str, str]) -> dict[str, Any]:
    """One parameter schema with BFCL's types mapped to JSON-schema types, recursively (``properties``, ``items``);
    an unknown or missing type becomes ``string`` and ``float`` adds BFCL's "This is a float type value." hint, as
    BFCL's FC handlers do."""
    out = dict(schema)
    t = out.get("type")
    if t == "float":
        out["description"] = str(out.get("description", "")) + " This is a float type value."
    out["type"] = table.get(t, "string") if isinstance(t, str) else "string"
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _cast_types(v, table) for k, v in out["properties"].items() if isinstance(v, dict)}
    if isinstance(out.get("items"), dict):
        out["items"] = _cast_types(out["items"], table)
    return out


def to_tool_schema(function: Mapping[str, Any]) -> dict[str, Any]:
    """A BFCL function doc as an OpenAI / chat-template tool spec, the way BFCL's FC handlers send it: dots in the
    name become underscores, the parameters' ``"dict"`` becomes ``"object"`` (and BFCL's other type names their
    JSON-schema types); the ``response`` doc of multi-turn functions is dropped."""
    table = _type_table()
    params = copy.deepcopy(dict(function.get("parameters") or {}))
    props = params.get("properties") or {}
    params["type"] = "object"
    params["properties"] = {k: _cast_types(v, table) for k, v in props.items() if isinstance(v, dict)}
    params.setdefault("required", [])
    return {"type": "function", "function": {
        "name": str(function["name"]).replace(".", "_"),
        "description": str(function.get("description", "")),
        "parameters": params,
    }}


@functools.lru_cache(maxsize=32)
def _load(category: str) -> tuple[dict[str, Any], ...]:
    require_bfcl()
    from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

    kind = category_kind(category)
    entries = load_dataset_entry(category)  # what the model is shown (language hints added)
    plain = {e["id"]: e for e in load_dataset_entry(category, include_language_specific_hint=False)}  # what BFCL checks
    answers = {} if kind == "irrelevance" else {a["id"]: a["ground_truth"] for a in load_ground_truth_entry(category)}
    splits = split_of([e["id"] for e in entries])
    rows = []
    for e in entries:
        functions = list(e.get("function") or [])
        missed = {int(k): list(v) for k, v in (e.get("missed_function") or {}).items()}
        every = functions + [f for fs in missed.values() for f in fs]
        row: dict[str, Any] = {
            "id": e["id"],
            "category": category,
            "kind": kind,
            "split": splits[e["id"]],
            "question": e["question"],
            "functions": list(plain[e["id"]].get("function") or []),
            "tools": [to_tool_schema(f) for f in functions],
            "name_map": {str(f["name"]).replace(".", "_"): str(f["name"]) for f in every},
        }
        if kind == "multi_turn":
            row["initial_config"] = e.get("initial_config", {})
            row["involved_classes"] = list(e["involved_classes"])
            row["missed_function"] = {str(k): v for k, v in missed.items()}
        if kind != "irrelevance":
            row["ground_truth"] = answers[e["id"]]
        rows.append(row)
    return tuple(rows)


def load_category(category: str, split: str = "all") -> list[dict[str, Any]]:
    """The task rows of one BFCL category: ``split`` ``"all"`` (the leaderboard's set), ``"train"`` or ``"test"``.

    A row: ``id`` (BFCL's entry id), ``category``, ``kind`` (``ast`` / ``irrelevance`` / ``multi_turn``),
    ``split``, ``question`` (BFCL's list of turns, each a list of chat messages), ``functions`` (BFCL's docs, dotted
    names, without the language hints: what BFCL's checker reads), ``tools`` (the specs shown to the model), ``name_map`` (tool name -> BFCL name), ``ground_truth`` (AST:
    BFCL's possible answers; multi-turn: the call strings per turn); multi-turn rows also ``initial_config``,
    ``involved_classes`` and ``missed_function`` (turn -> the function docs revealed at that turn).
    """
    if split not in ("all", "train", "test"):
        raise ValueError(f"split must be 'all', 'train' or 'test', got {split!r}")
    rows = _load(category)
    return [copy.deepcopy(r) for r in rows if split == "all" or r["split"] == split]


def dumps_functions(tools: list[dict[str, Any]]) -> str:
    """The JSON text of tool specs shown in a message (the functions a multi-turn turn reveals)."""
    return json.dumps([t["function"] for t in tools], ensure_ascii=False)
