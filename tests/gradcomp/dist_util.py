"""Run a check function on P gloo processes on this host, failing the test if any rank fails.

What makes a run repeatable:

- rendezvous through a ``FileStore`` in a fresh temporary directory, not a TCP port picked beforehand (a port
  found free and then bound by the child can be taken in between by another process on a busy machine);
- gloo's own connections on the loopback interface (``GLOO_SOCKET_IFNAME=lo`` unless set): nothing leaves the host
  and the address does not depend on how the host name resolves;
- one intra-op thread per rank (``torch.set_num_threads(1)``, ``OMP_NUM_THREADS=1``): a float reduction split
  over another number of threads rounds differently, and that alone can flip a top-k pick;
- ``torch.use_deterministic_algorithms(True)``: an operation without a deterministic kernel raises instead of
  giving run-to-run differences;
- the global RNG seeded per rank (``torch.manual_seed(rank)``) before the check, so draws a check does not seed
  itself are still fixed.
"""

from __future__ import annotations

import datetime
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

#: How long a collective may wait for a slower rank before the run fails. Generous: ranks of a check reach each
#: collective within milliseconds of each other, so this only bounds a hang, and a loaded 2-core CI machine can
#: stall a process for seconds.
COLLECTIVE_TIMEOUT_S = 180


def _worker(rank: int, world: int, store_path: str, fn: Callable, args: tuple) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(rank)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store_path}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
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

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(fn: Callable, world: int, *args: object) -> None:
    """``fn(rank, world, *args)`` on ``world`` spawned processes (``fn`` must be importable)."""
    store_dir = tempfile.mkdtemp(prefix="gradcomp-test-store-")
    try:
        store_path = str(Path(store_dir) / "store")
        mp.spawn(_worker, args=(world, store_path, fn, args), nprocs=world, join=True)
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
