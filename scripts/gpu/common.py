"""What every section of gpu_check shares: the context it records into, and how it runs programs.

A section runs in a child process of ``scripts/gpu_check.py`` under a time limit. Whatever it recorded
before a timeout or a crash must still reach the report, so :class:`Context` rewrites its JSON file after
every table, note and command (a few KB; atomically, so the parent never reads half a file).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["Context", "Skip", "SectionError", "cli_argv", "fmt", "median", "ratio"]

ROOT = Path(__file__).resolve().parents[2]
_CLI = re.compile(r"import sys; sys\.argv\[0\] = '([\w-]+)'; ")


class Skip(Exception):
    """The section cannot run on this machine; the message is the one-line reason in the report."""


class SectionError(RuntimeError):
    """A program the section ran failed; the message names it and ends with its last output lines."""


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

    def __init__(self, name: str, device: str, dry: bool, work: Path, result_path: Path) -> None:
        self.name, self.device, self.dry = name, device, dry
        self.work = work
        self.work.mkdir(parents=True, exist_ok=True)
        self.result_path = result_path
        self.root = ROOT
        self.data: dict[str, Any] = {"tables": [], "notes": [], "commands": []}
        self._logs = 0
        self.last_output = ""  # stdout and stderr of the last program run
        self.save()

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
        log = self.work / f"{self._logs:02d}-{Path(str(argv[min(len(argv) - 1, 2)])).name[:40]}.log"
        cores = set(range(min(cpus, os.cpu_count() or 1))) if cpus else None
        t0 = time.monotonic()
        try:
            res = subprocess.run(
                [str(a) for a in argv], env=self.env, cwd=ROOT, capture_output=True, text=True,
                timeout=timeout, check=False, preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
            )  # fmt: skip
        except subprocess.TimeoutExpired as e:
            raise SectionError(f"{argv[0]} ... timed out after {timeout:.0f} s") from e
        log.write_text(f"$ {argv}\n# rc {res.returncode}, {time.monotonic() - t0:.1f} s\n{res.stdout}\n{res.stderr}")
        self.last_output = res.stdout + res.stderr
        if check and res.returncode:
            tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-15:])
            raise SectionError(f"exit code {res.returncode} from {self.data['commands'][-1]}:\n{tail}")
        return res.stdout

    def save(self) -> None:
        tmp = self.result_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.result_path)
