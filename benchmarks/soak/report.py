"""The soak's report: ``soak.json`` (everything), ``soak.md`` (the tables) and ``soak.png`` (the plot)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(result: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")


def markdown(r: dict[str, Any]) -> str:
    t, f = r["invariants"]["total"], r["faults"]
    lines = [
        "# Soak: every technique at once under seeded faults",
        "",
        f"Command: `{r['command']}`  ",
        f"Host: {r['host']}; started {r['started']} UTC; {r.get('warm_s', 0):.0f} s until every job delivered "
        f"batches, then {r['minutes']:.1f} min of faults (seed {r['seed']}) and {r['settle_s']:.0f} s without; "
        f"verdict: **{'PASS' if r['passed'] else 'FAIL'}**"
        + ("" if r["passed"] else f" ({'; '.join(r['failures'])})"),
        "",
        "Jobs: " + ", ".join(f"`{k}` ({v})" for k, v in r["jobs"].items()),
        "",
        "Left out: " + ("; ".join(r["left_out"]) if r["left_out"] else "nothing"),
        "",
        "## Items",
        "",
        "| lost | duplicated | wrong bytes in a batch | foreign ids | replays that diverged | replayed batches |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {t.get('lost', 0)} | {t.get('duplicated', 0)} | {t.get('wrong_items', 0)} | {t.get('foreign', 0)} | "
        f"{t.get('diverged_replays', 0)} | {sum(j.get('replayed_batches', 0) for j in r['invariants']['jobs'].values())} |",
        "",
        "| job | complete epochs | batches | resumes | loader errors (kinds) | lost | dup | wrong |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for name, j in r["invariants"]["jobs"].items():
        kinds = ", ".join(f"{k} x{v}" for k, v in j.get("error_kinds", {}).items()) or "-"
        lines.append(f"| {name} | {j['complete_epochs']} | {j.get('batches', '')} | {j.get('resumes', '')} | "
                     f"{kinds} | {j['lost']} | {j['duplicated']} | {j.get('wrong_items', '')} |")  # fmt: skip
    lines += ["", "## Faults", "",
              f"Recovery (rate back to 90% of the {r['window_s']:.0f} s before the fault, over {r['window_s']:.0f} s): "
              f"p50 **{f['recovery_p50_s']} s**, max **{f['recovery_max_s']} s**; not back before the run "
              f"ended: {f['not_recovered']}.", "",
              "| fault | injected | survived (0 items lost/dup/wrong) | rate recovered | skipped (no target) | failed to inject |",
              "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for kind, k in sorted(f["by_kind"].items()):
        survived = k["injected"] if r["passed_items"] else "see above"
        lines.append(f"| {kind} | {k['injected']} | {survived} | {k['recovered']} | {k['skipped']} | "
                     f"{k['failed_to_inject']} |")  # fmt: skip
    lines += ["", "## Resources and clean-up", "",
              "| job | RSS MiB first third | last third | max | fds first third | last third | max |",
              "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, s in r["resources"].items():
        lines.append(f"| {name} | {s['rss_mib_first']} | {s['rss_mib_last']} | {s['rss_mib_max']} | "
                     f"{s['fds_first']} | {s['fds_last']} | {s['fds_max']} |")  # fmt: skip
    if r.get("ray"):
        y = r["ray"]
        lines += ["", f"Remote prep (`ray`): {y['remote_batches']} of {y['batches']} batches prepped on the Ray node, "
                  f"{y['redone_batches']} lost with a killed node and prepped again in the trainer; "
                  f"{y['rebuilds']} new loaders once a killed node was back; the node started "
                  f"{y['node_starts']}x."]  # fmt: skip
    c = r["cleanup"]
    lines += ["", f"After the run: /dev/shm new entries {c['shm_left']}, temp entries {c['tmp_left']}, "
              f"processes left {c['procs_left']}, namespaces left {c['netns_left']}.", "",
              "![throughput over time, faults marked](soak.png)", ""]  # fmt: skip
    return "\n".join(lines)


def ray_summary(records: list[dict], node_starts: int) -> dict[str, int]:
    """The ``ray`` job's remote prep over the run, from its log: each loader's counters start at 0."""
    out = {"batches": 0, "remote_batches": 0, "redone_batches": 0, "rebuilds": 0, "node_starts": node_starts}
    last: dict[str, int] = {}
    for rec in records:
        if rec.get("ev") in ("start", "resume") and last:  # a new loader: bank the last one's counters
            out["remote_batches"] += last.get("remote_batches", 0)
            out["redone_batches"] += last.get("remote_redone_batches", 0)
            last = {}
        elif rec.get("ev") == "stats":
            last = rec
        elif rec.get("ev") == "batch":
            out["batches"] += 1
        out["rebuilds"] += rec.get("ev") == "rebuild"
    out["remote_batches"] += last.get("remote_batches", 0)
    out["redone_batches"] += last.get("remote_redone_batches", 0)
    return out


def plot(
    times: dict[str, list[float]], faults: list[dict], t0: float, path: Path, bin_s: float = 5.0
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 5))
    end = max([t0 + 1] + [ts[-1] for ts in times.values() if ts])
    nbins = int((end - t0) / bin_s) + 1
    for name, ts in sorted(times.items()):
        counts = [0] * nbins
        for t in ts:
            counts[int((t - t0) / bin_s)] += 1
        ax.plot([(i + 0.5) * bin_s / 60 for i in range(nbins)], [c / bin_s for c in counts], label=name, lw=1)
    colours: dict[str, Any] = {}
    cmap = plt.get_cmap("tab10")
    for f in faults:
        if "skipped" in f or "error" in f:
            continue
        colour = colours.setdefault(f["kind"], cmap(len(colours) % 10))
        a, b = (f["start"] - t0) / 60, (f["end"] - t0) / 60
        if b - a < 0.05:
            ax.axvline(a, color=colour, lw=0.8, alpha=0.7)
        else:
            ax.axvspan(a, b, color=colour, alpha=0.15)
    handles, labels = ax.get_legend_handles_labels()
    from matplotlib.patches import Patch

    handles += [Patch(color=c, alpha=0.5) for c in colours.values()]
    labels += [f"fault: {k}" for k in colours]
    ax.legend(handles, labels, fontsize=7, ncol=2, loc="upper right")
    ax.set_xlabel("minutes")
    ax.set_ylabel(f"batches / s ({bin_s:.0f} s bins)")
    ax.set_title("soak: each job's throughput, faults marked (lines: instant faults; spans: held faults)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
