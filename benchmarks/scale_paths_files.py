"""The scale curve's sections that write files: packing (LMDB, tar), ``nfs_cache`` staging, ``dsanalyzer profile``.

Part of :mod:`scale_paths` (which lists every section), with the helpers every section shares. Staging and
profiling first write ``n`` tiny files (``scale_memory.make_tiny_tree``: 16 bytes each, about 1,000 per class
folder as in ImageNet), which at 10^6 takes minutes and ~4 GB of disk blocks.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import runpy
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from scale_memory import make_tiny_tree

__all__ = ["Metrics", "packed", "nfs_staging", "dsanalyzer_profile", "tiny_tree", "tiny_item", "TinySource"]

Metrics = dict[str, float | int | str]
ITEM_BYTES = 16
BATCH = 256
TREE_ROOT_ENV = "SCALE_TREE_ROOT"  # where the file trees are kept between runs (see tiny_tree)
LOOKUPS = 200_000  # random lookups timed per section: enough for a stable per-item figure, bounded at any n
REPO = Path(__file__).resolve().parents[1]
KILL_AT = 0.5  # the interrupted staging run is killed once this fraction of the files is staged


def tiny_item(index: int) -> bytes:
    """Item ``index``'s 16 bytes (its index, little-endian: a read-back names the item it came from)."""
    return index.to_bytes(ITEM_BYTES, "little")


def sample_indices(n: int, k: int = LOOKUPS, seed: int = 0) -> list[int]:
    """``k`` random item indices of ``0 .. n-1`` (repeats allowed), seeded: the same work at any ``n``."""
    return np.random.default_rng(seed).integers(0, n, size=k).tolist()


@contextlib.contextmanager
def traced_bytes() -> Iterator[list[int]]:
    """Python and NumPy bytes allocated inside the block that are still held at its end: ``[bytes]``."""
    out = [0]
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    try:
        yield out
    finally:
        out[0] = tracemalloc.get_traced_memory()[0] - before
        if not was:
            tracemalloc.stop()


# -- LMDB and tar packing -----------------------------------------------------------------------------


class TinySource:
    """An item source of ``n`` 16-byte items with labels, held by nothing: what ``coordl pack`` reads."""

    classes = [f"c{c}" for c in range(10)]

    def __init__(self, n: int) -> None:
        self.n = n
        self.targets = (np.arange(n) % 10).tolist()

    def __len__(self) -> int:
        return self.n

    def fetch(self, index: int) -> bytes:
        return tiny_item(index)


def _dir_bytes(path: Path) -> tuple[int, int]:
    """(files, bytes allocated on disk) under ``path``."""
    files = alloc = 0
    for root, _, names in os.walk(path):
        for name in names:
            files += 1
            alloc += os.stat(os.path.join(root, name)).st_blocks * 512
    return files, alloc


def _read_back(open_ds: Callable[[], Any], n: int, prefix: str) -> Metrics:
    """Open a packed dataset (time, bytes its index holds), then read random items (rate)."""
    open_ds().close()  # the first open imports what the reader loads lazily: not the index's cost
    t0 = time.perf_counter()
    open_ds().close()
    open_s = time.perf_counter() - t0
    with traced_bytes() as held:  # opened again: tracing slows allocations down, so it is not timed
        ds = open_ds()
    try:
        lookups = sample_indices(n)
        t0 = time.perf_counter()
        for i in lookups:
            ds.fetch(i)
        read_s = time.perf_counter() - t0
        ok = ds.payload(ds.fetch(n - 1), n - 1) if hasattr(ds, "payload") else ds.fetch(n - 1)
        assert bytes(ok) == tiny_item(n - 1), f"{prefix}: item {n - 1} read back wrong"
    finally:
        ds.close()
    return {
        f"{prefix}_open_s": open_s,
        f"{prefix}_open_s_per_item": open_s / n,
        f"{prefix}_index_bytes": held[0],
        f"{prefix}_index_bytes_per_item": held[0] / n,
        f"{prefix}_read_items_per_s": len(lookups) / read_s,
    }


@contextlib.contextmanager
def _timed(owner: Any, name: str) -> Iterator[list[float]]:
    """CPU seconds (this process's, system time included) of every call of ``owner.name`` while inside (the
    function is wrapped, then put back): steadier than wall time on a shared host, where a process waits."""
    real = getattr(owner, name)
    seconds: list[float] = []

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.process_time()
        try:
            return real(*args, **kwargs)
        finally:
            seconds.append(time.process_time() - t0)

    setattr(owner, name, timed)
    try:
        yield seconds
    finally:
        setattr(owner, name, real)


@contextlib.contextmanager
def _state_writes() -> Iterator[list[int]]:
    """The size of every file a tar pack writes to its resume state (:mod:`coordl.packing.tarstate`)."""
    from coordl.packing import tarstate

    sizes: list[int] = []
    real = tarstate.write_json

    def counted(path: str, doc: dict) -> None:
        real(path, doc)
        sizes.append(os.path.getsize(path))

    tarstate.write_json = counted
    try:
        yield sizes
    finally:
        tarstate.write_json = real


def packed(n: int, work: Path) -> Metrics:
    """``coordl pack`` of ``n`` tiny items into LMDB and into tar shards, and reading each back.

    ``*_pack_s`` is the whole ``pack()`` call: writing, then reading every record back to check it (as the
    command does). Then each is opened as a user opens it (``LMDBDataset``, ``TarShards``): the time, the
    Python/NumPy bytes the opened dataset holds (its index), and random reads.
    """
    from coordl.packed.lmdb import LMDBDataset
    from coordl.packed.tar import TarShards
    from coordl.packing.pack import pack

    source = TinySource(n)
    out: Metrics = {"items": n}
    for fmt in ("lmdb", "tar"):
        dst = work / fmt
        with _state_writes() as state_bytes:
            t0, c0 = time.perf_counter(), time.process_time()
            result = pack(source, dst, fmt, progress=False)
            pack_s, pack_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        if not result.ok:
            raise RuntimeError(f"pack {fmt} of {n} items failed its read-back: {result.mismatches[:3]}")
        files, alloc = _dir_bytes(dst)
        out.update({
            f"{fmt}_pack_s": pack_s,
            f"{fmt}_pack_s_per_item": pack_s / n,
            f"{fmt}_pack_cpu_s_per_item": pack_cpu_s / n,  # this process's CPU: apart from waits for the disk
            f"{fmt}_files": files,
            f"{fmt}_disk_bytes": alloc,
            f"{fmt}_disk_bytes_per_item": alloc / n,
        })  # fmt: skip
        if fmt == "tar":  # the resume state: each shard's record written once, flat per shard
            shards = sum(1 for name in os.listdir(dst) if name.endswith(".tar"))
            out.update({
                "tar_shards": shards,
                "tar_state_bytes_written": sum(state_bytes),
                "tar_state_bytes_written_per_shard": sum(state_bytes) / shards,
                "tar_state_writes": len(state_bytes),
            })  # fmt: skip
        if fmt == "lmdb":
            out.update(_read_back(functools.partial(LMDBDataset, dst), n, fmt))
        else:
            out.update(_read_back(functools.partial(TarShards, result.pattern, extensions=("bin",)), n, fmt))
    return out


def tiny_tree(work: Path, n: int) -> tuple[Path, float]:
    """``n`` files of 16 bytes in 10 to 1,000 folders: (their root, the seconds it took to write them).

    Under ``work`` by default (deleted with it by the caller). With ``SCALE_TREE_ROOT`` set, the tree is
    ``$SCALE_TREE_ROOT/tiny-<n>``, written once and reused by later runs (0 s), the same tree as
    ``bench_scale.py --root $SCALE_TREE_ROOT`` makes for its own sections: on a disk mounted with
    ``discard`` an unlink costs milliseconds (3-4 ms per file measured here), an hour for 10^6 files.
    Both sections only read the tree.
    """
    shared = os.environ.get(TREE_ROOT_ENV)
    root = Path(shared) / f"tiny-{n}" if shared else work / "tiny"
    t0 = time.perf_counter()
    make_tiny_tree(str(root), n, classes=min(1000, max(10, n // 1000)), size_bytes=16)  # as bench_scale.py's
    os.sync()  # written back now: what is timed later (an fdatasync per file, a cold read) finds no dirty page
    return root, time.perf_counter() - t0


def _manifest_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


_STAGE_CHILD = (
    "import sys; from nfs_cache import stage_all; stage_all(sys.argv[1], sys.argv[2], progress=False)"
)


def _manifest_bytes(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _interrupted_stage(src: Path, dst: Path, n: int) -> tuple[float, int]:
    """Stage ``src`` into ``dst`` in a child (``coordl stage``'s function) and ``kill -9`` it once
    :data:`KILL_AT` of the files are in the manifest: (seconds it ran, files staged when killed).

    Polled every 2 ms by the manifest's size (the records' mean length times the files wanted; lines counted
    only near it): cheap at any ``n``, and fine enough to stop a fast machine's 1,000 files half-way."""
    manifest = dst / ".coordl" / "manifest.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", _STAGE_CHILD, str(src), str(dst)], env=env)
    wanted, target = KILL_AT * n, 0
    try:
        while child.poll() is None:
            size = _manifest_bytes(manifest)
            if size and not target:
                with open(manifest, "rb") as f:
                    target = int(wanted * len(f.readline()))
            if target and size >= target:
                lines = _manifest_lines(manifest)  # records differ in length: aim again from the mean one
                if lines >= wanted:
                    break
                target = int(size * wanted / max(1, lines))
            time.sleep(0.002)
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
        child.wait()
    return time.perf_counter() - t0, _manifest_lines(manifest)


def nfs_staging(n: int, work: Path) -> Metrics:
    """``nfs_cache`` staging of ``n`` tiny files from a local "remote" directory (``stage_all``, what
    ``coordl stage SRC DST`` runs; no NFS server: the per-file bookkeeping is what is measured).

    A stage killed (``SIGKILL``) half-way, then run again to the end: the rerun's start-up (listing the
    source, reading the manifest, finding what is left), its copy rate, how many files it copied (ideally
    exactly those not staged before the kill), and the manifest and listing it leaves.
    """
    from nfs_cache import stage_all
    from nfs_cache.layout import StageLayout

    src, make_s = tiny_tree(work, n)
    dst = work / "stage"
    killed_s, staged_before_kill = _interrupted_stage(src, dst, n)
    import nfs_cache.sources
    import nfs_cache.stager

    with (
        _timed(nfs_cache.sources.LocalSource, "list_files") as listing_s,
        _timed(nfs_cache.stager, "forget_changed") as forget_s,
    ):
        t0 = time.perf_counter()
        resumed = stage_all(src, dst, progress=False)
        resume_s = time.perf_counter() - t0
    files = int(resumed["files"])  # n and the tree's marker file
    copied = int(resumed["staged_files"])
    if resumed["already_files"] + copied != files or resumed["unstaged_files"]:
        raise RuntimeError(
            f"nfs_staging at n={n}: {staged_before_kill} staged before the kill, then {resumed}"
        )
    copy_s = float(resumed["seconds"])  # stage_all's own clock: the copy loop, after listing and manifest
    layout = StageLayout(str(dst))
    manifest_bytes = os.path.getsize(layout.manifest)
    return {
        "items": n,
        "make_tree_s": make_s,
        "killed_after_s": killed_s,
        "staged_before_kill": staged_before_kill,
        "resume_s": resume_s,
        "resume_startup_s": resume_s - copy_s,
        "resume_startup_s_per_item": (resume_s - copy_s) / n,
        # two of the start-up's parts, in CPU time: the source's listing (a walk and a stat per file: the file
        # system's cost), and the check of every staged copy against it (forget_changed: every listed name)
        "resume_listing_cpu_s_per_item": sum(listing_s) / n,
        "resume_forget_changed_cpu_s_per_item": sum(forget_s) / n,
        "resume_already_files": int(resumed["already_files"]),
        "resume_copied_files": copied,
        "resume_recopied_files": copied - (files - staged_before_kill),  # staged once already: ideally 0
        "stage_files_per_s": copied / copy_s if copy_s > 0 else 0.0,
        "stage_s_per_item": copy_s / max(1, copied),
        "manifest_bytes": manifest_bytes,
        "manifest_bytes_per_item": manifest_bytes / n,
        "listing_bytes": os.path.getsize(layout.listing_file),
        "index_bytes": os.path.getsize(
            os.path.join(layout.meta, "index.bin")
        ),  # shared by the node's processes
        "index_bytes_per_item": os.path.getsize(os.path.join(layout.meta, "index.bin")) / n,
    }


_JOB = '''
"""A plain torch job over tiny files: a Dataset listing its files, torch's DataLoader, a trivial step."""
import os, sys
import torch


class TinyFiles(torch.utils.data.Dataset):
    def __init__(self, root):
        self.files = sorted(e.path for d in os.scandir(root) if d.is_dir() for e in os.scandir(d.path))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        with open(self.files[i], "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)


if __name__ == "__main__":
    loader = torch.utils.data.DataLoader(TinyFiles(sys.argv[1]), batch_size=256, shuffle=True, num_workers=2)
    for epoch in range(10**6):
        for batch in loader:
            batch.float().sum()
'''


def _largest_parts(doc: dict) -> str:
    """The three largest top-level parts of a report, ``key=bytes`` (what its size is made of)."""
    sizes = sorted(((len(json.dumps(v)), k) for k, v in doc.items()), reverse=True)[:3]
    return ",".join(f"{k}={size}" for size, k in sizes)


def dsanalyzer_profile(n: int, work: Path) -> Metrics:
    """``dsanalyzer profile`` of a plain torch job over ``n`` tiny files, bounded to 2 warm-up and 20
    measured iterations per run (batches of 256, 2 workers): what the profile's own time and report
    do as the dataset grows while the work per run does not.

    ``job_build_s`` is the job's own dataset construction (listing ``n`` files), which each of the
    profile's four runs repeats: it grows with ``n`` whatever the profiler does.
    """
    data, make_s = tiny_tree(work, n)
    script = work / "train_tiny.py"
    script.write_text(_JOB)
    job = runpy.run_path(str(script), run_name="train_tiny")  # the job's own dataset, timed apart
    t0 = time.perf_counter()
    listed = len(job["TinyFiles"](str(data)))
    build_s = time.perf_counter() - t0
    out = work / "profile"
    cmd = [str(REPO / ".venv" / "bin" / "dsanalyzer"), "profile", "--iters", "20", "--warmup", "2",
           "--out", str(out), "--quiet", "--", sys.executable, str(script), str(data)]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    profile_s = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"dsanalyzer profile at n={n} exited {proc.returncode}: {proc.stderr[-2000:]}")
    report = out / "report.json"
    doc = json.loads(report.read_text())
    out_bytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {
        "items": n,
        "listed_items": listed,
        "make_tree_s": make_s,
        "job_build_s": build_s,
        "profile_s": profile_s,
        "profile_s_per_item": profile_s / n,
        "report_json_bytes": report.stat().st_size,
        "report_html_bytes": (out / "report.html").stat().st_size,
        "out_dir_bytes": out_bytes,
        "report_dataset_items": int((doc.get("dataset") or {}).get("items") or 0),
        "report_largest_parts": _largest_parts(doc),
        "bound": str(doc.get("bound", "")),
    }
