"""A plain torch script whose forked loader workers get stuck inside ``os.fork()`` on demand.

    python stuck_job.py TOKENS_DIR [--epochs 2] [--workers 2] [--persistent] [--busy S] [--stuck-after S]
        [--loader coordl|torch] [--fork-context]

Every file in TOKENS_DIR is one child to get stuck: a child forked while a file is there removes one
and then sleeps forever inside ``os.fork()`` (an ``after_in_child`` handler), as a child does that
inherits CPython's thread-list lock held (gh-112275). ``--busy S``: instead, every child spends S
seconds of CPU there (a slow start, not a stuck one). Prints one JSON line per epoch: whether its
batches are those of torch's own loader with the same arguments, and the pids of the workers stuck so far.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import torch

import coordl
import coordl.workers.stuck

STUCK: list[int] = []


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("tokens")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--busy", type=float, default=0.0)
    p.add_argument("--stuck-after", type=float)
    p.add_argument("--fork-context", action="store_true")
    p.add_argument(
        "--custom-context", action="store_true", help="a ForkContext subclass of the program's own"
    )
    p.add_argument("--die", action="store_true", help="a child that takes a token is killed instead of stuck")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    if args.stuck_after is not None:
        coordl.workers.stuck.STUCK_AFTER_S = args.stuck_after
    stuck_log = os.path.join(args.tokens, "..", "stuck.log")

    armed = False

    def in_child() -> None:
        if not armed:
            return
        if args.busy:
            end = time.process_time() + args.busy
            while time.process_time() < end:
                pass
            return
        for name in sorted(os.listdir(args.tokens)):
            try:
                os.unlink(os.path.join(args.tokens, name))
            except FileNotFoundError:
                continue
            with open(stuck_log, "a") as f:
                f.write(f"{os.getpid()}\n")
            if args.die:  # after iter() has returned, before the watch could take it for stuck
                time.sleep(0.3)
                os.kill(os.getpid(), signal.SIGKILL)
            while True:
                time.sleep(1000)

    os.register_at_fork(after_in_child=in_child)
    extra = {"multiprocessing_context": multiprocessing.get_context("fork")} if args.fork_context else {}
    if args.custom_context:
        extra = {"multiprocessing_context": OwnForkContext()}

    def same_arguments(kind: type) -> torch.utils.data.DataLoader:
        return kind(
            Items(), batch_size=8, shuffle=True, num_workers=args.workers, persistent_workers=args.persistent,
            generator=torch.Generator().manual_seed(0), **extra,
        )  # fmt: skip

    torch_loader = same_arguments(torch.utils.data.DataLoader)  # torch's epochs, before any child is stuck
    reference = [[b.tolist() for b in torch_loader] for _ in range(args.epochs)]
    del torch_loader
    armed = True
    loader = same_arguments(coordl.DataLoader)
    if args.die:  # hold the epoch's iterator past the stuck limit without asking for a batch
        try:
            it = iter(loader)
        except coordl.WorkerDiedError:  # it died before iter() returned: torch's handler raised it there
            print(json.dumps({"epoch": 0, "reported": ["iter"], "watching": False}), flush=True)
            return
        deadline = (
            time.monotonic()
            + coordl.workers.stuck.STUCK_AFTER_S
            + 2 * coordl.workers.stuck.LOOK_EVERY_S
            + 0.5
        )
        reported = []
        while (left := deadline - time.monotonic()) > 0:
            try:
                time.sleep(left)
            except RuntimeError as e:  # torch's SIGCHLD handler reports the death wherever this process is
                reported.append("sleep" if "killed by signal" in str(e) else repr(e))
        watching = any(t.name == "coordl-worker-start" for t in threading.enumerate())
        try:
            next(it)
        except coordl.WorkerDiedError:
            reported.append("next")
        print(json.dumps({"epoch": 0, "reported": reported, "watching": watching}), flush=True)
        return
    for epoch in range(args.epochs):
        t0 = time.monotonic()
        try:
            got = [b.tolist() for b in loader]
        except coordl.WorkerDiedError as e:
            print(json.dumps({"epoch": epoch, "error": type(e).__name__, "message": str(e)}), flush=True)
            return
        same = got == reference[epoch]
        stuck = [int(x) for x in Path(stuck_log).read_text().split()] if os.path.exists(stuck_log) else []
        context_kept = loader._torch.multiprocessing_context is loader.multiprocessing_context
        print(json.dumps({
            "epoch": epoch, "same": same, "seconds": time.monotonic() - t0, "stuck": stuck, "context_kept": context_kept,
        }), flush=True)  # fmt: skip


class OwnForkContext(multiprocessing.context.ForkContext):
    """A program's own fork context: coordl cannot start its processes itself."""


class Items(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(index)


if __name__ == "__main__":
    main()
