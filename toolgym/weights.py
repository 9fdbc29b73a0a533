"""A checkpoint's weight files: which they are, whether they are whole, and a content hash that names them.

``toolgym eval`` (before it loads a model directory) and ``toolgym registry register`` (before it uploads one) call
:func:`check_weights`: a truncated or empty weights file is one line naming the file, exit 3, instead of a load
error deep in transformers (exit 1) or a registered version nobody can load. The checks read headers (and the small
JSON files) only:

* ``*.safetensors``: the 8-byte header length and the JSON header fit in the file, and every tensor's
  ``data_offsets`` end within it;
* ``*.index.json`` (sharded): every shard it names exists beside it and passes its own check;
* ``*.bin`` (torch): not empty; a zip archive (torch's format since 1.6) has its central directory, an older
  pickle starts with the pickle opcode;
* the JSON files transformers reads with the weights (:data:`CONFIG_FILES`: ``config.json``, the tokenizer's):
  where present, each parses as a JSON object.

:func:`weights_hash` is the SHA-256 over the sorted weight files' names and bytes (streamed): ``toolgym eval
--json`` records it as what it evaluated, and the registry refuses an evaluation whose hash is not the
checkpoint's.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zipfile
from pathlib import Path

from toolgym.errors import CLIError, ExitCode

__all__ = ["CONFIG_FILES", "WEIGHT_FILES", "WeightsError", "check_weights", "weight_files", "weights_hash"]

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json", "adapter_model.safetensors", "adapter_model.bin")
"""The weight files a model (or adapter) directory may hold, in the order transformers looks for them."""

CONFIG_FILES = ("config.json", "generation_config.json", "adapter_config.json", "tokenizer_config.json",
                "tokenizer.json", "special_tokens_map.json")
"""The JSON files beside the weights that loading a model directory reads, where present."""

_MAX_HEADER = 100_000_000  # the safetensors library's own limit on the JSON header


class WeightsError(CLIError):
    """A damaged or missing weights file: exit code 3; the message names the file."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.INPUT)


def _check_safetensors(path: Path) -> None:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightsError(f"{path}: truncated safetensors file ({size} bytes, not even its header length)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise WeightsError(f"{path}: truncated safetensors file ({size} bytes; its header alone needs {8 + n})")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise WeightsError(f"{path}: damaged safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: damaged safetensors header (not an object)")
    data = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(x, int) for x in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise WeightsError(f"{path}: damaged safetensors header (tensor {name!r} has no valid data_offsets)")
        if offsets[1] > data:
            raise WeightsError(f"{path}: truncated safetensors file (tensor {name!r} ends at byte "
                               f"{8 + n + offsets[1]}, the file has {size})")


def _check_bin(path: Path) -> None:
    if path.stat().st_size == 0:
        raise WeightsError(f"{path}: empty weights file")
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                z.infolist()
        except (zipfile.BadZipFile, OSError) as e:
            raise WeightsError(f"{path}: damaged torch weights file ({e})") from None
        return
    with path.open("rb") as f:
        if f.read(1) != b"\x80":
            raise WeightsError(f"{path}: damaged torch weights file (neither a zip archive nor a pickle)")


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise WeightsError(f"{path}: missing weights file")
    try:
        (_check_safetensors if path.suffix == ".safetensors" else _check_bin)(path)
    except OSError as e:
        raise WeightsError(f"{path}: unreadable weights file: {e.strerror or e}") from None


def _shards(index: Path) -> list[Path]:
    try:
        data = json.loads(index.read_text())
        names = sorted(set(data["weight_map"].values()))
    except OSError as e:
        raise WeightsError(f"{index}: unreadable weights index: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise WeightsError(f"{index}: damaged weights index (no weight_map of tensor -> shard file)") from None
    if not names or not all(isinstance(n, str) and n and "/" not in n and n not in (".", "..") for n in names):
        raise WeightsError(f"{index}: damaged weights index (bad shard names)")
    return [index.parent / n for n in names]


def weight_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The weight files of a model directory: every :data:`WEIGHT_FILES` entry present, and the shards its index
    files name (sorted, unchecked). Empty when it has none."""
    d = Path(directory)
    out: set[Path] = set()
    for name in WEIGHT_FILES:
        p = d / name
        if p.is_file():
            out.add(p)
            if name.endswith(".index.json"):
                out.update(_shards(p))
    return sorted(out)


def check_weights(directory: str | os.PathLike[str]) -> list[Path]:
    """Check that the weight files of a model directory are whole (see the module docstring); returns them.

    Raises:
        WeightsError (exit 3): no weights file, or one that is missing, truncated, empty or damaged, or a file of
            :data:`CONFIG_FILES` that is not a JSON object (named).
    """
    files = weight_files(directory)
    if not files:
        raise WeightsError(f"{directory}: no model weights ({', '.join(WEIGHT_FILES[:3])}, ...)")
    for f in files:
        if not f.name.endswith(".index.json"):
            _check_file(f)
    for name in CONFIG_FILES:
        _check_json_object(Path(directory) / name)
    return files


def _check_json_object(path: Path) -> None:
    """Nothing when ``path`` is absent or holds a JSON object; else :class:`WeightsError` naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return
    except json.JSONDecodeError as e:
        raise WeightsError(f"{path}: not valid JSON ({e.msg}, line {e.lineno} column {e.colno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise WeightsError(f"{path}: cannot read it ({e})") from None
    if not isinstance(data, dict):
        raise WeightsError(f"{path}: not a JSON object (a {type(data).__name__})")


def weights_hash(directory: str | os.PathLike[str], files: list[Path] | None = None) -> str:
    """SHA-256 (hex) over a model directory's weight files (``files``, default :func:`weight_files`) in name
    order: for each, its name, a NUL, its size (8 bytes) and its bytes, read in 1 MiB blocks."""
    d = Path(directory)
    h = hashlib.sha256()
    for f in sorted(files if files is not None else weight_files(d), key=lambda p: p.relative_to(d).as_posix()):
        h.update(f.relative_to(d).as_posix().encode() + b"\0" + struct.pack("<Q", f.stat().st_size))
        with f.open("rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
    return h.hexdigest()
