"""NVIDIA DALI on the accelerator machine, from the parts that ``scripts/gpu_dali.sh`` makes.

DALI's CUDA wheel and the libraries it loads (256 MB) do not fit the 64 MiB one device call carries, and the
machine has no network. ``scripts/gpu_dali.sh`` packs them as one tar.xz (about 150 MB) split into parts under
``.dali/p0``, ``.dali/p1``, ...; each of consecutive device calls carries one and :func:`stash` copies it
to :data:`STASH` (outside the tree: files there survive while the machine stays warm, 30 s after a call).
The last call runs the check, whose :func:`install` joins the parts, checks their SHA-256 against
``SHA256`` and unpacks them into the interpreter's site-packages, as pip would have: a file already there is
kept (the image's own CUDA libraries and Python packages win), so ``nvidia.dali`` joins the image's
``nvidia`` package and DALI's relative library paths (``nvidia/dali`` -> ``nvidia/nvimgcodec`` ->
``nvidia/cu13/lib``) hold. docs/gpu.md, "DALI in parts".
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
from pathlib import Path

STASH = Path("/tmp/coordl-dali-parts")
NAME = "dali-site.tar.xz"


def stash(tree: Path, stash_dir: Path = STASH) -> str:
    """Copy the parts this call carried (``tree``/p*/) to ``stash_dir``; a line saying what is there now."""
    stash_dir.mkdir(parents=True, exist_ok=True)
    for f in sorted(tree.glob("p*/*")):
        if f.name.startswith(NAME) or f.name == "SHA256":
            shutil.copy(f, stash_dir / f.name)
    return _state(stash_dir)[1]


def _state(stash_dir: Path) -> tuple[list[Path] | None, str]:
    """The parts in order if all are there (else None), and a line saying so."""
    sums = stash_dir / "SHA256"
    have = sorted(stash_dir.glob(NAME + ".*"), key=lambda p: int(p.suffix[1:]))
    if not sums.exists():
        return None, f"no DALI parts in {stash_dir} (scripts/gpu_dali.sh makes them; docs/gpu.md)"
    words = sums.read_text().split()
    n = int(words[2].strip("("))
    names = ", ".join(p.name.rsplit(".", 1)[1] for p in have)
    if len(have) != n:
        return None, f"{len(have)} of {n} DALI parts in {stash_dir} (have: {names or 'none'})"
    return have, f"all {n} DALI parts in {stash_dir} ({sum(p.stat().st_size for p in have) / 1e6:.0f} MB)"


def install(tree: Path, stash_dir: Path = STASH) -> str:
    """Unpack DALI from its parts if it is not importable; a line for the report (what happened, or why not)."""
    if _importable():
        return "nvidia.dali importable (nothing unpacked)"
    stash(tree, stash_dir)
    parts, line = _state(stash_dir)
    if parts is None:
        return line
    t0 = time.monotonic()
    want = (stash_dir / "SHA256").read_text().split()[0]
    digest = hashlib.sha256()
    for p in parts:
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    if digest.hexdigest() != want:
        return f"DALI parts in {stash_dir} do not match their SHA-256 (a part is stale or cut short): not unpacked"
    site = Path(sysconfig.get_paths()["purelib"])
    added = kept = 0
    with _Joined(parts) as stream, tarfile.open(fileobj=stream, mode="r|xz") as tar:
        for member in tar:
            target = site / member.name
            if member.isdir() or (target.exists() and member.isfile()):
                kept += member.isfile()
                continue
            tar.extract(member, site, filter="data")
            added += 1
    ok = _importable()
    return (f"DALI unpacked from {len(parts)} carried parts into {site}: {added} files added, {kept} already "
            f"there kept, {time.monotonic() - t0:.0f} s; nvidia.dali {'imports' if ok else 'still does NOT import'}")  # fmt: skip


def _importable() -> bool:
    code = "import nvidia.dali"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


class _Joined:
    """The parts read as one file, in order (tarfile's stream mode reads it once, front to back)."""

    def __init__(self, parts: list[Path]) -> None:
        self._parts = list(parts)
        self._f = None

    def __enter__(self) -> _Joined:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._f:
            self._f.close()

    def read(self, n: int = -1) -> bytes:
        out = b""
        while n < 0 or len(out) < n:
            if self._f is None:
                if not self._parts:
                    break
                self._f = open(self._parts.pop(0), "rb")  # noqa: SIM115 - closed when exhausted or on exit
            chunk = self._f.read(-1 if n < 0 else n - len(out))
            if not chunk:
                self._f.close()
                self._f = None
                continue
            out += chunk
        return out
