"""``dsanalyzer fix``'s terminal output: the rounds as one table, the speedup, and the change to keep.

Reads only the result ``fix`` returns (what ``fix.json`` holds).
"""

from __future__ import annotations

__all__ = ["fix_text"]

_HEAD = ("round", "change", "predicted", "measured", "kept alone", "vs yours", "result")
Row = tuple[str, str, str, str, str, str, str]


def _table(rows: list[Row]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(_HEAD)]
    right = {0, 2, 3, 4, 5}

    def line(cells: Row) -> str:
        padded = (
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )
        return "  ".join(padded).rstrip()

    return [line(_HEAD), *(line(r) for r in rows)]


def _plan_lines(result: dict) -> list[str]:
    lines = [
        f"the job as profiled: {result['predicted_samples_per_s']:,.0f} samples/s predicted ({result.get('bound')}-bound); "
        f"plan (each step predicted for the job with the ones before it; {result['cpus']} cpus):"
    ]
    for n, s in enumerate(result["plan"], 1):
        lines.append(
            f"  {n}. {s['code']}: predicted {s['predicted_samples_per_s']:,.0f} samples/s ({s['bound']}-bound)"
        )
    return lines


def _nothing(result: dict) -> str:
    return (
        f"dsanalyzer fix: the job is {result.get('bound')}-bound at {result['predicted_samples_per_s']:,.0f} "
        f"samples/s and no change the hook can make on this machine ({result['cpus']} cpus) is predicted to "
        "speed it up: nothing changed (the verdict's remedies in the report name what would need more than this machine)"
    )


def _online_text(result: dict) -> str:
    """``fix --online``: the tuner's changes, one row each, against your settings in the same run."""
    base = result["base_samples_per_s"]
    rows: list[Row] = [("0", "your configuration", "", f"{base:,.0f}", "", "1.00x", "epoch 1")]
    for r in result["rounds"]:
        rows.append((str(r["round"]), r["change"], f"{r['predicted_samples_per_s']:,.0f}",
                     f"{r['measured_samples_per_s']:,.0f}", f"{r['before_samples_per_s']:,.0f}",
                     f"{r['speedup']:.2f}x", f"{r['status']} (epoch {r['epoch'] + 1})"))  # fmt: skip
    ended = "nothing left to try" if result["settled"] else f"stopped at --epochs {result['most_epochs']}"
    lines = [
        f"dsanalyzer fix --online: one run of {result['epochs']} epoch(s) in {result['wall_s']:.0f} s on "
        f"{result['cpus']} cpus ({ended}); the loader tuned itself (coordl.DataLoader(tune=True)), each change "
        "tried at an epoch's start and kept only if that epoch measured 3% faster; samples/s",
        *_table(rows),
        f"final: {result['speedup']:.2f}x your configuration ({result['final_samples_per_s']:,.0f} vs {base:,.0f} "
        "samples/s, in the same run)",
    ]
    return "\n".join(lines + _keep_lines(result))


def _keep_lines(result: dict) -> list[str]:
    if "patch" not in result:
        return ["no change measured faster than your configuration: keep the script as it is"]
    if result["patch"]:
        return ["the change to keep:", result["patch"].rstrip("\n")]
    return [
        "the change to keep (the loader's call site was not found in a readable script):",
        *(f"  {line}" for line in result["lines_to_add"]),
    ]


def fix_text(result: dict) -> str:
    """The plan (``--dry-run``), or the rounds' table, the speedup and the patch (``--online``: the tuner's)."""
    if result.get("online"):
        return _online_text(result)
    if not result["plan"]:
        return _nothing(result)
    if result["dry_run"]:
        return "\n".join(
            [*_plan_lines(result), "dry run: nothing was run (drop --dry-run to apply and measure it)"]
        )
    base = result["base_samples_per_s"]
    rows: list[Row] = [("0", "your configuration", f"{result['predicted_samples_per_s']:,.0f}", f"{base:,.0f}", "",
                        "1.00x", "")]  # fmt: skip
    for r in result["rounds"]:
        rows.append((str(r["round"]), r["change"], f"{r['predicted_samples_per_s']:,.0f}",
                     f"{r['measured_samples_per_s']:,.0f}", f"{r['before_samples_per_s']:,.0f}",
                     f"{r['speedup']:.2f}x", r["status"]))  # fmt: skip
    runs = result["runs"]
    lines = [
        f"dsanalyzer fix: {len(result['rounds'])} round(s) on {result['cpus']} cpus; samples/s, "
        f"{'median of ' + str(runs) + ' runs' if runs > 1 else 'one run'} each, {result['iters']} iterations "
        f"after {result['warmup_iters']} warm-up; each round runs the changes kept before it with its step "
        "(measured) and without it (kept alone; round 1: your configuration), alternately",
        *_table(rows),
        f"final: {result['speedup']:.2f}x your configuration ("
        + (
            f"{result['final_samples_per_s']:,.0f} vs {base:,.0f} samples/s)"
            if sum(r["status"] == "kept" for r in result["rounds"]) <= 1
            else "the kept rounds' ratios multiplied, each measured within its round)"
        ),
    ]
    kept = [r for r in result["rounds"] if r["status"] == "kept"]
    if result.get("stopped") and kept and kept[-1].get("predicted_bound") not in (None, "compute"):
        lines.append(
            f"then {kept[-1]['predicted_bound']}-bound by the model: no further change the hook can make on this "
            "machine is predicted to gain 2% or more (the report's remedies name what would need more)"
        )
    return "\n".join(lines + _keep_lines(result))
