"""The terminal's text: the profile's summary and the verify result, one line per fact.

Both read only the report (a dict): what they print is in report.json too.
"""

from __future__ import annotations

from dsanalyzer.judge.skew import SKEW_LOSS
from dsanalyzer.report.remedies import remedies_lines

__all__ = ["summary_text", "verify_text", "source_line", "spread_line"]


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
    source = source_line(report)
    if source:
        lines.append(f"source: {source}")
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
    lines += _cpu_lines(report)
    spread = spread_line(report)
    if spread:
        lines.append(spread)
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
    lines += remedies_lines(report)
    return "\n".join(lines)


def source_line(report: dict) -> str:
    """Where the items come from when that is a bucket: the bucket, its objects, the probe and the fitted store
    ("" for files)."""
    src = report.get("source") or {}
    if src.get("kind") != "bucket":
        return ""
    text = f"bucket {src.get('url')} at {src.get('endpoint') or 'the default endpoint'}, {src.get('objects', '?')} objects"
    if src.get("mean_object_bytes"):
        text += f" of {src['mean_object_bytes'] / 1e3:,.1f} kB on average"
    if src.get("probe_error"):
        return f"{text}; not probed: {src['probe_error']}"
    m, check = src.get("model") or {}, src.get("check") or {}
    lower = m.get("request_rate_is_lower_bound") or m.get("bandwidth_is_lower_bound")
    text += (
        f"; probed: {m.get('latency_s', 0) * 1e3:.1f} ms round trip, {_stream(m.get('stream_bytes_per_s'))}, "
        f"{m.get('request_rate', 0):,.0f} requests/s and {m.get('bandwidth_bytes_per_s', 0) / 1e6:,.1f} MB/s"
        + (" or more (ceiling not reached)" if lower else " at most")
    )
    if check:
        text += (
            f"; at the loader's {check['concurrency']} requests in flight the model gives "
            f"{check['predicted_items_per_s']:,.1f} items/s, the probe measured {check['measured_items_per_s']:,.1f} "
            f"({check['error']:+.1%}, spread ±{check['spread']:.0%}, {check['bound']}-bound)"
        )
    return text


def _stream(bytes_per_s: float | None) -> str:
    if not bytes_per_s or bytes_per_s >= 1e14:  # model.store.fit: whole objects came as fast as 1-byte ranges
        return "one stream's speed not measurable at this object size"
    return f"one stream {bytes_per_s / 1e6:,.1f} MB/s"


def _cpu_lines(report: dict) -> list[str]:
    """The main process's own CPU per batch and the data path's per sample (what the cores axis uses)."""
    mp = report.get("main_process") or {}
    params = report.get("model") or {}
    if mp.get("receive_cpu_s_per_batch") is None and mp.get("step_cpu_s_per_batch") is None:
        return []
    line = (
        f"main process (its own CPU per batch): receiving {_ms(mp.get('receive_cpu_s_per_batch'))} | "
        f"step {_ms(mp.get('step_cpu_s_per_batch'))}"
    )
    if params.get("prep_cpu_s"):
        line += f"; data path {params['prep_cpu_s'] * 1e3:.2f} ms CPU per sample"
    if params.get("cpu_share") is not None and "cpu_share" in params:
        cores = (report.get("machine") or {}).get("cpus", "?")
        line += f"; the loader alone kept {params['cpu_share']:.0%} of its {cores} cores busy (the rest: other processes, or idle)"
    return [line]


def spread_line(report: dict) -> str:
    """The text report's line: the measured spread and what in-order hand-out loses ("" when unmeasured)."""
    spread = report.get("prep_spread") or {}
    if not spread.get("n"):
        return f"per-sample prep spread: not measured ({spread['error']})" if spread.get("error") else ""
    ratio = spread.get("p99_over_p50")
    line = (
        f"per-sample prep ({spread['n']} items, CPU): p50 {spread['p50_s'] * 1e3:.2f} ms | p90 "
        f"{spread['p90_s'] * 1e3:.2f} ms | p99 {spread['p99_s'] * 1e3:.2f} ms | max {spread['max_s'] * 1e3:.2f} ms"
        + (f" (p99/p50 {ratio:.1f}x)" if ratio else "")
    )
    skew = (report.get("verdict") or {}).get("skew")
    if skew:
        if skew["binds"]:
            binds = "binds"
        elif skew["loss"] < SKEW_LOSS:
            binds = f"under the {SKEW_LOSS:.0%} that names skew"
        else:
            binds = "the loader hands out in any order" if not skew["in_order"] else "not prep-bound"
        line += (
            f"; in-order hand-out of batches of {skew['batch_size']} over {skew['workers']} workers loses "
            f"{skew['loss']:.1%} ({binds})"
        )
    return line


def verify_text(v: dict) -> str:
    """Predicted vs measured, side by side, for the terminal."""
    change = ", ".join(f"{k}={val}" for k, val in (v.get("change") or {}).items()) or "no change"
    mark = "within" if v["within_target"] else "outside"
    n = len(v.get("runs") or [None])
    how = f"median of {n} runs, " if n > 1 else ""
    judged = f"{mark} the ±{v['target_error']:.0%} target"
    if v.get("baseline"):  # verify --baseline: the target is judged on the baseline line below
        judged = "against the machine of the profile"
    text = (
        f"verify ({change}): predicted {v['predicted_samples_per_s']:,.1f} samples/s "
        f"({v['predicted_bound']}-bound) | measured {v['measured_samples_per_s']:,.1f} samples/s | "
        f"error {v['error']:+.1%} ({judged}; "
        f"{how}{v['iters']} iterations after {v['warmup_iters']} warm-up)"
    )
    split = v.get("remote_split")
    if split and split.get("predicted_remote_samples_per_s") is not None:  # coordl's remote_prep=
        text += (
            f"\n  remote CPUs: {split['measured_remote_samples_per_s']:,.1f} samples/s "
            f"(predicted {split['predicted_remote_samples_per_s']:,.1f}); local workers: "
            f"{split['measured_local_samples_per_s']:,.1f} (predicted {split['predicted_local_samples_per_s']:,.1f})"
        )
    base = v.get("baseline")
    if base:  # the profiled job run beside the changed one (verify --baseline)
        text += (
            f"\n  baseline: the profiled job ran {base['samples_per_s']:,.1f} samples/s beside these runs "
            f"against {base['profile_samples_per_s']:,.1f} in the profile ({base['drift'] - 1:+.1%}); "
            f"scaled by that, predicted {base['predicted_samples_per_s']:,.1f}, error {base['error']:+.1%} "
            f"({mark} the target)"
        )
    note = v.get("note", "")  # verify_result's measured causes, empty within the target
    return f"{text}\n  note: {note}" if note else text
