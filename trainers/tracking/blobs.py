"""A registered version's files stored by content: each distinct file's bytes are kept once, however many versions
share them.

A local artifact store (the embedded ``runs/mlartifacts``, a ``file:`` store) keeps every file of a version under
``<artifact location>/blobs/sha256/<2 hex>/<64 hex>``, named by the SHA-256 of its bytes, and the version's
``model/`` directory holds hard links to those blobs: registering the same weights again, or a version that shares
its tokenizer and config with another, adds directory entries, not bytes. The version's directory stays an ordinary
model directory (MLflow's own clients and ``transformers`` load it as it is) and does not depend on the checkpoint
it came from: deleting or overwriting that directory changes nothing in the registry (the blob is a copy, never a
link to the source). Blobs are read-only (mode 0444), so writing into a version's directory fails instead of
changing every version that shares the file. Where a hard link cannot be made (a file system without them, a file
at the link limit) the blob is copied instead: correct, without the saving.

A *manifest* (``model_manifest.json`` beside ``model/`` in the registration run) lists each file's path, size and
SHA-256. :func:`verify` checks a version's directory against it before anything loads it, so damaged bytes (a
changed blob, a file truncated or removed in the store) are a :class:`RegistryIntegrityError` (exit 3) naming the
file, never a model with silently different weights. Registering the same files again repairs a damaged blob in
place, which repairs every version that links to it.

:func:`disk_usage` measures a directory's bytes on disk with each hard-linked file counted once (what ``du``
reports), the figure docs/registry.md states for a registration.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from toolgym.errors import ExitCode
from toolgym.weights import weight_files
from trainers.tracking.evidence import RegistryError

__all__ = ["MANIFEST", "RegistryIntegrityError", "blob_root", "disk_usage", "file_sha256", "local_dir", "manifest",
           "store_files", "verify"]

MANIFEST = "model_manifest.json"
"""The registration run's artifact that lists a version's files: ``{"format", "files": [{"path", "size",
"sha256"}]}``."""

FORMAT = "toolgym.model-files/1"

_BLOCK = 1 << 20


class RegistryIntegrityError(RegistryError):
    """A registered version whose stored files are not the ones registered (changed, truncated or missing): exit
    code 3; the message names the file and the version."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.INPUT)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def local_dir(uri: str) -> Path | None:
    """The local directory of an artifact URI (``file://...`` or a plain absolute path); ``None`` for a remote
    artifact store (``mlflow-artifacts:``, ``s3://``, ...)."""
    if uri.startswith("file:"):
        return Path(unquote(urlparse(uri).path))
    if uri.startswith("/"):
        return Path(uri)
    return None


def blob_root(artifact_location: str | os.PathLike[str]) -> Path:
    """Where the blobs of an experiment's artifact location live: ``<location>/blobs/sha256``."""
    return Path(artifact_location) / "blobs" / "sha256"


def manifest(files: Iterable[Path], root: Path) -> dict[str, Any]:
    """The manifest of ``files`` (paths under ``root``): each relative path, size in bytes and SHA-256."""
    entries = [{"path": f.relative_to(root).as_posix(), "size": f.stat().st_size, "sha256": file_sha256(f)}
               for f in files]
    return {"format": FORMAT, "files": sorted(entries, key=lambda e: e["path"])}


def _blob_path(blobs: Path, sha: str) -> Path:
    return blobs / sha[:2] / sha


def _write_blob(src: Path, blob: Path, sha: str) -> None:
    """Put ``src``'s bytes at ``blob`` (read-only), checking they hash to ``sha`` (the source may change under us).
    A blob that exists with other bytes (damaged) is rewritten in place, which repairs every link to it."""
    blob.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{sha[:12]}.", suffix=".part", dir=blob.parent)
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, open(src, "rb") as f:
            while block := f.read(_BLOCK):
                h.update(block)
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != sha:
            raise RegistryError(f"{src}: changed while it was being registered (its SHA-256 is no longer "
                                f"{sha[:12]}...); register it again once it is written", ExitCode.INPUT)
        if blob.exists():  # damaged (the caller checked): repair the inode every version links to
            blob.chmod(0o644)
            with open(tmp, "rb") as f, open(blob, "r+b") as out:
                shutil.copyfileobj(f, out, _BLOCK)
                out.truncate()
                out.flush()
                os.fsync(out.fileno())
        else:
            tmp.chmod(0o444)
            os.replace(tmp, blob)  # another process storing the same bytes at once writes the same content
        blob.chmod(0o444)
    finally:
        tmp.unlink(missing_ok=True)


def _intact(blob: Path, size: int, sha: str) -> bool:
    try:
        return blob.stat().st_size == size and file_sha256(blob) == sha
    except OSError:
        return False


def store_files(files: Sequence[Path], root: Path, dest: Path, blobs: Path) -> dict[str, Any]:
    """Place ``files`` (under ``root``) at the same relative paths under ``dest``, by content: each one's bytes go
    to ``blobs`` once (a blob already there with the right bytes is reused; a damaged one is repaired) and ``dest``
    gets a hard link to the blob (a copy where no link can be made). Returns the files' manifest
    (:func:`manifest`)."""
    man = manifest(files, root)
    for entry in man["files"]:
        blob = _blob_path(blobs, entry["sha256"])
        if not _intact(blob, entry["size"], entry["sha256"]):
            _write_blob(root / entry["path"], blob, entry["sha256"])
        target = dest / entry["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        try:
            os.link(blob, target)
        except OSError:  # no hard links here (or the link limit): a copy, correct without the saving
            shutil.copyfile(blob, target)
    return man


def verify(directory: str | os.PathLike[str], recorded: Mapping[str, Any], what: str) -> None:
    """Check a version's directory against its manifest: every recorded file present with its size and SHA-256,
    and no weight file that the manifest does not list.

    Raises:
        RegistryIntegrityError (exit 3): the first file that differs, named with ``what`` (e.g. ``models:/m/2``).
    """
    d = Path(directory)
    listed = {e["path"] for e in recorded.get("files", [])}
    fix = "register the checkpoint again to repair the stored copy, or register another one"
    for entry in recorded.get("files", []):
        f = d / entry["path"]
        try:
            st = f.stat()
        except OSError:
            raise RegistryIntegrityError(f"{what}: its file {entry['path']} is missing from the registry's copy "
                                         f"{d} ({fix})") from None
        if not stat.S_ISREG(st.st_mode) or st.st_size != entry["size"]:
            raise RegistryIntegrityError(f"{what}: its file {entry['path']} in {d} has {st.st_size} bytes, "
                                         f"{entry['size']} were registered: the stored copy is damaged ({fix})")
        got = file_sha256(f)
        if got != entry["sha256"]:
            raise RegistryIntegrityError(f"{what}: its file {entry['path']} in {d} has SHA-256 {got[:12]}..., "
                                         f"{entry['sha256'][:12]}... was registered: the stored copy is damaged "
                                         f"({fix})")
    extra = [p.relative_to(d).as_posix() for p in weight_files(d) if p.relative_to(d).as_posix() not in listed]
    if extra:
        raise RegistryIntegrityError(f"{what}: {d} holds weight files that were not registered ({', '.join(extra)}); "
                                     f"a registered version's directory must not be written into")


def disk_usage(path: str | os.PathLike[str]) -> int:
    """Bytes on disk under ``path`` (allocated blocks of its files and directories), each file counted once however
    many hard links it has: what ``du -s --block-size=1`` reports."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _dirs, names in os.walk(path):
        for p in (dirpath, *(os.path.join(dirpath, n) for n in names)):
            with contextlib.suppress(OSError):
                st = os.lstat(p)
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total
