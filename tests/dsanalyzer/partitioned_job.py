"""A fetch-bound training job, on one node or as one node of N with ``partitioned=True``, for the verify test.

Its items are files read through an emulated storage device of ``--storage-mbps`` per node
(:class:`dsanalyzer.demo_storage.EmulatedDevice`: every reader of the node queues on one lock file in
``--device-dir``, so the node's workers share the rate as on a local disk; no page cache in front of it).
Prep is light (the first bytes as a small tensor) and the step a fixed wait (an accelerator's step, which
leaves the cores to the loader), so the job is bound by what it reads: storage, or with ``--partitioned``
the other nodes' caches over the node's link.

    python tests/dsanalyzer/partitioned_job.py --data DIR --device-dir DIR --storage-mbps 4 --cache-bytes 22000000
    # one node of N (torchrun's variables set): prints one JSON line per epoch
    python tests/dsanalyzer/partitioned_job.py ... --partitioned --epochs 5
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

import coordl
from dsanalyzer.demo_storage import EmulatedDevice


class DeviceFiles:
    """A coordl item source over the files of ``root``, read through an emulated storage device."""

    def __init__(self, root: str, rate_bytes_per_s: float, device: str) -> None:
        self.files = sorted(str(p) for p in Path(root).iterdir() if p.is_file())
        self.device = EmulatedDevice(rate_bytes_per_s, device)

    def __len__(self) -> int:
        return len(self.files)

    def fetch(self, index: int) -> bytes:
        with open(self.files[index], "rb") as f:
            raw = f.read()
        self.device.transfer(len(raw))
        return raw

    def prep(self, raw: bytes | memoryview, index: int) -> torch.Tensor:
        return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8, count=64).astype(np.float32))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", required=True)
    p.add_argument(
        "--device-dir", required=True, help="where each node's emulated device (a lock file) lives"
    )
    p.add_argument("--storage-mbps", type=float, default=4.0)
    p.add_argument("--cache-bytes", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--epochs", type=int, default=1000)
    p.add_argument("--partitioned", action="store_true")
    p.add_argument("--persistent-workers", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    node = 0
    if a.partitioned:
        import datetime

        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
        node = dist.get_rank()
    device = os.path.join(a.device_dir, f"device-{node}")
    source = DeviceFiles(a.data, a.storage_mbps * 1e6, device)
    loader = coordl.DataLoader(
        source, batch_size=a.batch, shuffle=True, num_workers=a.workers, cache_bytes=a.cache_bytes,
        partitioned=a.partitioned, persistent_workers=a.persistent_workers,
    )  # fmt: skip
    for epoch in range(a.epochs):
        if a.partitioned:
            loader.sampler.set_epoch(epoch)
            dist.barrier()  # as DDP's first all-reduce would: the nodes start each epoch together
        t0, n = time.perf_counter(), 0
        for x in loader:
            time.sleep(a.step_ms / 1e3)
            n += len(x)
        secs = time.perf_counter() - t0
        if a.partitioned:
            st = loader.stats()
            keys = ("cache_hits", "cache_misses", "remote_hits", "remote_errors", "remote_misses")
            print(json.dumps({"node": node, "epoch": epoch, "n": n, "secs": secs, **{k: st.get(k, 0) for k in keys}}),
                  flush=True)  # fmt: skip
    if a.partitioned:
        dist.barrier()  # no node stops its Redis while another still reads from it
    loader.close()
    if a.partitioned:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
