"""The machine's description and the Markdown report of a gpu_check run (reports/gpu/<date>-<gpu>.md)."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["machine_info", "markdown", "report_path", "tree_commit"]

DISTS = ("torch", "numpy", "pillow", "simplejpeg", "redis", "hiredis", "lmdb", "psutil", "pytest", "pytest-timeout",
         "nvidia-dali-cuda130")  # fmt: skip


def _version(dist: str) -> str:
    """The distribution's version, '(carried)' when it came from .whl/, or 'missing'."""
    from importlib import metadata

    try:
        d = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return "missing"
    carried = "coordl-gpu-site" in str(getattr(d, "_path", ""))
    return d.version + (" (carried)" if carried else "")


def tree_commit(root: Path) -> str:
    """The commit the tree was at: git's, and what ``make gpu-wheels`` wrote into .whl/TREE where that differs.

    A copy sent to the device machine may carry a .git of another commit than its files (seen: git said
    c253521-dirty for a tree at db37202), so both are shown when they disagree."""
    stamp_path = root / ".whl" / "TREE"
    stamp = stamp_path.read_text().strip() if stamp_path.exists() else None
    git = None
    if shutil.which("git") and (root / ".git").exists():
        res = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"], capture_output=True,
                             text=True, check=False)  # fmt: skip
        git = res.stdout.strip() if res.returncode == 0 else None
    if git and stamp and not git.startswith(stamp):
        return f"{git} (git in this copy); {stamp} (.whl/TREE, written by make gpu-wheels)"
    if git:
        return git
    return f"{stamp} (from .whl/TREE)" if stamp else "unknown"


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "?"
    m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return m.group(1).strip() if m else "?"


def machine_info(root: Path) -> dict[str, str]:
    """What the report's readers need to weigh its numbers: GPU, driver, torch/CUDA, CPUs, memory, tree."""
    import torch

    info = {"date (UTC)": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info["GPU"] = f"{p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs"
        smi = shutil.which("nvidia-smi")
        if smi:
            res = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                 text=True, check=False)  # fmt: skip
            info["driver"] = res.stdout.strip() or "?"
        info["CUDA (torch)"] = f"{torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
    else:
        info["GPU"] = "none (CPU dry run)"
    info["torch"] = torch.__version__
    info["Python"] = f"{platform.python_version()} ({sys.executable})"
    info["CPUs"] = f"{os.cpu_count()} x {_cpu_model()}"
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        info["memory"] = f"{pages / 2**30:.0f} GiB"
    except (ValueError, OSError):
        pass
    info["kernel"] = platform.release()
    import importlib.util

    try:
        crop = (
            "built"
            if importlib.util.find_spec("coordl.prep._cropjpeg")
            else "not built (whole-image decodes)"
        )
    except Exception as e:  # noqa: BLE001 - coordl itself does not import: the sections will say why
        crop = f"coordl does not import: {type(e).__name__}: {e}"
    info["coordl crop decoder"] = crop
    info["tree"] = tree_commit(root)
    info["packages"] = ", ".join(f"{d} {_version(d)}" for d in DISTS)
    return info


def report_path(folder: Path, gpu_name: str, now: datetime) -> Path:
    """reports/gpu/<date>-<gpu>.md; a second run on the same day and GPU gets the time appended."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "gpu"
    path = folder / f"{now:%Y-%m-%d}-{slug}.md"
    return path if not path.exists() else folder / f"{now:%Y-%m-%d-%H%M%S}-{slug}.md"


def _table(t: dict) -> list[str]:
    def cell(c: str) -> str:
        return str(c).replace("|", "\\|").replace("\n", " ")

    lines = [f"**{t['title']}**", "", "| " + " | ".join(map(cell, t["header"])) + " |",
             "|" + "---|" * len(t["header"])]  # fmt: skip
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in t["rows"]]
    return lines + ([""] + [t["note"]] if t.get("note") else []) + [""]


def markdown(
    title: str, command: str, machine: dict[str, str], sections: list[dict], commands: bool = True
) -> str:
    """The whole report: machine, a summary line per section, then each section's tables and commands."""
    out = [f"# {title}", "", f"Command: `{command}`", "", "| machine | |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in machine.items()]
    out += ["", "| section | status | seconds | budget s |", "|---|---|---|---|"]
    out += [f"| {s['name']} | {s['status']} | {s['seconds']:.0f} | {s['budget']:.0f} |" for s in sections]
    for s in sections:
        out += ["", f"## {s['name']}: {s['title']}", "", f"Status: **{s['status']}** ({s['seconds']:.0f} s)."]
        if s.get("reason"):
            out += ["", "```", s["reason"].strip(), "```"]
        out += [""] + [f"- {n}" for n in s.get("notes", [])] + [""]
        for t in s.get("tables", []):
            out += _table(t)
        if commands and s.get("commands"):
            out += ["Commands (from the repository root):", "", "```"] + s["commands"] + ["```"]
    return "\n".join(out).rstrip() + "\n"
