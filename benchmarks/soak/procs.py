"""The soak's real processes: job processes (restarted from their checkpoint when they die), the sample
cache's Redis nodes, and the partitioned job's two ranks (in network namespaces when the host allows).

A job the fault injector (or a bug) killed is restarted by :class:`Supervisor` within a second; the new
incarnation loads the job's last ``state_dict()`` (job.py). The partitioned job's two ranks share one
process group, so when one dies both are stopped and restarted together on a fresh port, each from its
own checkpoint (what torchrun's elastic restart does).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def job_argv(kind: str, name: str, rundir: Path, seed: int, **extra: Any) -> list[str]:
    argv = [sys.executable, str(HERE / "job.py"), "--kind", kind, "--name", name, "--dir", str(rundir),
            "--seed", str(seed)]  # fmt: skip
    for k, v in extra.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return argv


@dataclass
class Job:
    """One job process; ``popen`` starts it (in a namespace for a partitioned rank)."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    host: Any = None  # a tests.support.netns.Host, or None for the root namespace
    proc: subprocess.Popen | None = None
    starts: int = 0
    expected_exit: bool = False

    def start(self, extra_env: dict[str, str] | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}:{HERE}", **self.env, **(extra_env or {})}
        with open(Path(self.argv[self.argv.index("--dir") + 1]) / f"{self.name}.stderr", "a") as err:
            if self.host is None:
                self.proc = subprocess.Popen(self.argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
            else:
                self.proc = self.host.popen(self.argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        self.starts += 1

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tree(self) -> list[psutil.Process]:
        """The job process and every process under it (loader workers, its own Redis)."""
        try:
            p = psutil.Process(self.pid)  # type: ignore[arg-type]
            return [p, *p.children(recursive=True)]
        except (psutil.NoSuchProcess, TypeError):
            return []

    def workers(self) -> list[psutil.Process]:
        """Loader workers (torch names them ``pt_data_worker``; coordl's producers run python)."""
        return [c for c in self.tree()[1:] if "redis" not in _name(c) and _running(c)]

    def redis(self) -> list[psutil.Process]:
        return [c for c in self.tree()[1:] if "redis" in _name(c) and _running(c)]

    def stop(self, timeout_s: float = 60.0) -> int | str | None:
        """Wait for the job to see the STOP file, then SIGTERM, then SIGKILL (each after ``timeout_s``)."""
        if self.proc is None:
            return None
        self.expected_exit = True
        for how in (None, signal.SIGTERM, signal.SIGKILL):
            if how is not None and self.proc.poll() is None:
                self.proc.send_signal(how)
            try:
                rc = self.proc.wait(timeout_s)
                return rc if how is None else f"{rc} after {signal.Signals(how).name}"  # type: ignore[return-value]
            except subprocess.TimeoutExpired:
                continue
        return None


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return ""


class Supervisor(threading.Thread):
    """Restarts jobs that exit while the soak runs; ``groups`` are restarted together (a process group)."""

    def __init__(self, jobs: list[Job], groups: list[list[Job]], on_event, restart_env=None) -> None:
        super().__init__(daemon=True, name="soak-supervisor")
        self.jobs, self.groups, self.on_event = jobs, groups, on_event
        self.restart_env = restart_env or (lambda group: {})
        self.halt = threading.Event()
        self.lock = threading.Lock()  # held by a fault that kills and restarts by itself

    def run(self) -> None:
        while not self.halt.wait(0.5):
            with self.lock:
                self._poll()

    def _poll(self) -> None:
        grouped = {id(j) for g in self.groups for j in g}
        for job in self.jobs:
            if id(job) not in grouped and not job.alive() and not self.halt.is_set():
                self.on_event("restart", job=job.name, rc=job.proc.returncode if job.proc else None)
                job.start()
        for group in self.groups:
            if all(j.alive() for j in group) or self.halt.is_set():
                continue
            rcs = {j.name: (j.proc.poll() if j.proc else None) for j in group}
            for j in group:
                if j.alive():
                    j.proc.kill()  # type: ignore[union-attr]
                if j.proc is not None:
                    j.proc.wait(30)
            env = self.restart_env(group)
            self.on_event("restart", job="+".join(j.name for j in group), rc=rcs)
            for j in group:
                j.start(env)


class RedisNodes:
    """The sample cache's Redis nodes (memcache.server.start_redis), restartable on the same port."""

    def __init__(self, n: int, workdir: Path, password: str) -> None:
        from memcache.server import start_redis

        self._start = start_redis
        self.workdir, self.password = workdir, password
        self.servers = [
            self._start(32 << 20, password=password, workdir=workdir / f"redis{i}") for i in range(n)
        ]

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.servers]

    def restart(self, i: int) -> None:
        old = self.servers[i]
        deadline = time.monotonic() + 30
        while True:  # the killed server's port can stay busy for a moment
            try:
                self.servers[i] = self._start(32 << 20, port=old.port, password=self.password,
                                              workdir=self.workdir / f"redis{i}")  # fmt: skip
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
