"""The text parts of report.html: the summary table, the verdict and the verify result.

Labels are words a reader uses ("Prep stall per iteration"), not report.json keys; every number
carries its unit.
"""

from __future__ import annotations

import html

from dsanalyzer.judge.verdict import workers_noun
from dsanalyzer.model.whatif import format_bytes
from dsanalyzer.report.text import source_line

__all__ = ["summary_table", "verdict_block", "verify_block"]

_RATE_LABELS = {
    "compute": "Compute rate (the step alone)",
    "prep": "Prep rate (the loader alone, data in memory)",
    "fetch": "Storage rate (cold reads)",
    "observed": "Observed rate (the real run)",
}
_STALL_LABELS = {
    "compute": "Compute per iteration",
    "prep_stall": "Prep stall per iteration",
    "fetch_stall": "Fetch stall per iteration",
}


def _rows(pairs: list[tuple[str, str]]) -> str:
    return "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in pairs)


def _storage(machine: dict) -> str:
    device = machine.get("storage_device")
    if isinstance(device, dict):
        device = " ".join(str(device[k]) for k in ("device", "fstype") if device.get(k)) or "unknown"
    note = machine.get("storage_note")
    return f"{device} ({note})" if note else str(device)


def _dataset(data: dict) -> str:
    items = data.get("items")
    if not data.get("avg_item_bytes"):
        return f"{items} items, size unknown: {data.get('size_note') or 'give --data DIR'}"
    where = f" at {data['path']}" if data.get("path") else ""
    how = f" ({data['size_method']})" if data.get("size_method") else ""
    return (
        f"{items} items, {format_bytes(data.get('bytes'))}, {format_bytes(data.get('avg_item_bytes'))} "
        f"per item{where}{how}"
    )


def summary_table(report: dict) -> str:
    """Command, machine, dataset, job, rates and stalls as a two-column table."""
    rates = report.get("rates_per_s") or {}
    per_iter = report.get("per_iter_s") or {}
    spread = report.get("per_iter_spread_s") or {}
    machine = report.get("machine") or {}
    command = report.get("command") or ""
    command = command if isinstance(command, str) else " ".join(map(str, command))
    policy = {"pagecache": "OS page cache", "minio": "coordl MinIO cache"}.get(
        str(report.get("cache_policy")), ""
    )
    pairs = [
        ("Command", command),
        ("Created", str(report.get("created", ""))),
        (
            "Machine",
            f"{machine.get('cpus')} CPUs, {format_bytes(machine.get('memory_bytes'))} memory, "
            f"memory bandwidth {format_bytes(machine.get('mem_bandwidth_bytes_per_s'))}/s",
        ),
        ("Storage", _storage(machine)),
        *([("Source", source_line(report))] if source_line(report) else []),
        *([("Training step", str(machine["compute_note"]))] if machine.get("compute_note") else []),
        ("Dataset", _dataset(report.get("dataset") or {})),
        (
            "Job",
            f"batch {report.get('batch_size')}, {report.get('workers')} {workers_noun(report)}, "
            f"cache {format_bytes(report.get('cache_bytes'))} ({policy})",
        ),
    ]
    pairs += [
        (_RATE_LABELS.get(k, k), f"{float(v):,.1f} samples/s") for k, v in rates.items() if v is not None
    ]
    for k, label in _STALL_LABELS.items():
        if per_iter.get(k) is not None:
            s = spread.get(k) or {}
            extra = (
                f" (p10 {s['p10'] * 1e3:.2f}, p90 {s['p90'] * 1e3:.2f})" if "p10" in s and "p90" in s else ""
            )
            pairs.append((label, f"{per_iter[k] * 1e3:.2f} ms{extra}"))
    return f'<h2>Measurements</h2><table id="summary">{_rows(pairs)}</table>'


def verdict_block(report: dict) -> str:
    """The verdict's numbers: model vs run, the causes it measured, the change to make."""
    v = report.get("verdict")
    if not isinstance(v, dict):
        return ""
    pairs = [
        ("Bound (the verdict)", str(v.get("bound"))),
        ("Bound (the model at the measured rates)", str(v.get("model_bound", v.get("bound")))),
        ("Bound (the stalls as measured)", str(v.get("measured_bound"))),
        *([("Why the bounds differ", str(v["bound_note"]))] if v.get("bound_note") else []),
        ("Model", f"{v['predicted_samples_per_s']:,.1f} samples/s"),
        (
            "Real run",
            f"{v['observed_samples_per_s']:,.1f} samples/s ({v['gap']:+.1%}; its own spread ±{v['spread']:.1%})",
        ),
    ]
    pairs += [("Measured cause", c) for c in v.get("causes") or []]
    if v.get("overhead"):
        pairs.append(("Per-batch overhead", v["overhead"]["text"]))
    fix = v.get("fix")
    if fix:
        pairs.append(("Change", fix["code"]))
        pairs.append(
            (
                "Predicted with the change",
                f"{fix['predicted_samples_per_s']:,.1f} samples/s ({fix['bound']}-bound)",
            )
        )
    return f'<h2>Verdict</h2><table id="verdict">{_rows(pairs)}</table>'


def _runs_note(v: dict) -> str:
    runs, spread = v.get("runs") or [], v.get("measured_range") or []
    if len(runs) < 2 or len(spread) != 2:
        return ""
    return f" (median of {len(runs)} runs: {spread[0]:,.0f}-{spread[1]:,.0f})"


def _baseline_rows(base: dict | None, verdict: str) -> list[tuple[str, str]]:
    """The profiled job run beside the changed one (``verify --baseline``), and the error judged on it."""
    if not isinstance(base, dict):
        return []
    return [
        (
            "Profiled job now",
            f"{base['samples_per_s']:,.1f} samples/s against {base['profile_samples_per_s']:,.1f} in the "
            f"profile ({base['drift'] - 1:+.1%})",
        ),
        (
            "Error, machine as now",
            f"{base['error']:+.1%} (predicted {base['predicted_samples_per_s']:,.1f} samples/s scaled by the drift; "
            f"{verdict} the target)",
        ),
    ]


def verify_block(report: dict) -> str:
    """Predicted vs measured for the changed job (``dsanalyzer verify``)."""
    v = report.get("verify")
    if not isinstance(v, dict):
        return ""
    change = ", ".join(f"{k}={val}" for k, val in (v.get("change") or {}).items()) or "no change"
    verdict = "within" if v.get("within_target") else "outside"
    target = f"±{v.get('target_error', 0.1):.0%} target"
    judged = f"{verdict} the {target}"
    if v.get("baseline"):  # verify --baseline: the target is judged on the machine as it is now
        judged = f"against the machine of the profile; the {target} is judged on the next line"
    pairs = [
        ("Command", " ".join(v.get("command") or [])),
        ("Change", change),
        ("Predicted", f"{v['predicted_samples_per_s']:,.1f} samples/s ({v.get('predicted_bound')}-bound)"),
        ("Measured", f"{v['measured_samples_per_s']:,.1f} samples/s{_runs_note(v)}"),
        ("Error", f"{v['error']:+.1%} ({judged})"),
        *_baseline_rows(v.get("baseline"), verdict),
        ("Iterations", f"{v.get('iters')} measured after {v.get('warmup_iters')} warm-up"),
    ]
    step, then = v.get("step_s_measured"), v.get("step_s_profile")
    if step and then:
        pairs.append(("Step time", f"{step * 1e3:.1f} ms here, {then * 1e3:.1f} ms in the profile's run 2"))
    if v.get("note"):
        pairs.append(("Measured causes", str(v["note"])))
    return f'<h2>Verify: the changed job</h2><table id="verify">{_rows(pairs)}</table>'
