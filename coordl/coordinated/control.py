"""The control block of a coordination group: its layout, lock, doorbells and liveness sweep.

One file ``<dir>/coordl-grp-<digest>.ctl`` of int64 words shared by every job of a group
(``coordl.coordinated.job``): a header of group parameters and the next unclaimed batch, a table of member
jobs (pid, start ticks, first batch needed, cursor), a table of producer processes, and one row per
staging slot (batch, state, producer, bytes). Changes happen under an fcntl lock on
``<base>.lock``; wake-ups are datagrams on abstract Unix sockets named after the group and the pid.

No file outlives the group: the last member to leave unlinks the lock file too, while holding it. A
process that was waiting on that lock then holds a lock on a name nobody will open again, so
:func:`lock_group` checks after ``flock`` that the path still names the file it locked, and retries.
:func:`reclaim_dead_groups` removes the files of groups whose every process died (``kill -9``).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import re
import socket
from collections.abc import Iterator

import numpy as np

from shmem import members as member_rows

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


_GROUP_FILE_RE = re.compile(r"^(coordl-grp-[0-9a-f]{16})\.(?:lock|ctl|data)$")


def ctl_size(slots: int) -> int:
    return 8 * (HDR + MEMBERS * MW + PRODUCERS * PW + slots * SW)


def slots_for_size(size: int) -> int | None:
    """The slot count of a control block of ``size`` bytes, or None if no layout has that size."""
    slots, rest = divmod(size - ctl_size(0), 8 * SW)
    return slots if slots > 0 and rest == 0 else None


def _names(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not once it is unlinked or re-created)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_ino, st.st_dev) == (fst.st_ino, fst.st_dev)


def lock_group(base: str, *, blocking: bool = True) -> int | None:
    """Lock the group ``base`` (creating ``<base>.lock``); return the fd, whose close releases it.

    Args:
        base: ``<dir>/coordl-grp-<digest>``.
        blocking: wait for the holder; with False, return None while another process holds it.

    The lock file is unlinked by whoever removes the group, while holding it: a lock taken on a file
    the path no longer names excludes nobody, so that case is retried with the current file.
    """
    path = base + ".lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _names(fd, path):
                return fd
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def remove_group_files(base: str) -> None:
    """Unlink the group's ring, control block and lock file; only while holding the group's lock.

    It must be the last thing done under that lock: once the lock file is unlinked, a newcomer can
    create and lock a fresh one, so the lock no longer excludes anyone.
    """
    for ext in (".data", ".ctl", ".lock"):  # the lock last: a crash in between leaves a lockable group
        with contextlib.suppress(FileNotFoundError):
            os.unlink(base + ext)


def _group_is_dead(base: str) -> bool:
    """Under the group's lock: whether no process of the group is alive (or it was never finished)."""
    try:
        with open(base + ".ctl", "rb") as f:
            head = np.frombuffer(f.read(16).ljust(16, b"\0"), dtype=np.int64)
            slots = slots_for_size(os.fstat(f.fileno()).st_size)
    except FileNotFoundError:
        return True  # a lock or ring without control block: left by a crash while removing the group
    if int(head[0]) != MAGIC:
        return True  # its creator died before finishing it (creating happens under this lock)
    if int(head[1]) != VERSION or slots is None:
        return False  # another coordl version's layout: not ours to judge
    ctl = Control(base, slots)
    try:
        ctl.sweep()
        return ctl.all_dead()
    finally:
        ctl.close()


def reclaim_dead_groups(directory: str) -> list[str]:
    """Remove the files of groups in ``directory`` whose processes all died; return their bases.

    A group whose lock is held (in use right now) or that has a live member or producer is kept.
    """
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    removed = []
    for name in sorted({m[1] for m in map(_GROUP_FILE_RE.match, names) if m}):
        base = os.path.join(directory, name)
        try:
            fd = lock_group(base, blocking=False)
        except OSError:
            continue  # e.g. another user's group
        if fd is None:
            continue
        try:
            if _group_is_dead(base):
                remove_group_files(base)
                removed.append(base)
        finally:
            os.close(fd)
    return removed


class Control:
    """Typed views of the control block, plus the lock and the doorbells."""

    def __init__(self, base: str, slots: int) -> None:
        self.base = base
        # No O_CREAT: the lock file exists while the group does; re-creating it after the group was
        # removed (a late producer) would leave a file nobody removes.
        self._lock_fd = os.open(base + ".lock", os.O_RDWR)
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
        member_rows.sweep(self.members)
        member_rows.sweep(self.producers)
        live = {int(p) for p in self.producers[:, 0]}
        for slot in self.slots:
            if slot[1] == CLAIMED and int(slot[2]) not in live:
                slot[1] = REDO

    def all_dead(self) -> bool:
        """After a sweep: whether the group has no member and no producer left."""
        return not self.members[:, 0].any() and not self.producers[:, 0].any()

    def is_current(self) -> bool:
        """Whether the group's paths still name this block and its lock (it was not removed or re-made)."""
        return _names(self._lock_fd, self.base + ".lock") and _names(self._fd, self.base + ".ctl")

    def claim(self, s: int, g: int, pid: int, ticks: int) -> None:
        """Under the lock: slot ``s`` is being made into batch ``g`` by producer (pid, ticks).

        The state is written before the batch number: a reader that sees the new number must never
        pair it with the old READY state (that reads the slot's previous batch as batch ``g``). The
        producer goes first: killed between two writes, it leaves an old state beside its own pid
        (harmless: ``H_NEXT`` has not moved) or a claim by a dead producer, which :meth:`sweep`
        gives back, never a claim in the name of a live producer that is not making it.
        """
        row = self.slots[s]
        row[2], row[3] = pid, ticks
        row[1] = CLAIMED
        row[0] = g

    def ready_bytes(self, s: int, g: int) -> int | None:
        """The encoded size of batch ``g`` if slot ``s`` holds it ready, else None.

        Read under the lock, which every write to a slot row holds: a claim half written by a producer
        is never seen. The slot cannot be reused while the reader's cursor is at ``g`` or before it.
        """
        with self.locked():
            row = self.slots[s]
            if int(row[0]) == g and int(row[1]) == READY:
                return int(row[4])
        return None

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
