"""One soak job: loops epochs over :mod:`items`, checks every item, logs every batch, checkpoints its loader.

Run by ``soak.py`` (never by hand, but it can be: ``python job.py --kind minio --name a --dir /tmp/x``).
Each incarnation appends to ``<dir>/<name>.jsonl`` one JSON object per line:

- ``{"ev": "start", "run": pid, ...}`` then ``{"ev": "resume", "epoch": e, "step": s}`` (the checkpoint it
  loaded: ``s`` batches of epoch ``e`` were handed out before it);
- ``{"ev": "batch", "epoch": e, "step": s, "ids": [...], "bad": [...], "t": ...}`` (``bad``: ids whose
  bytes did not hash to the item's, and ids that are not items at all);
- ``{"ev": "ckpt", "epoch": e, "step": s}`` after ``<dir>/<name>.ckpt.json`` was replaced (atomically);
- ``{"ev": "epoch_end", "epoch": e, "steps": n}``, ``{"ev": "error", "what": ...}`` (the loader raised: the
  job closes it, builds a new one, loads its last checkpoint and goes on) and ``{"ev": "stop"}``.

The job stops when ``<dir>/STOP`` exists or on SIGTERM. A ``step_s`` sleep per batch stands for the
training step, so the soak's jobs share the host's cores instead of racing for them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from items import Items, SplitItems, StagedItems, expected_hash

import coordl

CKPT_EVERY = 4  # batches between checkpoints
STATS = (
    "sample_cache_hits",
    "sample_cache_misses",
    "sample_cache_errors",
    "remote_hits",
    "remote_errors",
    "storage_items_read",
    "cache_hits",
    "remote_batches",
    "remote_redone_batches",
    "remote_actors",
)  # counted since this loader was built
RAY_START_S = 20.0  # a new loader's wait for its actor (the node may be down): then local prep only
MAX_ERRORS = 500  # a job that keeps failing gives up (the soak reports it)


class Log:
    def __init__(self, path: Path) -> None:
        self.f = open(path, "a", buffering=1)  # noqa: SIM115 (open for the job's life)

    def __call__(self, ev: str, **fields: Any) -> None:
        fields.update(ev=ev, t=round(time.time(), 4))
        self.f.write(json.dumps(fields) + "\n")


def build_loader(args: argparse.Namespace) -> coordl.DataLoader:
    common: dict[str, Any] = dict(batch_size=args.batch, shuffle=True, num_workers=args.workers)
    if args.kind != "coord":  # a coordinated group's order rules; elsewhere a fixed order per seed
        common["generator"] = torch.Generator().manual_seed(args.seed)
    if args.kind == "minio":
        return coordl.DataLoader(Items(args.n, args.prep_s), cache_bytes=1 << 20, **common)
    if args.kind == "sample":
        from memcache import RedisStore

        store = RedisStore(args.redis.split(","), timeout_s=1.0, retry_after_s=3.0)
        return coordl.DataLoader(SplitItems(args.n, args.prep_s), sample_cache=store, **common)
    if args.kind == "coord":
        from coordl.coordinated.job import Group

        group = Group("soak", directory=args.group_dir, timeout_s=60.0)
        return coordl.DataLoader(Items(args.n, args.prep_s), coordinate=group, **common)
    if args.kind == "part":
        return coordl.DataLoader(Items(args.n, args.prep_s), cache_bytes=1 << 20, partitioned=True, **common)
    if args.kind == "ray":  # one local worker and one actor on the Ray prep node (raynodes.py)
        remote = coordl.RemotePrep(args.ray_address, cpus=1, start_timeout=RAY_START_S)
        return coordl.DataLoader(Items(args.n, args.prep_s), remote_prep=remote, **common)
    if args.kind == "nfs":
        return coordl.DataLoader(StagedItems(args.n, args.nfs_url, args.stage_dir, args.prep_s), **common)
    raise SystemExit(f"job.py: unknown --kind {args.kind!r}")


def check(batch: torch.Tensor, n: int) -> tuple[list[int], list[int]]:
    rows = batch.tolist()
    ids = [int(r[0]) for r in rows]
    bad = [i for i, h in rows if not (0 <= i < n) or int(h) != expected_hash(int(i))]
    return ids, bad


class Checkpoint:
    def __init__(self, path: Path, log: Log) -> None:
        self.path, self.log = path, log

    def save(self, loader: coordl.DataLoader, epoch: int, step: int) -> None:
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"epoch": epoch, "step": step, "state": loader.state_dict()}))
        os.replace(tmp, self.path)
        self.log("ckpt", epoch=epoch, step=step)

    def load(self, loader: coordl.DataLoader) -> tuple[int, int]:
        if not self.path.exists():
            return 0, 0
        ck = json.loads(self.path.read_text())
        loader.load_state_dict(ck["state"])
        epoch, step = int(ck["epoch"]), int(ck["step"])
        if step >= len(loader):  # a state taken at the epoch's last batch resumes at the next epoch
            epoch, step = epoch + 1, 0
        self.log("resume", epoch=epoch, step=step)
        return epoch, step


def ray_cpu_free() -> bool:
    """A Ray node offers a free CPU (the killed node is back): a new loader's actor would start at once."""
    import ray

    return ray.is_initialized() and ray.available_resources().get("CPU", 0) >= 1


def run_epochs(loader: coordl.DataLoader, args: argparse.Namespace, ck: Checkpoint, log: Log, stop) -> None:
    epoch, step = ck.load(loader)
    if epoch == 0 and step == 0 and not ck.path.exists():
        ck.save(loader, 0, 0)  # a kill before the first checkpoint still resumes the same order
    while not stop():
        if args.kind == "part":
            loader.sampler.set_epoch(epoch)
        for batch in loader:
            step += 1
            ids, bad = check(batch, args.n)
            log("batch", epoch=epoch, step=step, ids=ids, bad=bad)
            time.sleep(args.step_s)
            if step % CKPT_EVERY == 0:
                ck.save(loader, epoch, step)
            if stop():
                return
        log("epoch_end", epoch=epoch, steps=step)
        st = loader.stats()
        log("stats", epoch=epoch, **{k: st[k] for k in STATS if isinstance(st.get(k), (int, float))})
        epoch, step = epoch + 1, 0
        ck.save(loader, epoch, 0)
        if args.kind == "ray" and st.get("remote_actors") == 0 and ray_cpu_free():
            log("rebuild", why="no remote actor left (its Ray node died), a node is back: a new loader")
            return  # main() builds a new loader, which resumes from the checkpoint just saved


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kind", required=True, choices=["minio", "sample", "coord", "part", "nfs", "ray"])
    p.add_argument("--name", required=True)
    p.add_argument("--dir", required=True, type=Path)
    p.add_argument("--n", type=int, default=240)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-s", type=float, default=0.05)
    p.add_argument("--prep-s", type=float, default=0.0)
    p.add_argument("--redis", default="")
    p.add_argument("--group-dir", default="")
    p.add_argument("--nfs-url", default="")
    p.add_argument("--stage-dir", default="")
    p.add_argument("--ray-address", default="", help="the Ray head (the token: RAY_AUTH_TOKEN)")
    args = p.parse_args(argv)
    log = Log(args.dir / f"{args.name}.jsonl")
    stopping = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(now=True))

    def stop() -> bool:
        return stopping["now"] or (args.dir / "STOP").exists()

    log("start", run=os.getpid(), kind=args.kind, rank=int(os.environ.get("RANK", "0")))
    if args.kind == "part":
        import datetime

        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    ck = Checkpoint(args.dir / f"{args.name}.ckpt.json", log)
    errors = 0
    while not stop():
        loader = build_loader(args)
        try:
            run_epochs(loader, args, ck, log, stop)
        except Exception as e:  # the loader failed: log, rebuild, resume from the last checkpoint
            errors += 1
            log("error", what=f"{type(e).__name__}: {e}"[:2000], tb=traceback.format_exc()[-3000:])
            if errors >= MAX_ERRORS:
                loader.close()
                return 3
            time.sleep(1.0)
        finally:
            loader.close()
    log("stop")
    if args.kind == "part":
        os._exit(0)  # the process group cannot be torn down when the peer has gone first
    return 0


if __name__ == "__main__":
    sys.exit(main())
