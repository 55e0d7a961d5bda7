"""NFS staging vs reading NFS every epoch, over a throttled link (nfs-ganesha in a netns behind tc tbf).

    .venv/bin/python benchmarks/bench_nfs.py [--files 400 --size-kb 110 --rate 100mbit --runs 3]

Per run, in the same session and against the same server:
  * raw link: one large file read through libnfs (the NFS link's raw read throughput);
  * baseline: every epoch reads each item from NFS (shuffled order), as a loader without staging does;
  * read-through: ``StagedSource``: epoch 1 copies each item to local disk as it is read, epoch 2 reads local
    (page cache of the staged files dropped first, so epoch 2 is a cold local-disk read);
  * ``stage_all`` (``coordl stage``) ahead of time with 1, 2 and 4 copy processes.
Prints medians over the runs and the ratios. Needs root, nfs-ganesha and libnfs (scripts/setup.sh).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.support

from nfs_cache import NfsSource, StagedSource, stage_all
from tests.support.ganesha import GaneshaServer, ganesha_missing_reason

STAGE_WORKERS = (1, 2, 4)


def make_dataset(root: str, files: int, size_kb: int) -> list[str]:
    rng = random.Random(0)
    rels = []
    for i in range(files):
        rel = f"class{i % 10}/img{i:05d}.jpg"
        os.makedirs(os.path.join(root, "train", os.path.dirname(rel)), exist_ok=True)
        size = int(size_kb * 1024 * rng.uniform(0.5, 1.5))  # ImageNet-like spread around the mean
        with open(os.path.join(root, "train", rel), "wb") as f:
            f.write(os.urandom(size))
        rels.append(rel)
    with open(os.path.join(root, "big.bin"), "wb") as f:  # beside train/, for the raw link rate
        f.write(os.urandom(32 << 20))
    return rels


def epoch(read, rels: list[str], seed: int) -> tuple[float, int]:
    order = list(rels)
    random.Random(seed).shuffle(order)
    start = time.perf_counter()
    nbytes = sum(len(read(r)) for r in order)
    return time.perf_counter() - start, nbytes


def drop_page_cache(directory: str) -> None:
    for dirpath, _dirs, names in os.walk(directory):
        for name in names:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def one_run(server: GaneshaServer, rels: list[str], work: str, run: int) -> dict[str, float]:
    n = len(rels)
    out: dict[str, float] = {}
    src = NfsSource(server.url())
    start = time.perf_counter()
    big = len(src.read("big.bin"))
    out["raw_mb_s"] = big / 1e6 / (time.perf_counter() - start)
    src.close()
    url = server.url("train")
    src = NfsSource(url)

    for ep in (1, 2):
        secs, nbytes = epoch(src.read, rels, seed=run * 10 + ep)
        out[f"base_e{ep}"] = n / secs
        out[f"base_e{ep}_mb_s"] = nbytes / 1e6 / secs
    src.close()

    stage = os.path.join(work, f"stage{run}")
    with StagedSource(url, stage) as staged:
        staged.list_files()
        secs, nbytes = epoch(staged.read, rels, seed=run * 10 + 1)
        out["staged_e1"] = n / secs
        out["staged_e1_mb_s"] = nbytes / 1e6 / secs
        drop_page_cache(os.path.join(stage, "files"))
        secs, _ = epoch(staged.read, rels, seed=run * 10 + 2)
        out["staged_e2"] = n / secs
    shutil.rmtree(stage)

    for workers in STAGE_WORKERS:
        ahead = os.path.join(work, f"ahead{run}-{workers}")
        summary = stage_all(url, ahead, progress=False, workers=workers)
        out[f"stage_all_w{workers}_mb_s"] = summary["mb_per_s"]
        shutil.rmtree(ahead)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--size-kb", type=int, default=110, help="mean file size (ImageNet JPEGs: ~110 KB)")
    parser.add_argument("--rate", default="100mbit", help="tc tbf rate of the NFS link")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    reason = ganesha_missing_reason(netns=True)
    if reason:
        print(f"bench_nfs: cannot run: {reason}", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="bench-nfs-")
    try:
        export = os.path.join(work, "export")
        rels = make_dataset(export, args.files, args.size_kb)
        total_mb = sum(os.path.getsize(os.path.join(export, "train", r)) for r in rels) / 1e6
        print(f"dataset: {len(rels)} files, {total_mb:.1f} MB; link: tc tbf {args.rate}; runs: {args.runs}")
        results = []
        with GaneshaServer(export, netns=True, rate=args.rate, tag="nfsb") as server:
            for run in range(args.runs):
                results.append(one_run(server, rels, work, run))
                print(f"  run {run + 1}: " + ", ".join(f"{k}={v:.1f}" for k, v in results[-1].items()))
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        raw = med["raw_mb_s"]
        print()
        print(f"{'':28} {'epoch 1 samples/s':>18} {'epoch 2 samples/s':>18}")
        print(f"{'NFS every epoch (baseline)':28} {med['base_e1']:18.1f} {med['base_e2']:18.1f}")
        print(f"{'nfs_cache read-through':28} {med['staged_e1']:18.1f} {med['staged_e2']:18.1f}")
        print(
            f"{'ratio (read-through/base)':28} {med['staged_e1'] / med['base_e1']:17.2f}x "
            f"{med['staged_e2'] / med['base_e2']:17.2f}x"
        )
        print()
        print(f"raw NFS link read (32 MB file):        {raw:8.1f} MB/s")
        print(
            f"baseline epoch over NFS:               {med['base_e1_mb_s']:8.1f} MB/s ({med['base_e1_mb_s'] / raw:.0%} of raw)"
        )
        print(
            f"read-through epoch 1 (staging):        {med['staged_e1_mb_s']:8.1f} MB/s ({med['staged_e1_mb_s'] / raw:.0%} of raw)"
        )
        for w in STAGE_WORKERS:
            mb_s = med[f"stage_all_w{w}_mb_s"]
            print(f"coordl stage --workers {w}:              {mb_s:8.1f} MB/s ({mb_s / raw:.0%} of raw)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
