"""report.json: the schema other tools read, its writer, its loader, and the terminal summary.

``schema_version`` 2 (version 1 reports, which lack ``verdict`` and count ``sysmon.disk_read_bytes``
from boot, are still read). Required fields (other tools code against them): ``schema_version``,
``batch_size``, ``rates_per_s`` {compute, prep, fetch, observed} in samples/s, ``per_iter_s``
{compute, prep_stall, fetch_stall} in seconds (medians), ``bound`` (compute|prep|fetch), ``whatif``
{grid, to_compute_bound}. The full layout is in ``docs/dsanalyzer.md``.

:func:`load_report` refuses a report of another version, or a file that is not a JSON object, with an
error that names the file (and both versions), instead of failing later on a missing key.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from dsanalyzer.files import atomic_write_text

__all__ = [
    "SCHEMA_VERSION",
    "READABLE_VERSIONS",
    "ReportError",
    "REQUIRED",
    "validate_report",
    "write_report",
    "load_report",
    "summary_text",
    "attach_model",
]

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)

# field -> required sub-fields
REQUIRED: dict[str, tuple[str, ...]] = {
    "schema_version": (),
    "batch_size": (),
    "rates_per_s": ("compute", "prep", "fetch", "observed"),
    "per_iter_s": ("compute", "prep_stall", "fetch_stall"),
    "bound": (),
    "whatif": ("grid",),
}


class ReportError(ValueError):
    """A report.json that cannot be used: unreadable, another schema version, or missing fields."""


def validate_report(report: Any, where: str = "report") -> dict:
    """Check the version and required fields; returns the report, raises :class:`ReportError`."""
    if not isinstance(report, dict):
        raise ReportError(f"{where}: a report is a JSON object, got {type(report).__name__}")
    version = report.get("schema_version")
    if version not in READABLE_VERSIONS:
        if isinstance(version, int) and version > SCHEMA_VERSION:
            age = "a newer dsanalyzer; upgrade dsanalyzer to read it"
        elif version is None:
            age = "no schema_version field: not a dsanalyzer report, or one from before versions"
        else:
            age = "an older dsanalyzer; re-run `dsanalyzer profile` with this version"
        raise ReportError(
            f"{where}: schema_version is {version!r}, this dsanalyzer reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))} ({age})"
        )
    missing = []
    for key, subkeys in REQUIRED.items():
        if key not in report:
            missing.append(key)
        elif subkeys:
            node = report[key]
            missing += [f"{key}.{s}" for s in subkeys if not isinstance(node, dict) or s not in node]
    if missing:
        raise ReportError(f"{where}: missing required field(s) {', '.join(missing)}")
    if report["bound"] not in ("compute", "prep", "fetch"):
        raise ReportError(f"{where}: bound is {report['bound']!r}, expected compute, prep or fetch")
    return report


def load_report(path: str | os.PathLike) -> dict:
    """Read and validate a report.json (errors name the file)."""
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ReportError(f"{path}: cannot read the report: {e.strerror or e}") from e
    except UnicodeDecodeError:
        raise ReportError(f"{path}: not a report.json (binary content, not UTF-8 text)") from None
    try:
        report = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from e
    return validate_report(report, str(path))


def attach_model(report: dict) -> dict:
    """Fill ``model``, ``whatif`` and ``advice`` from the what-if model (``dsanalyzer.whatif``).

    A model that cannot be built (a field it needs was not measurable) leaves an empty grid and a
    note, never a lost measurement.
    """
    report.setdefault("whatif", {"grid": [], "to_compute_bound": {}})
    try:
        from dsanalyzer.verdict import verdict
        from dsanalyzer.whatif import Model

        model = Model.from_report(report)
        report["model"] = model.params()
        report["whatif"] = {"grid": model.grid(), "to_compute_bound": model.to_compute_bound()}
        report["verdict"] = verdict(report)
        report["advice"] = report["verdict"]["sentence"]
    except (ImportError, ValueError, KeyError, TypeError, ZeroDivisionError) as e:
        report["model"] = {"error": f"{type(e).__name__}: {e}"}
        report["advice"] = f"{report.get('bound', 'unknown')}-bound as measured; no what-if model: {e}"
        print(f"dsanalyzer: what-if model not available: {e}", file=sys.stderr)
    return report


def write_report(report: dict, out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Validate, then write ``report.json`` and the self-contained ``report.html`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    validate_report(report, str(out / "report.json"))
    json_path = out / "report.json"
    atomic_write_text(json_path, json.dumps(report, indent=1, allow_nan=True) + "\n")
    html_path = out / "report.html"
    from dsanalyzer.html import write_html

    write_html(report, html_path)
    return json_path, html_path


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f} ms"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def summary_text(report: dict) -> str:
    """A short terminal summary: stalls per iteration and epoch, rates, what binds and what to do."""
    per = report["per_iter_s"]
    spread = report.get("per_iter_spread_s", {})
    rates = report["rates_per_s"]
    ds = report.get("dataset", {})
    epoch = report.get("per_epoch_s", {})
    lines = [
        f"batch {report['batch_size']}, {report.get('workers', '?')} workers, "
        f"{report.get('machine', {}).get('cpus', '?')} cpus; dataset {ds.get('items', '?')} items, "
        f"{ds.get('bytes', 0) / 1e6:.1f} MB at {ds.get('path') or '?'}",
    ]
    machine = report.get("machine") or {}
    lines += [
        f"{what}: {machine[key]}"
        for what, key in (("storage", "storage_note"), ("step", "compute_note"))
        if machine.get(key)
    ]
    cells = []
    for key, label in (("compute", "compute"), ("prep_stall", "prep stall"), ("fetch_stall", "fetch stall")):
        sp = spread.get(key, {})
        cells.append(f"{label} {_ms(per[key])} (p10 {_ms(sp.get('p10'))}, p90 {_ms(sp.get('p90'))})")
    lines.append("per iteration: " + " | ".join(cells))
    if epoch:
        lines.append(
            f"per epoch ({epoch.get('iters', '?')} iterations): compute {epoch['compute']:.1f} s | "
            f"prep stall {epoch['prep_stall']:.1f} s | fetch stall {epoch['fetch_stall']:.1f} s | "
            f"total {epoch['total']:.1f} s"
        )
    lines.append(
        "rates (samples/s): "
        + " | ".join(f"{k} {_rate(rates.get(k))}" for k in ("compute", "prep", "fetch", "observed"))
    )
    comm = report.get("comm")
    if isinstance(comm, dict):
        for row in comm.get("per_rank") or []:
            mark = " (slowest)" if row["rank"] == comm.get("slowest_rank") else ""
            lines.append(
                f"rank {row['rank']}{mark}: compute {_ms(row['compute_s'])} | prep stall {_ms(row['prep_stall_s'])} | "
                f"fetch stall {_ms(row['fetch_stall_s'])} | communication stall {_ms(row['comm_stall_s'])}"
            )
        lines.append(
            f"communication per iteration: {_ms(comm['per_iter_s']['comm_total'])} in collectives, "
            f"{_ms(comm['per_iter_s']['comm_stall'])} exposed ({comm.get('bytes_per_iter', 0) / 1e6:.2f} MB)"
        )
    lines.append(f"stalls as measured: {report['bound']}-bound")
    lines.append(f"verdict: {report.get('advice', '')}".rstrip())
    return "\n".join(lines)
