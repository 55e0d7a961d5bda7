"""Run a check function on P gloo processes on 127.0.0.1 (free port), failing the test if any rank fails."""

from __future__ import annotations

import os
import socket
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, fn, args: tuple) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=_timeout()
    )
    try:
        fn(rank, world, *args)
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()
    _leave_cleanly()


def _leave_cleanly() -> None:
    """Exit a rank that passed without libtorch's exit-time C++ destructors.

    A passing rank sometimes aborted at interpreter exit ("terminate called without an active exception",
    SIGABRT; once in CI, in test_tta) after ``fn`` had returned: a C++ thread object torn down during
    finalisation, the same thing ``gradcomp.cli._exit`` avoids for ``gradcomp train``. Python's atexit
    handlers still run.
    """
    import atexit
    import sys

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _timeout():
    import datetime

    return datetime.timedelta(seconds=60)


def run_ranks(fn, world: int, *args: object) -> None:
    """``fn(rank, world, *args)`` on ``world`` spawned processes (``fn`` must be importable)."""
    mp.spawn(_worker, args=(world, free_port(), fn, args), nprocs=world, join=True)
