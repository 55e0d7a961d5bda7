"""The verdict's ranked remedies as a table: the terminal's lines and report.html's table with a bar chart.

Both read ``report["verdict"]["remedies"]`` (ranked by :mod:`dsanalyzer.judge.remedies`, the first is the
verdict's fix) and nothing else, so they show what report.json holds. The chart is inline SVG: one bar
per predicted remedy, a line at the job's rate as profiled and one at the compute rate (the most any
data-side remedy can reach).
"""

from __future__ import annotations

import html

from dsanalyzer.judge.remedies import cost_text

__all__ = ["remedies_lines", "remedies_html", "remedies_svg"]

_COLUMNS = ("#", "remedy", "predicted samples/s", "bound", "costs", "apply")


def _rows(report: dict) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for n, r in enumerate((report.get("verdict") or {}).get("remedies") or [], 1):
        rate = "unknown" if r.get("samples_per_s") is None else f"{r['samples_per_s']:,.0f}"
        apply = str(r.get("code") or "") or ", ".join(
            f"{k}={v}" for k, v in (r.get("loader_args") or {}).items()
        )
        if r.get("switch_to") and r["switch_to"] not in apply:
            apply += f" (switch to {r['switch_to']})"
        rows.append(
            (
                str(n),
                r["name"],
                rate,
                str(r.get("bound") or "-"),
                cost_text(r.get("cost") or {}) or "-",
                apply,
            )
        )
    return rows


def remedies_lines(report: dict) -> list[str]:
    """The ranked remedies as an aligned text table (no lines when there are none)."""
    rows = _rows(report)
    if not rows:
        return []
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(_COLUMNS)]
    right = {0, 2}

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    out = ["remedies, best first (the first is the fix):", "  " + line(_COLUMNS).rstrip()]
    out += ["  " + line(r).rstrip() for r in rows]
    for n, r in enumerate((report.get("verdict") or {}).get("remedies") or [], 1):
        if r.get("samples_per_s") is None and r.get("why_unknown"):
            out.append(f"  {n}. {r['name']} unknown: {r['why_unknown']}")
    return out


def remedies_svg(report: dict, width: int = 640, bar_h: int = 22) -> str:
    """Horizontal bars of the predicted remedies' samples/s, with the job's and the compute rate marked."""
    v = report.get("verdict") or {}
    known = [r for r in v.get("remedies") or [] if r.get("samples_per_s") is not None]
    if not known:
        return ""
    now = float(v.get("predicted_samples_per_s") or 0.0)
    ceiling = max([now, *(float(r["samples_per_s"]) for r in known)]) * 1.1 or 1.0
    label_w, top = 120, 18
    plot_w = width - label_w - 80
    height = top + bar_h * len(known) + 24

    def x(rate: float) -> float:
        return label_w + plot_w * rate / ceiling

    parts = [
        f'<svg id="remedies-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12" role="img" aria-label="predicted samples/s per remedy">',
        f'<text x="{label_w}" y="12">predicted samples/s (the grey line: the job as profiled, {now:,.0f})</text>',
    ]
    for i, r in enumerate(known):
        y, rate = top + i * bar_h, float(r["samples_per_s"])
        colour = "#2a7" if r.get("bound") == "compute" else "#48c"
        parts += [
            f'<text x="{label_w - 6}" y="{y + bar_h * 0.65:.0f}" text-anchor="end">{html.escape(r["name"])}</text>',
            f'<rect class="bar" x="{label_w}" y="{y + 3}" width="{x(rate) - label_w:.1f}" '
            f'height="{bar_h - 6}" fill="{colour}"><title>{html.escape(r.get("code") or r["name"])}</title></rect>',
            f'<text x="{x(rate) + 4:.1f}" y="{y + bar_h * 0.65:.0f}">{rate:,.0f}</text>',
        ]
    bottom = top + bar_h * len(known)
    parts.append(
        f'<line x1="{x(now):.1f}" y1="{top}" x2="{x(now):.1f}" y2="{bottom}" stroke="#888" stroke-dasharray="4 3"/>'
    )
    parts.append("</svg>")
    return "".join(parts)


def remedies_html(report: dict) -> str:
    """The ranked remedies' table and bar chart (empty when the verdict lists none)."""
    rows = _rows(report)
    if not rows:
        return ""
    remedies = (report.get("verdict") or {}).get("remedies") or []
    head = "".join(f"<th>{html.escape(c)}</th>" for c in (*_COLUMNS, "note"))
    body = []
    for cells, r in zip(rows, remedies, strict=True):
        note = r.get("why_unknown") or r.get("note") or ""
        tds = "".join(f"<td>{html.escape(c)}</td>" for c in cells[:5])
        body.append(
            f"<tr>{tds}<td><code>{html.escape(cells[5])}</code></td><td>{html.escape(note)}</td></tr>"
        )
    return (
        '<h2>Remedies, best first</h2><p class="note">The first is the verdict\'s fix: those that remove the '
        "stall, cheapest first, then the rest, fastest first.</p>"
        f'<table id="remedies"><tr>{head}</tr>{"".join(body)}</table>{remedies_svg(report)}'
    )
