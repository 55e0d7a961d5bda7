"""Slow storage with a bounded page cache, for benchmarks that compare data loaders honestly.

This machine's virtual disk reads at 1-2 GB/s even cold and 24 GiB of RAM caches any small dataset,
so a loader comparison on it measures nothing. :class:`SlowStore` gives a run what a training
server with a large dataset has (needs root, loop devices, and cgroup v1 ``memory`` and ``blkio`` or
cgroup v2 with the ``memory`` and ``io`` controllers):

- **slow device**: an ext4 file system on a loop device (``losetup --direct-io=on``, so the backing
  file is not cached a second time) whose reads are throttled by a blkio cgroup
  (``blkio.throttle.read_bps_device``). Only the dataset lives there, so the cgroup's blkio read
  counter is exactly "bytes read from storage" (imports of torch etc. are not counted).
- **bounded page cache**: the run's processes sit in a memory cgroup. Every 5 ms a controller thread
  lowers its limit until the file pages cached are at most ``page_cache_bytes`` (the kernel reclaims
  from its own LRU lists), then raises it to the current usage + ``slack_bytes``. So the run keeps
  at most ``page_cache_bytes`` of file data cached, while processes, workers and their shared
  memory (torch's batches, coordl's cache: tmpfs pages are charged to the cgroup) grow freely. To give a loader with its own cache the *same* memory as a page-cache baseline, lower its
  ``page_cache_bytes`` by its cache size (``set_page_cache_bytes``). ``oom_kill_disable`` makes a
  task that hits the limit between two polls wait for the controller instead of being killed.
- **cold start**: :meth:`evict` drops the dataset's pages (``posix_fadvise(DONTNEED)``) before each run.

On cgroup v2 (no v1 hierarchies mounted: the GPU machines) the same with v2's files: ``io.max``
``rbps`` for the throttle, ``io.stat`` ``rbytes`` for the counter, and the page-cache bound kept by
writing the excess to ``memory.reclaim`` every poll (reclaim from the cgroup's own LRU lists, as v1's
lowered limit did, with no limit that a task could hit: v2 has no ``oom_kill_disable``).

    with SlowStore(image_bytes=600 << 20, read_bps=16_000_000, page_cache_bytes=90 << 20) as store:
        copy dataset into store.mount ...
        store.evict()
        out = store.run([sys.executable, "child.py"])    # the child and its workers are confined
        store.read_bytes()                                # blkio bytes read from the device so far

Everything is undone in ``close()`` (stop what still runs in the cgroups, unmount, detach, remove the
cgroups), also after errors and when the benchmark is killed with SIGTERM or SIGHUP inside the ``with``
block (the signal unwinds it; a killed run used to leave the file system mounted and its loop device held).

Why this module is long: one primitive (a slow store with a bounded page cache) over both cgroup versions.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

CG = "/sys/fs/cgroup"
POLL_S = 0.005


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _memory_stat(cgroup_dir: str) -> dict[str, int]:
    out = {}
    with open(os.path.join(cgroup_dir, "memory.stat")) as f:
        for line in f:
            key, value = line.split()
            out[key] = int(value)
    return out


def _round_page(n: int) -> int:
    return (max(n, 0) + 4095) // 4096 * 4096


def charge_libraries_outside() -> int:
    """Read this environment's shared libraries from the calling process (outside the cgroups).

    A file page is charged to the memory cgroup of the process that first reads it. If a run's
    child is the first to load torch's libraries (447 MB; after an idle machine's proactive reclaim
    evicted them), their pages count against the run's page-cache bound, which is squeezed to a few
    MB for a loader with its own cache: the child then spent 14 minutes importing torch, every page
    refaulted (measured 2026-11-23). Read from here, the pages are charged outside and stay out of
    the bound. Returns the bytes read (fast when they are resident already).
    """
    import sys

    total = 0
    for root in {sys.prefix, sys.base_prefix}:
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                if ".so" not in name:
                    continue
                try:
                    with open(os.path.join(dirpath, name), "rb", buffering=0) as f:
                        while chunk := f.read(1 << 20):
                            total += len(chunk)
                except OSError:
                    continue
    return total


def cgroup_missing() -> str:
    """What SlowStore lacks here among the cgroups it uses ('' when v1 or v2 will do)."""
    if all(os.path.isdir(f"{CG}/{ctl}") for ctl in ("memory", "blkio")):
        return ""
    try:
        with open(f"{CG}/cgroup.controllers") as f:
            have = set(f.read().split())
    except OSError:
        return f"cgroup v1 memory and blkio at {CG}/memory, {CG}/blkio, or cgroup v2 at {CG}"
    lack = {"memory", "io"} - have
    return (
        f"cgroup v2 controllers {', '.join(sorted(lack))} (have: {' '.join(sorted(have)) or 'none'})"
        if lack
        else ""
    )


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


class SlowStore:
    """A throttled loop-device file system plus memory/blkio cgroups for child processes."""

    def __init__(
        self,
        image_bytes: int,
        read_bps: int | None,
        page_cache_bytes: int | None,
        slack_bytes: int = 64 << 20,
        tag: str = "data",
        scratch: str | None = None,
    ) -> None:
        if os.geteuid() != 0:
            raise PermissionError("SlowStore needs root (loop devices, mount, cgroups)")
        self.v2 = not all(os.path.isdir(f"{CG}/{ctl}") for ctl in ("memory", "blkio"))
        missing = cgroup_missing()
        if missing:
            raise RuntimeError(f"SlowStore needs {missing}")
        self.read_bps = read_bps
        self.page_cache_bytes = page_cache_bytes
        self.slack_bytes = slack_bytes
        self.name = f"{tag}-{os.getpid()}-slowstore"
        self._scratch = tempfile.mkdtemp(prefix=f"{tag}-slowstore-", dir=scratch or "/var/tmp")
        self.image = os.path.join(self._scratch, "disk.img")
        self.mount = os.path.join(self._scratch, "mnt")
        self.loop: str | None = None
        self._mounted = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.controller_cpu_s = 0.0  # CPU of the controller thread (incl. the reclaim its writes do)
        self._previous_handlers: dict[int, object] = {}  # signal -> handler, while inside ``with``
        try:
            self._setup(image_bytes)
        except BaseException:
            self.close()
            raise

    # -- setup / teardown ----------------------------------------------------------------------

    def _setup(self, image_bytes: int) -> None:
        os.makedirs(self.mount)
        with open(self.image, "wb") as f:
            f.truncate(image_bytes)
        subprocess.run(["mkfs.ext4", "-q", "-F", self.image], check=True, timeout=120)
        try:
            cmd = ["losetup", "--find", "--show", "--direct-io=on", self.image]
            self.loop = subprocess.run(
                cmd, check=True, capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except subprocess.CalledProcessError:  # direct I/O unsupported: the backing file gets cached too
            cmd = ["losetup", "--find", "--show", self.image]
            self.loop = subprocess.run(
                cmd, check=True, capture_output=True, text=True, timeout=30
            ).stdout.strip()
        subprocess.run(["mount", self.loop, self.mount], check=True, timeout=30)
        self._mounted = True
        st = os.stat(self.loop)
        self.device = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        if self.v2:  # the controllers must be enabled for the root's children
            _write(f"{CG}/cgroup.subtree_control", "+memory +io")
        for path in self._dirs():
            os.makedirs(path, exist_ok=True)
        if self.v2 and not os.path.exists(f"{self._memory_dir}/memory.reclaim"):
            raise RuntimeError(
                "SlowStore needs cgroup v2's memory.reclaim (Linux 5.19+) to bound the page cache"
            )
        self.set_read_bps(self.read_bps)
        if not self.v2:
            _write(f"{CG}/memory/{self.name}/memory.oom_control", "1")
        if self.page_cache_bytes is not None:
            self._thread = threading.Thread(target=self._control_memory, name="slowstore-memory", daemon=True)
            self._thread.start()

    def set_page_cache_bytes(self, page_cache_bytes: int) -> None:
        """Change the page-cache bound (only when created with one)."""
        self.page_cache_bytes = page_cache_bytes

    def set_read_bps(self, read_bps: int | None) -> None:
        """Change the read throttle (None: unthrottled)."""
        self.read_bps = read_bps
        if self.v2:
            _write(f"{CG}/{self.name}/io.max", f"{self.device} rbps={read_bps if read_bps else 'max'}")
            return
        value = f"{self.device} {read_bps if read_bps else 0}"
        _write(f"{CG}/blkio/{self.name}/blkio.throttle.read_bps_device", value)

    def _dirs(self) -> list[str]:
        """The run's cgroup directories: one per v1 hierarchy, or the one v2 cgroup."""
        return (
            [f"{CG}/{self.name}"] if self.v2 else [f"{CG}/{ctl}/{self.name}" for ctl in ("memory", "blkio")]
        )

    @property
    def _memory_dir(self) -> str:
        return f"{CG}/{self.name}" if self.v2 else f"{CG}/memory/{self.name}"

    @property
    def io_counter(self) -> str:
        """The file with the bytes the cgroup read from each device (``bench_loader._blkio_read`` reads both)."""
        return (
            f"{CG}/{self.name}/io.stat"
            if self.v2
            else f"{CG}/blkio/{self.name}/blkio.throttle.io_service_bytes"
        )

    def close(self) -> None:
        """Stop what is left in the cgroups, unmount, detach the loop device, remove the cgroups and the
        scratch directory."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._kill_left_inside()
        for path in self._dirs():
            if os.path.isdir(path):
                try:
                    os.rmdir(path)
                except OSError as e:  # a process still inside: leave it, say so
                    print(f"slowstore: could not remove {path}: {e}")
        if self._mounted:
            subprocess.run(["umount", self.mount], check=False, timeout=60)
            self._mounted = False
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop], check=False, timeout=30)
            self.loop = None
        shutil.rmtree(self._scratch, ignore_errors=True)

    def _kill_left_inside(self) -> None:
        """SIGKILL every process still in the cgroups (a child cut off by an interrupted run, or its
        workers), and wait up to 5 s for them to go: a process inside keeps the mount busy."""
        deadline = time.monotonic() + 5
        while True:
            pids = set()
            for path in self.cgroup_procs_paths():
                try:
                    with open(path) as f:
                        pids.update(int(line) for line in f if line.strip())
                except OSError:
                    pass
            pids.discard(os.getpid())
            if not pids or time.monotonic() > deadline:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    def __enter__(self) -> SlowStore:
        # SIGTERM / SIGHUP unwind the with block (SystemExit), so close() runs; the default would end
        # the process on the spot, leaving the mount, the loop device and the cgroups behind.
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._previous_handlers[sig] = signal.signal(sig, _exit_on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            for sig, handler in self._previous_handlers.items():
                signal.signal(sig, handler)

    # -- memory budget ---------------------------------------------------------------------------

    def _control_memory(self) -> None:
        """Every poll: squeeze the page cache down to its bound, then leave headroom for allocations.

        Writing a limit below usage makes the kernel reclaim synchronously, from its own LRU lists,
        so the page cache keeps the kernel's replacement policy; raising the limit right after gives
        processes ``slack_bytes`` of headroom to allocate (batches, workers) without waiting.
        The page cache can exceed its bound only by what is read within one poll.
        """
        cg = self._memory_dir
        while not self._stop.wait(POLL_S):
            self.controller_cpu_s = time.thread_time()
            if self.v2:
                self._reclaim_excess(cg)
                continue
            try:
                with open(f"{cg}/memory.usage_in_bytes") as f:
                    usage = int(f.read())
                st = _memory_stat(cg)
                file_bytes = st.get("active_file", 0) + st.get("inactive_file", 0)
                if file_bytes > self.page_cache_bytes:
                    tight = usage - file_bytes + self.page_cache_bytes
                    try:
                        _write(f"{cg}/memory.limit_in_bytes", str(_round_page(tight)))
                    except OSError:  # EBUSY: memory grew meanwhile; the next poll tries again
                        pass
                with open(f"{cg}/memory.usage_in_bytes") as f:
                    usage = int(f.read())
                _write(f"{cg}/memory.limit_in_bytes", str(_round_page(usage + self.slack_bytes)))
            except (OSError, ValueError):
                if self._stop.is_set():
                    return

    def _reclaim_excess(self, cg: str, bound: int | None = None) -> None:
        """cgroup v2: reclaim the file pages over the bound (``memory.reclaim``, from the cgroup's LRU)."""
        try:
            st = _memory_stat(cg)
            excess = (
                st.get("active_file", 0)
                + st.get("inactive_file", 0)
                - (self.page_cache_bytes if bound is None else bound)
            )
            if excess > 0:
                _write(f"{cg}/memory.reclaim", str(_round_page(excess)))
        except (OSError, ValueError):  # EAGAIN: less was reclaimable; the next poll tries again
            pass

    def memory_stat(self) -> dict[str, int]:
        """The memory cgroup's memory.stat (cache, rss, shmem, ...)."""
        return _memory_stat(self._memory_dir)

    # -- runs ------------------------------------------------------------------------------------

    def evict(self, root: str | None = None) -> None:
        """Drop the cached pages of every file under ``root`` (default: the whole mount)."""
        os.sync()  # dirty pages cannot be dropped: write them back first
        for dirpath, _dirs, files in os.walk(root or self.mount):
            for name in files:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        # Pages charged to the cgroup by the last run (e.g. a shm cache already freed) are gone;
        # force_empty also reclaims whatever page cache of other files is left charged here.
        if self.v2:
            self._reclaim_excess(self._memory_dir, bound=0)
            return
        try:
            _write(f"{CG}/memory/{self.name}/memory.force_empty", "0")
        except OSError:
            pass

    def read_bytes(self) -> int:
        """Bytes read from the slow device by processes in the cgroup, since it was created."""
        total = 0
        with open(self.io_counter) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[0] == self.device and parts[1] == "Read":
                    total += int(parts[2])
                elif parts and parts[0] == self.device:  # v2: "8:0 rbytes=123 wbytes=..."
                    total += sum(int(kv[7:]) for kv in parts[1:] if kv.startswith("rbytes="))
        return total

    def cgroup_procs_paths(self) -> list[str]:
        """The cgroup.procs files a process writes its pid to in order to join."""
        return [f"{d}/cgroup.procs" for d in self._dirs()]

    def run(self, cmd: list[str], timeout_s: float = 900, env: dict[str, str] | None = None) -> str:
        """Run ``cmd`` inside the cgroups (its workers inherit them); return its stdout."""
        paths = self.cgroup_procs_paths()

        def enter() -> None:
            for p in paths:
                _write(p, str(os.getpid()))

        charge_libraries_outside()  # before every run: the machine may have reclaimed them since
        start = time.monotonic()
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, preexec_fn=enter, env=env, check=False
        )
        if out.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd[:4])}... failed (rc {out.returncode}, {time.monotonic() - start:.0f} s):\n"
                f"{out.stderr[-3000:]}"
            )
        return out.stdout


def copy_tree(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copy a dataset onto the store (then sync, so eviction can drop every page)."""
    shutil.copytree(src, dst, dirs_exist_ok=True)
    os.sync()


if __name__ == "__main__":  # smoke test: dd-like read of a file through the throttle
    import sys

    with SlowStore(image_bytes=256 << 20, read_bps=20_000_000, page_cache_bytes=16 << 20) as s:
        path = Path(s.mount) / "blob"
        path.write_bytes(os.urandom(40 << 20))
        s.evict()
        code = (
            f"import time;t=time.time();open({str(path)!r},'rb').read();print(40*1048576/(time.time()-t)/1e6)"
        )
        print("MB/s throttled:", s.run([sys.executable, "-c", code]).strip(), "device bytes:", s.read_bytes())
