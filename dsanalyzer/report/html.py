"""report.html: one self-contained page (inline PNG plots, no network) from a report.json dict.

Plots: the stacked bar of compute / prep stall / fetch stall per iteration (measured, and the model's
prediction for the same configuration), the per-iteration timeline of the real run, what-if curves of
samples/s against cache size (page cache vs MinIO) and against cores, and the system monitor series.
A few lines of JS write ``plots-ok N/M`` into the title once every image has decoded, so a headless
browser test can tell a rendered page from a broken one.
"""

from __future__ import annotations

import base64
import html
import io
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: render to PNG bytes only
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from dsanalyzer.judge.verdict import workers_noun  # noqa: E402
from dsanalyzer.model.whatif import Model, format_bytes  # noqa: E402
from dsanalyzer.report.files import atomic_write_text  # noqa: E402
from dsanalyzer.report.html_tables import summary_table, verdict_block, verify_block  # noqa: E402
from dsanalyzer.report.remedies import remedies_html  # noqa: E402

__all__ = ["write_html", "render_html"]

_COLORS = {"compute": "#4c78a8", "prep_stall": "#f58518", "fetch_stall": "#e45756"}
_STAGES = ("compute", "prep_stall", "fetch_stall")
_LABELS = {"compute": "compute", "prep_stall": "prep stall", "fetch_stall": "fetch stall"}


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _stall_bar(report: dict, model: Model | None) -> Figure:
    bars = {"measured": report.get("per_iter_s") or {}}
    if model is not None:
        bars["model"] = model.predict_measured().per_iter_s
    fig, ax = plt.subplots(figsize=(10, 2.8))
    for i, parts in enumerate(bars.values()):
        left = 0.0
        for stage in _STAGES:
            value = float(parts.get(stage) or 0.0) * 1e3
            ax.barh(i, value, left=left, color=_COLORS[stage], label=_LABELS[stage] if i == 0 else None)
            left += value
    ax.set_yticks(range(len(bars)), list(bars))
    ax.set_xlabel("ms per iteration")
    ax.set_title("Where an iteration's time goes")
    # below the axes: inside, it would cover the end of the bars, where the fetch stall is
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, fontsize=8, frameon=False)
    return fig


def _timeline(report: dict) -> Figure | None:
    runs = report.get("runs") or {}
    name = next((n for n in ("real", "fetch", "prep", "compute") if runs.get(n, {}).get("step_s")), None)
    if name is None:
        return None
    wait = np.asarray(runs[name].get("wait_s") or [], dtype=float) * 1e3
    step = np.asarray(runs[name]["step_s"], dtype=float) * 1e3
    n = min(len(wait), len(step)) if len(wait) else len(step)
    x = np.arange(n)
    fig, ax = plt.subplots(figsize=(10, 3))
    ax.bar(x, step[:n], width=1.0, color=_COLORS["compute"], label="step")
    if len(wait):
        ax.bar(
            x, wait[:n], width=1.0, bottom=step[:n], color=_COLORS["fetch_stall"], label="waiting for data"
        )
    ax.set_xlabel(f"iteration ({name} run, warm-up dropped)")
    ax.set_ylabel("ms")
    ax.set_title("Per-iteration timeline")
    ax.legend(fontsize=8)
    return fig


def _size_unit(n_bytes: float) -> tuple[str, float]:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n_bytes >= scale:
            return unit, scale
    return "B", 1.0


def _compute_lines(ax: Axes, model: Model) -> None:
    ax.axhline(model.compute_per_s, color="grey", lw=0.8, label="compute rate (step alone)")
    effective = model.compute_rate()
    if effective < model.compute_per_s * 0.99:
        ax.axhline(effective, color="grey", lw=0.8, ls="--", label="step + per-batch overhead")


def _whatif_cache(model: Model) -> Figure:
    unit, scale = _size_unit(model.dataset_bytes)
    sizes = np.linspace(0, model.dataset_bytes, 41)
    fig, ax = plt.subplots(figsize=(10, 3.6))
    for policy, style in (("pagecache", "--"), ("minio", "-")):
        rates = [
            model.predict(c, model.cpus, model.storage_bytes_per_s, policy=policy).samples_per_s
            for c in sizes
        ]
        name = "OS page cache (LRU)" if policy == "pagecache" else "coordl MinIO cache"
        ax.plot(sizes / scale, rates, style, label=f"{name}, {model.cpus} cpus")
    _compute_lines(ax, model)
    if model.cache_bytes <= model.dataset_bytes:  # a page-cache budget beyond the dataset is off the axis
        ax.axvline(model.cache_bytes / scale, color="black", lw=0.6, ls=":", label="measured cache")
    ax.set_xlabel(f"cache size ({unit}; dataset {format_bytes(model.dataset_bytes)})")
    ax.set_ylabel("samples/s")
    ax.set_ylim(bottom=0)
    ax.set_title("What if: cache size")
    ax.legend(fontsize=8)
    return fig


def _whatif_cores(model: Model, noun: str) -> Figure:
    cores = np.arange(1, max(32, 2 * model.cpus) + 1)
    fig, ax = plt.subplots(figsize=(10, 3.6))
    for cache, label in (
        (model.cache_bytes, f"cache {format_bytes(model.cache_bytes)}"),
        (model.dataset_bytes, "all in cache"),
    ):
        rates = [
            model.predict(cache, int(c), model.storage_bytes_per_s, policy=model.cache_policy).samples_per_s
            for c in cores
        ]
        ax.plot(cores, rates, marker=".", label=f"{label} ({model.cache_policy})")
    ax.plot(cores, [model.prep.rate(int(c)) for c in cores], ":", label="prep alone (fitted)")
    measured = np.asarray(model.prep_points, dtype=float) if model.prep_points else None
    if measured is not None and measured.size:
        ax.plot(measured[:, 0], measured[:, 1], "ko", label="prep measured")
    _compute_lines(ax, model)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"CPU cores (one of the {noun} per core)")
    ax.set_ylabel("samples/s")
    ax.set_title("What if: cores")
    ax.legend(fontsize=8)
    return fig


def _sysmon(report: dict) -> Figure | None:
    mon = report.get("sysmon") or {}
    t = np.asarray(mon.get("t_s") or [], dtype=float)
    if t.size == 0:
        return None
    fig, axes = plt.subplots(3, 1, figsize=(10, 5.5), sharex=True)
    cpu = np.asarray(mon.get("cpu_percent_per_core") or [], dtype=float)
    if cpu.ndim == 2 and len(cpu) == len(t):
        for core in range(cpu.shape[1]):
            axes[0].plot(t, cpu[:, core], lw=0.8, label=f"cpu{core}")
        axes[0].legend(fontsize=7, ncol=4)
    axes[0].set_ylabel("CPU %")
    other = [np.nan if v is None else v * 100 for v in mon.get("other_cpu_cores") or []]
    if len(other) == len(t):
        axes[0].plot(t, other, "k:", lw=1.0, label="other processes (% of a core)")
        axes[0].legend(fontsize=7, ncol=5)
    for ax, key, label in (
        (axes[1], "disk_read_bytes", "disk read since\nthe start, MB"),
        (axes[2], "page_cache_bytes", "page cache MB"),
    ):
        series = np.asarray(mon.get(key) or [], dtype=float)
        if len(series) == len(t):
            if key == "disk_read_bytes":
                series = series - series[0]  # a version-1 report holds the machine's counter since boot
            ax.plot(t, series / 1e6, lw=1.0)
        ax.set_ylabel(label)
    axes[2].set_xlabel("seconds")
    axes[0].set_title("System during the runs")
    return fig


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dsanalyzer report</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:1em auto;color:#222}}
.bound{{font-size:1.3em;padding:.5em;background:#f3f3f3;border-left:6px solid #e45756}}
table{{border-collapse:collapse}} th,td{{text-align:left;padding:2px 10px;border-bottom:1px solid #ddd}}
img{{width:100%;height:auto;display:block;margin:1em 0}} .note{{color:#777}}</style></head>
<body><h1>dsanalyzer report</h1>
<p class="bound" id="advice">{advice}</p>
{verify}
{summary}
{verdict}
{figures}
<script>
window.addEventListener("load", function () {{
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (im) {{ return im.complete && im.naturalWidth > 0 && im.naturalHeight > 0; }});
  document.title = "plots-ok " + ok.length + "/" + imgs.length;
  document.body.setAttribute("data-plots-ok", ok.length + "/" + imgs.length);
}});
</script></body></html>
"""


def render_html(report: dict) -> str:
    """The report page as a string."""
    figures: list[str] = []
    try:
        model: Model | None = Model.from_report(report)
    except (ValueError, KeyError, TypeError) as e:
        model = None
        figures.append(f'<p class="note">No what-if curves: {html.escape(str(e))}</p>')
    makers = [("stalls", lambda: _stall_bar(report, model)), ("timeline", lambda: _timeline(report))]
    if model is not None:
        makers += [
            ("whatif-cache", lambda: _whatif_cache(model)),
            ("whatif-cores", lambda: _whatif_cores(model, workers_noun(report))),
        ]
    makers.append(("sysmon", lambda: _sysmon(report)))
    for name, make in makers:
        fig = make()
        if fig is not None:
            figures.append(f'<img id="{name}" alt="{name}" src="data:image/png;base64,{_png(fig)}">')
    advice = report.get("advice") or f"{report.get('bound', 'unknown')}-bound"
    return _PAGE.format(
        advice=html.escape(str(advice)),
        verify=verify_block(report),
        summary=summary_table(report),
        verdict=verdict_block(report) + remedies_html(report),
        figures="\n".join(figures),
    )


def write_html(report: dict, path: str | os.PathLike) -> Path:
    """Write the self-contained report page to ``path`` (atomically) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, render_html(report))
    return path
