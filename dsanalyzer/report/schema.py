"""report.json: the schema other tools read, its writer and its loader.

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

from dsanalyzer.report.files import atomic_write_text

__all__ = [
    "SCHEMA_VERSION",
    "READABLE_VERSIONS",
    "ReportError",
    "REQUIRED",
    "validate_report",
    "write_report",
    "load_report",
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
    """Fill ``model``, ``whatif`` and ``advice`` from the what-if model (``dsanalyzer.model.whatif``).

    A model that cannot be built (a field it needs was not measurable) leaves an empty grid and a
    note, never a lost measurement.
    """
    report.setdefault("whatif", {"grid": [], "to_compute_bound": {}})
    try:
        from dsanalyzer.judge.verdict import verdict
        from dsanalyzer.model import search
        from dsanalyzer.model.whatif import Model

        model = Model.from_report(report)
        report["model"] = model.params()
        report["whatif"] = {"grid": search.grid(model), "to_compute_bound": search.to_compute_bound(model)}
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
    from dsanalyzer.report.html import write_html

    write_html(report, html_path)
    return json_path, html_path
