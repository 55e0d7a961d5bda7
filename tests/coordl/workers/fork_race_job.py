"""CPython gh-112275 for real: loader epochs forking workers while native threads create thread states.

    python fork_race_job.py --loader coordl|torch [--epochs 300] [--threads 3]

Native threads (``pthread_create`` through ctypes, as torch's C++ threads are to Python) each enter
Python once (ctypes gives each a new thread state, made under CPython's thread-list lock without the
GIL) and end, in a loop. A child forked at that instant inherits the lock held and, before CPython
3.11.10, hangs inside ``os.fork()``. Each epoch of a 2-worker loader forks 2 children. torch's loader
runs with ``timeout=10`` so that a hung worker shows as a timeout instead of a hang. Prints one JSON
line: epochs run, epochs whose batches were not torch's order, timeouts, and the Python version.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import threading

import torch

import coordl

_NATIVE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


class Items(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(index)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--loader", choices=("coordl", "torch"), required=True)
    p.add_argument("--epochs", type=int, default=300)
    p.add_argument("--threads", type=int, default=3)
    args = p.parse_args()
    libc = ctypes.CDLL(None)
    enter_python = _NATIVE(lambda arg: None)
    stop = threading.Event()

    def native_threads() -> None:
        tid = ctypes.c_ulong()
        while not stop.is_set():
            libc.pthread_create(ctypes.byref(tid), None, enter_python, None)
            libc.pthread_join(tid, None)

    kind = coordl.DataLoader if args.loader == "coordl" else torch.utils.data.DataLoader
    extra = {"timeout": 10} if args.loader == "torch" else {}
    loader = kind(
        Items(),
        batch_size=4,
        shuffle=True,
        num_workers=2,
        generator=torch.Generator().manual_seed(0),
        **extra,
    )
    reference = torch.utils.data.DataLoader(
        Items(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    for _ in range(args.threads):
        threading.Thread(target=native_threads, daemon=True).start()
    wrong = timeouts = 0
    for _ in range(args.epochs):
        want = [b.tolist() for b in reference]  # every epoch, so that both generators advance alike
        try:
            got = [b.tolist() for b in loader]
        except RuntimeError as e:
            if "timed out" not in str(e):
                raise
            timeouts += 1
            continue
        wrong += got != want
    stop.set()
    version = ".".join(map(str, sys.version_info[:3]))
    print(
        json.dumps(
            {
                "loader": args.loader,
                "epochs": args.epochs,
                "wrong": wrong,
                "timeouts": timeouts,
                "python": version,
            }
        )
    )


if __name__ == "__main__":
    main()
