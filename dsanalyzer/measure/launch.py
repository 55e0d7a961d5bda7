"""Running the profiled command once under the import hook, and watching it.

Each differential run is a child process in its own session (so that the script and its loader
workers can be stopped together), with ``dsanalyzer/_hook`` first on ``PYTHONPATH``. The child
reports through files in its result directory: ``progress-<pid>.txt`` while it runs and
``result-<pid>.json`` (plain JSON) when it stops. Every wait here has a timeout.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dsanalyzer.measure.hookconfig import HookConfig

__all__ = ["ProfileError", "ProgressBar", "run_child"]

_HOOK_DIR = str(Path(__file__).resolve().parents[1] / "_hook")  # dsanalyzer/_hook
_PKG_PARENT = str(Path(__file__).resolve().parents[2])  # the folder holding dsanalyzer/
_LINGER_S = 30.0  # how long a child may take to exit after writing its result


class ProfileError(RuntimeError):
    """The profiled job could not be measured (it failed, never iterated a loader, or timed out)."""


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _kill_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """Stop the process group we started (the script and its loader workers)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


class _Stopped(SystemExit):
    """dsanalyzer itself got SIGTERM or SIGHUP while a profiled run was going: the run's process group is
    stopped on the way out, and dsanalyzer exits as a signalled process would (128 + the signal)."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into :class:`_Stopped` while a child runs (main thread only).

    The child runs in its own session, so a ``kill`` of dsanalyzer (a job scheduler's, a closed terminal)
    would otherwise end dsanalyzer alone and leave the training job and its workers running.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        raise _Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_child(
    command: list[str],
    cfg: HookConfig,
    log_path: Path,
    timeout_s: float,
    progress: Callable[[int, int], None] | None = None,
    extra_env: dict[str, str] | None = None,
) -> dict:
    """Run ``command`` once under the hook in mode ``cfg.mode``; return its result dict. ``extra_env``:
    more for the hook (a fix's change, :mod:`dsanalyzer.measure.apply`)."""
    env = dict(os.environ)
    env.pop("DSANALYZER_APPLY", None)  # a change is this run's to give, never inherited
    env.update(cfg.to_env())
    env.update(extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_HOOK_DIR, _PKG_PARENT, env.get("PYTHONPATH")) if p)
    Path(cfg.result_dir).mkdir(parents=True, exist_ok=True)
    for pattern in ("result-*.json", "progress-*.txt"):  # an earlier run's files in this directory
        for stale in glob.glob(os.path.join(cfg.result_dir, pattern)):  # must not be read as this run's
            os.unlink(stale)
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as e:
            raise ProfileError(f"cannot start {command[0]!r}: {e.strerror or e}") from None
        deadline = time.monotonic() + timeout_s
        try:
            with _stop_on_signals():
                _wait(proc, cfg, log_path, timeout_s, deadline, progress)
        except BaseException:
            if proc.poll() is None:
                _kill_group(proc)
            raise
    return _read_result(proc, cfg, command, log_path)


def _wait(
    proc: subprocess.Popen,
    cfg: HookConfig,
    log_path: Path,
    timeout_s: float,
    deadline: float,
    progress: Callable[[int, int], None] | None,
) -> None:
    """Poll the child until it exits, lingers too long after its result, or runs past ``deadline``."""
    stopped_at = None
    while proc.poll() is None:
        time.sleep(0.2)
        if progress is not None:
            for p in glob.glob(os.path.join(cfg.result_dir, "progress-*.txt")):
                try:
                    done, total = (int(x) for x in Path(p).read_text().split())
                    progress(done, total)
                except (OSError, ValueError):
                    pass
        if stopped_at is None and glob.glob(os.path.join(cfg.result_dir, "result-*.json")):
            stopped_at = time.monotonic()
        if stopped_at is not None and time.monotonic() - stopped_at > _LINGER_S:
            _kill_group(proc)  # the script lingers after its result: shutting down is not measured
            break
        if time.monotonic() > deadline:
            _kill_group(proc)
            raise ProfileError(
                f"the {cfg.mode} run timed out after {timeout_s:.0f} s (--timeout); "
                f"last lines of its output ({log_path}):\n{_tail(log_path)}"
            )


def _read_result(proc: subprocess.Popen, cfg: HookConfig, command: list[str], log_path: Path) -> dict:
    """The run's result dict from its result files, or a ProfileError saying why there is none."""
    results = []
    for p in sorted(glob.glob(os.path.join(cfg.result_dir, "result-*.json"))):
        with open(p) as f:
            results.append(json.load(f))
    stopped = [r for r in results if r.get("status") == "stopped"]
    rc = proc.returncode
    if rc not in (0, None) and not stopped:
        raise ProfileError(
            f"the profiled command failed with exit code {rc} in the {cfg.mode} run: {' '.join(command)}\n"
            f"last lines of its output ({log_path}):\n{_tail(log_path)}"
        )
    if not results:
        raise ProfileError(
            f"the command never iterated a torch.utils.data.DataLoader, coordl.DataLoader, "
            f"coordl.dali.DALILoader or DALI iterator (nvidia.dali.plugin.pytorch.DALIGenericIterator) "
            f"(run {cfg.mode}, output in {log_path}); dsanalyzer profiles the first loader a script iterates"
        )
    result = max(results, key=lambda r: (r.get("status") == "stopped", len(r.get("wait_s", []))))
    if cfg.mode != "prep_scaling" and not result.get("wait_s"):
        raise ProfileError(f"the loader yielded no batches in the {cfg.mode} run: nothing to profile")
    ranks = [r for r in results if r.get("wait_s") and r.get("world_size", 1) > 1]
    if len(ranks) > 1:  # a distributed job: every rank's timings; the slowest rank's stand for the job
        ranks.sort(key=lambda r: r.get("rank", 0))
        result = max(ranks, key=lambda r: sum(r["wait_s"]) + sum(r["step_s"]))
        result = {**result, "ranks": ranks}
    return result


class ProgressBar:
    """Progress on stderr fed from the hook's progress file (silent when disabled).

    On a terminal, a tqdm bar; elsewhere (CI logs, ``| tee``) carriage-return bars would run together
    into one long line, so a plain line is printed every ``interval_s`` seconds instead.
    """

    def __init__(
        self, desc: str, enabled: bool, interval_s: float = 5.0, stream: Any = None, unit: str = "iterations"
    ) -> None:
        self._stream = stream or sys.stderr
        self._desc, self._unit = desc.strip(), unit
        self._bar = None
        self._lines = enabled and not self._stream.isatty()
        self._interval_s = interval_s
        self._last_line = time.monotonic()
        self._done = self._total = 0
        self._printed = (-1, -1)
        if enabled and not self._lines:
            from tqdm import tqdm

            self._bar = tqdm(
                total=1, desc=desc, unit="it" if unit == "iterations" else unit, file=self._stream, leave=True
            )

    def update(self, done: int, total: int) -> None:
        self._done, self._total = done, total
        if self._bar is not None:
            self._bar.total = total
            self._bar.n = done
            self._bar.refresh()
        elif self._lines and time.monotonic() - self._last_line >= self._interval_s:
            self._last_line = time.monotonic()
            self._print()

    def _print(self) -> None:
        if (self._done, self._total) == self._printed:
            return
        self._printed = (self._done, self._total)
        print(
            f"dsanalyzer: {self._desc} run: {self._done}/{self._total} {self._unit}",
            file=self._stream,
            flush=True,
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._lines and self._total:
            self._print()
