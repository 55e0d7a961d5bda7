"""The control block of a coordination group: its layout, lock, doorbells and liveness sweep.

One file ``<dir>/coordl-grp-<digest>.ctl`` of int64 words shared by every job of a group
(``coordl.coordinate``): a header of group parameters and the next unclaimed batch, a table of member
jobs (pid, start ticks, first batch needed, cursor), a table of producer processes, and one row per
staging slot (batch, state, producer, bytes). Changes happen under an fcntl lock on
``<base>.lock``; wake-ups are datagrams on abstract Unix sockets named after the group and the pid.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import socket
from collections.abc import Iterator

import numpy as np

from coordl.shm import _owner_alive

MAGIC, VERSION = 0xC00D1C0, 1
HDR = 16
MEMBERS, MW = 64, 4  # pid, start ticks, first batch it needs, cursor
PRODUCERS, PW = 256, 3  # pid, start ticks, member pid
SW = 5  # batch g, state, producer pid, producer start ticks, nbytes
EMPTY, CLAIMED, READY, REDO = 0, 1, 2, 3
SWEEP_S = 0.5
# header fields
(
    H_MAGIC,
    H_VER,
    H_SLOTS,
    H_SLOTBYTES,
    H_BATCHES,
    H_ITEMS,
    H_BS,
    H_SEED,
    H_SHUFFLE,
    H_DROP,
    H_NEXT,
) = range(11)
PARAMS = {
    "num_items": H_ITEMS,
    "batch_size": H_BS,
    "seed": H_SEED,
    "shuffle": H_SHUFFLE,
    "drop_last": H_DROP,
}


def ctl_size(slots: int) -> int:
    return 8 * (HDR + MEMBERS * MW + PRODUCERS * PW + slots * SW)


class Control:
    """Typed views of the control block, plus the lock and the doorbells."""

    def __init__(self, base: str, slots: int) -> None:
        self.base = base
        self._lock_fd = os.open(base + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        self._fd = os.open(base + ".ctl", os.O_RDWR)
        self._map = mmap.mmap(self._fd, ctl_size(slots))
        self._mm = np.frombuffer(self._map, dtype=np.int64)
        o = HDR
        self.hdr = self._mm[:HDR]
        self.members = self._mm[o : o + MEMBERS * MW].reshape(MEMBERS, MW)
        o += MEMBERS * MW
        self.producers = self._mm[o : o + PRODUCERS * PW].reshape(PRODUCERS, PW)
        o += PRODUCERS * PW
        self.slots = self._mm[o : o + slots * SW].reshape(slots, SW)
        self._sock: socket.socket | None = None
        self._sock_pid = -1

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _bell_name(self, pid: int) -> bytes:
        return b"\0" + os.path.basename(self.base).encode() + b"-" + str(pid).encode()

    def doorbell(self) -> socket.socket:
        if self._sock is None or self._sock_pid != os.getpid():
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.bind(self._bell_name(os.getpid()))
            self._sock_pid = os.getpid()
        return self._sock

    def ring_all(self) -> None:
        sender = self.doorbell()
        pids = {int(p) for p in self.members[:, 0]} | {int(p) for p in self.producers[:, 0]}
        for pid in pids - {0, os.getpid()}:
            with contextlib.suppress(OSError):
                sender.sendto(b"!", socket.MSG_DONTWAIT, self._bell_name(pid))

    def wait_bell(self, timeout_s: float) -> None:
        sock = self.doorbell()
        sock.settimeout(max(timeout_s, 0.001))
        with contextlib.suppress(TimeoutError, BlockingIOError):
            sock.recv(16)
            sock.setblocking(False)
            while True:  # drain: one wake-up per wait is enough
                sock.recv(16)

    def sweep(self) -> None:
        """Forget dead members and producers; batches claimed by dead producers are redone."""
        for table in (self.members, self.producers):
            for row in table:
                if row[0] and not _owner_alive(int(row[0]), int(row[1])):
                    row[:] = 0
        live = {int(p) for p in self.producers[:, 0]}
        for slot in self.slots:
            if slot[1] == CLAIMED and int(slot[2]) not in live:
                slot[1] = REDO

    def consumed_by_all(self, g: int) -> bool:
        m = self.members
        waiting = (m[:, 0] != 0) & (m[:, 2] <= g) & (m[:, 3] <= g)
        return not waiting.any()

    def close(self) -> None:
        if self._sock is not None and self._sock_pid == os.getpid():
            self._sock.close()
        self._sock = None
        del self.hdr, self.members, self.producers, self.slots, self._mm
        with contextlib.suppress(BufferError):
            self._map.close()
        os.close(self._fd)
        os.close(self._lock_fd)
