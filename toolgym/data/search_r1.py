"""Loading Search-R1's data files from local paths (nothing is downloaded).

* QA sets (:func:`load_qa`): Search-R1's ``train.parquet`` / ``test.parquet`` (from ``scripts/data_process/
  qa_search_*.py``; FlashRAG's NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, Musique, Bamboogle) or any JSONL / JSON /
  parquet with ``question`` and ``golden_answers`` columns. Rows that only carry Search-R1's
  ``reward_model.ground_truth.target`` get their gold answers from there.
* Corpora (:func:`load_corpus`): ``wiki-18.jsonl`` style JSONL, one ``{"id": ..., "contents": '"Title"\\ntext'}``
  per line (``{"id", "title", "text"}`` is accepted too).

Parquet needs ``pyarrow`` (or ``datasets``), both in the ``train`` extra; they are imported only when a parquet
file is read, with a clear error when missing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolgym.jsonl import iter_jsonl
from toolgym.tools.search import Passage

__all__ = ["load_corpus", "load_qa", "normalize_qa_row"]


def _plain(x: Any) -> Any:
    """numpy arrays / scalars (as parquet readers hand out) -> Python lists / scalars, recursively."""
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        try:
            import datasets
        except ImportError as e:
            raise ImportError(
                f"reading {path} needs pyarrow or datasets: pip install 'toolgym[train]' (or pyarrow)"
            ) from e
        ds = datasets.Dataset.from_parquet(str(path))
        return [dict(r) for r in ds]
    return pq.read_table(path).to_pylist()


def normalize_qa_row(row: Mapping[str, Any], index: int, source: str = "") -> dict[str, Any]:
    """One QA row in toolgym's form: ``id`` (str), ``question`` (str), ``golden_answers`` (list of str),
    ``hops`` (``None`` when unknown), ``data_source``; other columns are kept (``prompt`` is dropped: the env
    builds its own prompt)."""
    r = _plain(dict(row))
    q = r.get("question")
    if not isinstance(q, str) or not q.strip():
        raise ValueError(f"{source} row {index}: no 'question' string (columns: {sorted(r)})")
    golds = r.get("golden_answers")
    if golds is None:
        golds = (((r.get("reward_model") or {}).get("ground_truth") or {}).get("target")) or r.get("answer")
    if golds is None:
        raise ValueError(f"{source} row {index}: no 'golden_answers' (columns: {sorted(r)})")
    if isinstance(golds, (str, int, float)):
        golds = [golds]
    r.pop("prompt", None)
    r["question"] = q.strip()
    r["golden_answers"] = [str(g) for g in golds]
    r["id"] = str(r["id"]) if r.get("id") is not None else f"{source or 'qa'}-{index}"
    r.setdefault("hops", None)
    r.setdefault("data_source", source)
    return r


def load_qa(path: str | os.PathLike[str], *, limit: int | None = None) -> list[dict[str, Any]]:
    """QA rows from a ``.parquet``, ``.jsonl`` or ``.json`` (a list of rows) file; see :func:`normalize_qa_row`.

    Args:
        path: local file.
        limit: keep the first ``limit`` rows.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"QA file not found: {p}")
    suffix = "".join(p.suffixes[-2:]) if p.suffix == ".gz" else p.suffix
    if suffix == ".parquet":
        rows = _read_parquet(p)
    elif suffix == ".jsonl":
        rows = [r for _, r in iter_jsonl(p, objects=False)]
    elif suffix == ".json":
        rows = json.loads(p.read_text(encoding="utf-8"))
        if isinstance(rows, Mapping):
            rows = rows.get("data") or rows.get("rows") or []
    else:
        raise ValueError(f"unsupported QA file type {p.suffix!r} (use .parquet, .jsonl or .json)")
    if limit is not None:
        rows = rows[:limit]
    return [normalize_qa_row(r, i, p.stem) for i, r in enumerate(rows)]


def load_corpus(path: str | os.PathLike[str], *, limit: int | None = None) -> list[Passage]:
    """Passages from a Search-R1 corpus JSONL (``{"id", "contents"}`` per line, first line of ``contents`` the
    quoted title; ``{"id", "title", "text"}`` also accepted). ``limit`` keeps the first N lines."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"corpus file not found: {p}")
    out: list[Passage] = []
    for n, row in iter_jsonl(p, objects=False):
        if limit is not None and len(out) >= limit:
            break
        try:
            out.append(Passage.from_dict(row, default_id=str(n - 1)))
        except ValueError as e:
            raise ValueError(f"{p}:{n}: {e}") from e
    if not out:
        raise ValueError(f"corpus {p} has no passages")
    return out
