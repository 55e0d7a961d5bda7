"""The soak's invariants, read back from the jobs' JSON-lines logs, the fault log and the monitor samples.

- **Exactly once**: each complete epoch of a job delivered every item of its share once (ids); a
  partitioned pair's two shards of one epoch together are the whole dataset.
- **No wrong bytes**: no delivered item's bytes hashed other than its index's (the ``bad`` lists).
- **Exact resume**: a batch (epoch, step) delivered again after a resume from a checkpoint holds the
  same ids as when it was first delivered (the resumed job continues with the items after the checkpoint).
- **Recovery**: per fault and affected job, the time from the fault's end until the job's rate over a
  ``window_s`` window is back to 90% of its rate over the ``window_s`` before the fault started.
- **Bounded resources**: RSS and open descriptors of each job's process tree, early vs late in the run.
"""

from __future__ import annotations

import bisect
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any


def read_jsonl(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # the last line of a SIGKILLed incarnation may be torn
            continue
    return out


def job_epochs(records: list[dict]) -> dict[str, Any]:
    """Committed batches per epoch, replays checked, wrong items collected."""
    delivered: dict[tuple[int, int], list[int]] = {}
    ended: dict[int, int] = {}
    diverged, replayed, wrong, times = [], 0, [], []
    for r in records:
        ev = r.get("ev")
        if ev == "batch":
            key = (r["epoch"], r["step"])
            times.append(r["t"])
            if r["bad"]:
                wrong.append({"epoch": r["epoch"], "step": r["step"], "bad": r["bad"], "t": r["t"]})
            if key in delivered:
                replayed += 1
                if delivered[key] != r["ids"]:
                    diverged.append(
                        {"epoch": key[0], "step": key[1], "first": delivered[key], "again": r["ids"]}
                    )
            delivered[key] = r["ids"]
        elif ev == "epoch_end":
            ended[r["epoch"]] = r["steps"]
    epochs: dict[int, list[int]] = {}
    for e, steps in ended.items():
        ids: list[int] = []
        for s in range(1, steps + 1):
            ids += delivered.get((e, s), [])
        epochs[e] = ids
    return {"epochs": epochs, "diverged": diverged, "replayed": replayed, "wrong": wrong, "times": sorted(times),
            "errors": [r["what"] for r in records if r.get("ev") == "error"],
            "resumes": sum(1 for r in records if r.get("ev") == "resume"),
            "stats": [r for r in records if r.get("ev") == "stats"]}  # fmt: skip


def exactly_once(ids: list[int], expected: set[int]) -> dict[str, int]:
    c = Counter(ids)
    return {"lost": len(expected - set(c)), "duplicated": sum(v - 1 for v in c.values() if v > 1),
            "foreign": sum(v for k, v in c.items() if k not in expected)}  # fmt: skip


def check_jobs(logs: dict[str, list[dict]], n: int, pairs: list[list[str]]) -> dict[str, Any]:
    everything = set(range(n))
    paired = {name for p in pairs for name in p}
    per_job, total = {}, Counter()
    parsed = {name: job_epochs(recs) for name, recs in logs.items()}
    for name, j in parsed.items():
        counts, bad_epochs = Counter(), []
        for e, ids in j["epochs"].items():
            expected = set(ids) if name in paired else everything  # a rank's shard: checked with its pair
            res = exactly_once(ids, expected)
            if name in paired:
                res = {"lost": 0, "duplicated": res["duplicated"], "foreign": 0}
            counts.update(res)
            if any(res.values()) and len(bad_epochs) < 10:
                bad_epochs.append({"epoch": e, "items": len(ids), **res})
        per_job[name] = {"complete_epochs": len(j["epochs"]), "batches": len(j["times"]), **counts,
                         "wrong_items": sum(len(w["bad"]) for w in j["wrong"]), "wrong": j["wrong"][:20],
                         "diverged_replays": len(j["diverged"]), "diverged": j["diverged"][:5],
                         "replayed_batches": j["replayed"], "bad_epochs": bad_epochs, "resumes": j["resumes"], "errors": len(j["errors"]),
                         "error_kinds": dict(Counter(e.split(":")[0] for e in j["errors"]))}  # fmt: skip
        total.update({k: per_job[name][k] for k in ("lost", "duplicated", "foreign", "wrong_items",
                                                    "diverged_replays")})  # fmt: skip
    for pair in pairs:
        common = set.intersection(*(set(parsed[r]["epochs"]) for r in pair)) if pair else set()
        lost = dup = 0
        for e in common:
            res = exactly_once([i for r in pair for i in parsed[r]["epochs"][e]], everything)
            lost, dup = lost + res["lost"], dup + res["duplicated"]
        per_job["+".join(pair)] = {"complete_epochs": len(common), "lost": lost, "duplicated": dup}
        total.update({"lost": lost, "duplicated": dup})
    return {"jobs": per_job, "total": dict(total), "times": {k: v["times"] for k, v in parsed.items()},
            "stats": {k: v["stats"][-1] if v["stats"] else {} for k, v in parsed.items()}}  # fmt: skip


def _count(times: list[float], a: float, b: float) -> int:
    return bisect.bisect_left(times, b) - bisect.bisect_left(times, a)


def recovery(
    faults: list[dict], times: dict[str, list[float]], run_end: float, window_s: float = 10.0
) -> None:
    """Adds ``recovery_s`` (None: not back within the run) per fault, the slowest of its jobs."""
    for f in faults:
        worst: float | None = 0.0
        for name in f.get("jobs", []):
            t = times.get(name, [])
            pre = _count(t, f["start"] - window_s, f["start"]) / window_s
            if pre <= 0:
                continue
            at, found = f["end"], None
            while at + window_s <= run_end:
                if _count(t, at, at + window_s) / window_s >= 0.9 * pre:
                    found = at - f["end"]
                    break
                at += 0.5
            worst = None if (found is None or worst is None) else max(worst, found)
        f["recovery_s"] = None if worst is None else round(worst, 1)


def summarize_faults(faults: list[dict]) -> dict[str, Any]:
    kinds: dict[str, dict[str, int]] = {}
    for f in faults:
        k = kinds.setdefault(f["kind"], {"injected": 0, "skipped": 0, "failed_to_inject": 0, "recovered": 0})
        if "error" in f:
            k["failed_to_inject"] += 1
        elif "skipped" in f:
            k["skipped"] += 1
        else:
            k["injected"] += 1
            k["recovered"] += f.get("recovery_s") is not None
    rec = [f["recovery_s"] for f in faults if f.get("recovery_s") is not None and "skipped" not in f]
    return {"by_kind": kinds, "recovery_p50_s": statistics.median(rec) if rec else None,
            "recovery_max_s": max(rec) if rec else None, "not_recovered": sum(
                1 for f in faults if "error" not in f and "skipped" not in f and f.get("recovery_s") is None)}  # fmt: skip


def resources(samples: list[dict]) -> dict[str, Any]:
    """Per job: the largest RSS (MiB) and fd count in the first and the last third of the run."""
    out: dict[str, Any] = {}
    by_job: dict[str, list[dict]] = {}
    for s in samples:
        by_job.setdefault(s["job"], []).append(s)
    for name, ss in by_job.items():
        k = max(1, len(ss) // 3)
        first, last = ss[:k], ss[-k:]
        out[name] = {"rss_mib_first": round(max(s["rss"] for s in first) / 2**20, 1),
                     "rss_mib_last": round(max(s["rss"] for s in last) / 2**20, 1),
                     "rss_mib_max": round(max(s["rss"] for s in ss) / 2**20, 1),
                     "fds_first": max(s["fds"] for s in first), "fds_last": max(s["fds"] for s in last),
                     "fds_max": max(s["fds"] for s in ss)}  # fmt: skip
    return out
