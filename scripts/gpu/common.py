"""What every section of gpu_check shares: the context it records into, and how it runs programs.

A section runs in a child process of ``scripts/gpu_check.py`` under a time limit. Whatever it recorded
before a timeout or a crash must still reach the report, so :class:`Context` rewrites its JSON file after
every table, note and command (a few KB; atomically, so the parent never reads half a file).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = [
    "Context",
    "Skip",
    "SectionError",
    "SectionTimeout",
    "cli_argv",
    "fmt",
    "kill_tree",
    "median",
    "ratio",
]

ROOT = Path(__file__).resolve().parents[2]
_CLI = re.compile(r"import sys; sys\.argv\[0\] = '([\w-]+)'; ")


class Skip(Exception):
    """The section cannot run on this machine; the message is the one-line reason in the report."""


class SectionError(RuntimeError):
    """A program the section ran failed; the message names it and ends with its last output lines."""


class SectionTimeout(SectionError):
    """A program the section ran overran its share of the section's time (and was stopped)."""


def fmt(x: float | None, digits: int = 1) -> str:
    """A table cell: '-' for a missing or non-finite value, thousands separators otherwise."""
    if x is None or not isinstance(x, (int, float)) or x != x or x in (float("inf"), float("-inf")):
        return "-"
    return f"{x:,.{digits}f}"


def median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def cli_argv(name: str) -> list[str]:
    """argv that runs the project's console script ``name`` with this interpreter.

    The accelerator machine receives the tree, not an installed package, so ``dsanalyzer`` is not on
    its PATH; the entry point is read from pyproject.toml's ``[project.scripts]`` (the public CLI,
    wherever its module lives) and started with ``python -c``.
    """
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = scripts[name].split(":")
    code = f"import sys; sys.argv[0] = {name!r}; from {module} import {func}; sys.exit({func}())"
    return [sys.executable, "-c", code]


class Context:
    """What a section records (tables, notes, the commands it ran) and its scratch folder."""

    def __init__(
        self, name: str, device: str, dry: bool, work: Path, result_path: Path, seconds: float = 600
    ) -> None:
        self.name, self.device, self.dry = name, device, dry
        self.seconds = seconds  # the section's time limit (the parent stops it then)
        self.deadline = time.monotonic() + seconds
        self.work = work
        self.work.mkdir(parents=True, exist_ok=True)
        self.result_path = result_path
        self.root = ROOT
        self.data: dict[str, Any] = {"tables": [], "notes": [], "commands": []}
        self._logs = 0
        self.last_output = ""  # stdout and stderr of the last program run
        self.save()

    def share(self, fraction: float) -> float:
        """That fraction of the section's time limit: a time limit for one of several programs it runs."""
        return fraction * self.seconds

    def remaining(self) -> float:
        """Seconds left before the parent stops this section."""
        return self.deadline - time.monotonic()

    @property
    def env(self) -> dict[str, str]:
        """Children see the tree's packages (and carried wheels) first, whatever their cwd."""
        env = dict(os.environ)
        path = [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def table(self, title: str, header: list[str], rows: list[list[Any]], note: str = "") -> None:
        cells = [[str(c) for c in row] for row in rows]
        self.data["tables"].append({"title": title, "header": header, "rows": cells, "note": note})
        self.save()

    def note(self, text: str) -> None:
        self.data["notes"].append(text)
        self.save()

    def command(self, argv: list[str] | str) -> None:
        """Record a command as a reader would type it (``dsanalyzer ...`` for the project's CLI)."""
        if not isinstance(argv, str):
            m = _CLI.match(str(argv[2])) if len(argv) > 2 and argv[1] == "-c" else None
            argv = ([m.group(1)] + list(argv[3:])) if m else argv
        text = argv if isinstance(argv, str) else " ".join(shlex.quote(str(a)) for a in argv)
        self.data["commands"].append(text.replace(str(ROOT) + "/", ""))
        self.save()

    def run(self, argv: list[str], timeout: float, cpus: int | None = None, check: bool = True) -> str:
        """Run a program (recorded; output kept in the section's folder); its stdout.

        ``cpus``: confine it to the first ``cpus`` cores (the profile's prep scaling then stops there).
        """
        self.command(argv)
        self._logs += 1
        words = [Path(w).name for w in self.data["commands"][-1].split()[:3] if not w.startswith("-")]
        log = self.work / (f"{self._logs:02d}-" + re.sub(r"[^\w.-]+", "-", "-".join(words))[:60] + ".log")
        timeout = max(1.0, min(timeout, self.remaining() - 2))
        cores = set(range(min(cpus, os.cpu_count() or 1))) if cpus else None
        t0 = time.monotonic()
        with subprocess.Popen(
            [str(a) for a in argv], env=self.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
        ) as proc:  # fmt: skip
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_tree(proc)  # the program and what it started (dsanalyzer's job has a session of its own)
                stdout, stderr = proc.communicate()
                log.write_text(f"$ {argv}\n# timed out after {timeout:.0f} s\n{stdout}\n{stderr}")
                raise SectionTimeout(f"stopped after {timeout:.0f} s: {self.data['commands'][-1]}") from None
        log.write_text(f"$ {argv}\n# rc {proc.returncode}, {time.monotonic() - t0:.1f} s\n{stdout}\n{stderr}")
        self.last_output = stdout + stderr
        if check and proc.returncode:
            tail = "\n".join((stdout + stderr).strip().splitlines()[-15:])
            raise SectionError(f"exit code {proc.returncode} from {self.data['commands'][-1]}:\n{tail}")
        return stdout

    def save(self) -> None:
        tmp = self.result_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.result_path)


def kill_tree(proc: subprocess.Popen) -> None:
    """Stop a program that overran: it and every program it started, also those in sessions of their own.

    Programs the section started may have their own process group (``dsanalyzer profile`` puts each run
    of the job in a new session), so the group alone is not enough: the descendants are listed first,
    by id, while their parent links still hold. SIGINT first (Python programs clean up after
    KeyboardInterrupt: the profiler then stops its job), then SIGTERM, then SIGKILL to what is left.
    """
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for sig, grace in ((signal.SIGINT, 5), (signal.SIGTERM, 3), (signal.SIGKILL, 3)):
        alive = [p for p in tree if p.is_running()]
        if not alive:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)
        psutil.wait_procs(alive, timeout=grace)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=1)
