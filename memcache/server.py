"""Start and stop a node's ``redis-server`` with the settings a sample cache needs.

Shared by ``memcache serve``/``memcache stop``, the partitioned cache of ``coordl`` (a node leader
starts its node's Redis with it when the user runs none) and the tests. Settings: no persistence (``save ""``,
``appendonly no``: the cache is rebuilt from the dataset, writing it to disk would only cost I/O),
``maxmemory`` + ``maxmemory-policy noeviction`` (MinIO semantics: fill, then refuse writes, never evict),
bound to one chosen interface, optional ``requirepass``, optional TLS (:class:`memcache.tls.TLS`: the
TLS port only, plain text off, client certificates of the CA required). The configuration (with the
password) is written to a 0600 file in the server's working directory, never on the command line where
``ps`` would show it; the password is left out of :class:`RedisServer`'s repr.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from memcache.tls import TLS
from shmem.segment import owner_alive, owner_tag

__all__ = ["RedisServer", "start_redis", "free_port", "stop_pid", "client_for"]

_START_TIMEOUT_S = 15.0
# A temporary workdir of a server that dies with its starter: memcache-redis-<pid>-<start>-<random>.
_OWNED_PREFIX = "memcache-redis-"
_STOP_TIMEOUT_S = 10.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS reports free on ``host`` right now (the caller retries if it is taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class RedisServer:
    """A running redis-server process started by :func:`start_redis`."""

    host: str
    port: int
    pid: int
    workdir: str
    password: str | None = field(default=None, repr=False)  # never in a repr, a log or an error
    tls: TLS | None = None
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    _own_workdir: bool = field(default=False, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, timeout_s: float = _STOP_TIMEOUT_S) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout_s``) and remove a temporary workdir."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(timeout_s)
        else:
            stop_pid(self.pid, timeout_s)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the server (to test a node that dies)."""
        os.kill(self.pid, signal.SIGKILL)
        if self._proc is not None:
            self._proc.wait(_STOP_TIMEOUT_S)


def _config(
    host: str, port: int, maxmemory_bytes: int, workdir: str, password: str | None, tls: TLS | None
) -> str:
    lines = [
        f"bind {host}",
        *(tls.server_lines(port) if tls is not None else [f"port {port}"]),
        'save ""',
        "appendonly no",
        f"maxmemory {int(maxmemory_bytes)}",
        "maxmemory-policy noeviction",
        f'dir "{workdir}"',
        f'logfile "{os.path.join(workdir, "redis.log")}"',
        f'pidfile "{os.path.join(workdir, "redis.pid")}"',
        "daemonize no",
    ]
    if password:
        if any(c in password for c in '"\\\n\r '):
            raise ValueError("the Redis password must not contain spaces, quotes, backslashes or newlines")
        lines.append(f'requirepass "{password}"')
    return "\n".join(lines) + "\n"


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL me when my parent exits (prctl PR_SET_PDEATHSIG, Linux)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


def client_for(server: RedisServer, **kwargs: Any) -> Any:
    """A ``redis.Redis`` to ``server`` as its starter talks to it (its own certificate when TLS is on;
    the CA is checked, not the name: the server may listen on a wildcard address)."""
    import redis

    extra: dict[str, Any] = (
        {} if server.tls is None else replace(server.tls, check_hostname=False).client_kwargs()
    )
    host = "127.0.0.1" if server.host in ("0.0.0.0", "") else server.host
    return redis.Redis(host=host, port=server.port, password=server.password, **extra, **kwargs)


def _ping(server: RedisServer) -> bool:
    import redis

    client = client_for(server, socket_timeout=1)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def start_redis(
    maxmemory_bytes: int,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    password: str | None = None,
    workdir: str | os.PathLike | None = None,
    detach: bool = False,
    die_with_parent: bool = False,
    executable: str = "redis-server",
    tls: TLS | None = None,
) -> RedisServer:
    """Start ``redis-server`` on ``host:port`` (a free port when ``port`` is None) and wait until it answers.

    Args:
        maxmemory_bytes: the node's cache budget; writes are refused beyond it (noeviction).
        host: the interface to listen on (``127.0.0.1``, or the node's cluster-network address).
        password: sets ``requirepass``; clients pass the same to :class:`memcache.RedisStore`.
        workdir: holds redis.conf (mode 0600), redis.log and redis.pid; a temporary one when None.
        detach: start in a new session so the server outlives this process (``memcache serve``).
        die_with_parent: the kernel kills the server when the thread that started it exits (Linux
            ``PR_SET_PDEATHSIG``): a job's own server never outlives the job, even when it is SIGKILLed.
        tls: serve TLS only on ``port`` (plain text off), requiring client certificates of ``tls.ca``.

    Raises:
        FileNotFoundError: ``redis-server`` is not installed (run scripts/setup.sh).
        RuntimeError: the server exited or did not answer PING in time (the log tail is included).
    """
    exe = shutil.which(executable)
    if exe is None:
        raise FileNotFoundError(f"{executable} not found: install Debian's redis-server (scripts/setup.sh)")
    own = workdir is None
    if own and die_with_parent:
        _reclaim_dead_workdirs()
        wd = tempfile.mkdtemp(prefix=f"{_OWNED_PREFIX}{owner_tag()}-")
    else:
        wd = tempfile.mkdtemp(prefix="memcache-redis-") if workdir is None else os.fspath(workdir)
    Path(wd).mkdir(parents=True, exist_ok=True)
    tries = 5 if port is None else 1
    last_error = ""
    for _ in range(tries):
        p = free_port(host) if port is None else port
        conf = os.path.join(wd, "redis.conf")
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(_config(host, p, maxmemory_bytes, wd, password, tls))
        log = os.path.join(wd, "redis.log")
        if os.path.exists(log):
            os.unlink(log)
        proc = subprocess.Popen(
            [exe, conf],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=detach,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )
        server = RedisServer(host, p, proc.pid, wd, password, tls, proc, own)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if _ping(server):
                return server
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            proc.wait(_STOP_TIMEOUT_S)
        try:
            last_error = "".join(Path(log).read_text(errors="replace").splitlines(True)[-5:])
        except FileNotFoundError:
            last_error = "(no log)"
        if "Address already in use" not in last_error:
            break  # another port would not help
    if own:
        shutil.rmtree(wd, ignore_errors=True)
    raise RuntimeError(f"redis-server on {host}:{port or 'auto'} did not start; log tail:\n{last_error}")


def _reclaim_dead_workdirs() -> None:
    """Remove the temporary workdirs (redis.conf holds the password) of servers whose starter was killed.

    A server started with ``die_with_parent`` died with its starter; a starter killed with SIGKILL never
    ran :meth:`RedisServer.stop`, so its workdir stayed behind. The owner's pid and start time are in
    the name (as for shared-memory segments), so a reused pid is not mistaken for the owner.
    """
    base = tempfile.gettempdir()
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        parts = name[len(_OWNED_PREFIX) :].split("-")
        if not name.startswith(_OWNED_PREFIX) or len(parts) < 3 or not (parts[0] + parts[1]).isdigit():
            continue
        if not owner_alive(int(parts[0]), int(parts[1])):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def stop_pid(pid: int, timeout_s: float = _STOP_TIMEOUT_S) -> bool:
    """Stop the redis-server with ``pid`` (checked to be one). False when no such server runs."""
    try:
        proc = psutil.Process(pid)
        if "redis-server" not in proc.name():
            raise ValueError(f"pid {pid} is {proc.name()!r}, not redis-server: not stopping it")
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
        return True
    except psutil.NoSuchProcess:
        return False
