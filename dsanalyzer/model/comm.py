"""Communication stalls of a distributed job: per-rank split, the slowest rank, and a what-if cost model.

Per rank, from the differential runs: compute is the step of the compute run less its exposed
communication; the communication stall is that exposed time (the compute run's: there no rank waits
for a peer's data, so the wait is the collectives' own); prep and fetch stalls are as for one process.

Cost model, fitted from the measured collectives of the compute run (all ranks):
``t(bytes) = latency_s + bytes / bytes_per_s`` by least squares (latency 0 when every collective had
the same size). What-if: another link speed replaces the bandwidth term by ring all-reduce's traffic
``2 (n-1)/n * bytes`` over the link; compression divides the bytes. The hidden part of the
communication (measured total minus exposed) is backward computation that overlaps it and stays; the
new exposed time is whatever of the new total exceeds it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

__all__ = ["CommModel", "comm_section"]


def _median_after(values: list[float], warmup: int) -> float:
    tail = values[min(warmup, max(0, len(values) - 1)) :]
    return float(statistics.median(tail)) if tail else 0.0


def _rank_rows(results: dict[str, dict], warmup: int) -> list[dict]:
    by_rank: dict[int, dict[str, dict]] = {}
    for mode in ("compute", "prep", "real"):
        for r in results.get(mode, {}).get("ranks") or []:
            by_rank.setdefault(int(r.get("rank", 0)), {})[mode] = r
    rows = []
    for rank, runs in sorted(by_rank.items()):
        if set(runs) != {"compute", "prep", "real"}:
            continue
        iter_s = {
            m: _median_after([w + s for w, s in zip(r["wait_s"], r["step_s"], strict=False)], warmup)
            for m, r in runs.items()
        }
        comm = (runs["compute"].get("comm") or {}).get("exposed_s") or []
        comm_s = _median_after(comm, warmup) if comm else 0.0
        rows.append(
            {
                "rank": rank,
                "compute_s": max(0.0, iter_s["compute"] - comm_s),
                "comm_stall_s": comm_s,
                "prep_stall_s": max(0.0, iter_s["prep"] - iter_s["compute"]),
                "fetch_stall_s": max(0.0, iter_s["real"] - iter_s["prep"]),
                "iter_s": iter_s["real"],
            }
        )
    return rows


def _fit(collectives: list[list[float]]) -> dict:
    sizes = np.array([c[0] for c in collectives], dtype=float)
    secs = np.array([c[1] for c in collectives], dtype=float)
    if len(set(sizes.tolist())) >= 2:
        slope, latency = np.polyfit(sizes, secs, 1)
        if slope > 0 and latency >= 0:
            return {"latency_s": float(latency), "bytes_per_s": float(1.0 / slope), "fit": "least squares"}
    total_s = float(secs.sum())
    return {
        "latency_s": 0.0,
        "bytes_per_s": float(sizes.sum() / total_s) if total_s > 0 else 0.0,
        "fit": "one size",
    }


def comm_section(results: dict[str, dict], warmup: int) -> dict | None:
    """``report["comm"]``: per-rank stalls, the slowest rank, the cost model; None for one process."""
    compute = results.get("compute") or {}
    ranks = compute.get("ranks") or []
    comm_runs = [r.get("comm") for r in ranks or [compute] if r.get("comm")]
    rows = _rank_rows(results, warmup)
    if not comm_runs and not rows:
        return None
    collectives = [c for run in comm_runs for c in run.get("collectives", [])]
    per_iter = [run for run in comm_runs]
    total = [_median_after(run.get("comm_s", []), warmup) for run in per_iter]
    exposed = [_median_after(run.get("exposed_s", []), warmup) for run in per_iter]
    nbytes = [_median_after(run.get("bytes", []), warmup) for run in per_iter]
    counts = [len(run.get("collectives", [])) / max(1, len(run.get("comm_s", []))) for run in per_iter]
    slowest = max(rows, key=lambda r: r["iter_s"]) if rows else None
    return {
        "world_size": int(compute.get("world_size") or len(ranks) or 1),
        "per_rank": rows,
        "slowest_rank": slowest["rank"] if slowest else None,
        "per_iter_s": {
            "comm_stall": max(exposed) if exposed else 0.0,
            "comm_total": max(total) if total else 0.0,
        },
        "bytes_per_iter": max(nbytes) if nbytes else 0.0,
        "collectives_per_iter": max(counts) if counts else 0.0,
        "cost_model": _fit(collectives) if collectives else None,
    }


@dataclass(frozen=True)
class CommModel:
    """The measured communication of one step and its cost model."""

    world_size: int
    comm_total_s: float
    comm_exposed_s: float
    bytes_per_iter: float
    collectives_per_iter: float
    latency_s: float
    bytes_per_s: float

    @classmethod
    def from_report(cls, report: dict) -> CommModel:
        comm = report.get("comm")
        if not isinstance(comm, dict) or not comm.get("cost_model"):
            raise ValueError(
                "report.json: no communication was measured (comm.cost_model); --link-gbps and "
                "--compress-ratio need a distributed job profiled with `dsanalyzer profile -- torchrun ...`"
            )
        cost = comm["cost_model"]
        return cls(
            world_size=int(comm.get("world_size") or 1),
            comm_total_s=float(comm["per_iter_s"]["comm_total"]),
            comm_exposed_s=float(comm["per_iter_s"]["comm_stall"]),
            bytes_per_iter=float(comm.get("bytes_per_iter") or 0.0),
            collectives_per_iter=float(comm.get("collectives_per_iter") or 1.0),
            latency_s=float(cost["latency_s"]),
            bytes_per_s=float(cost["bytes_per_s"]),
        )

    def exposed_s(self, link_gbps: float | None = None, compress_ratio: float = 1.0) -> float:
        """Exposed communication per step with this link (Gbit/s; None: as measured) and compression."""
        if compress_ratio <= 0 or (link_gbps is not None and link_gbps <= 0):
            raise ValueError("--link-gbps and --compress-ratio must be positive")
        nbytes = self.bytes_per_iter / compress_ratio
        if link_gbps is None:
            transfer = nbytes / self.bytes_per_s if self.bytes_per_s > 0 else 0.0
        else:
            n = max(2, self.world_size)
            transfer = 2 * (n - 1) / n * nbytes / (link_gbps * 1e9 / 8)
        total = self.collectives_per_iter * self.latency_s + transfer
        hidden = max(0.0, self.comm_total_s - self.comm_exposed_s)
        return max(0.0, total - hidden)

    def compute_speedup(
        self, step_s: float, link_gbps: float | None = None, compress_ratio: float = 1.0
    ) -> float:
        """Factor on the compute rate when the step's exposed communication changes (``step_s``: as measured)."""
        new_step = step_s - self.comm_exposed_s + self.exposed_s(link_gbps, compress_ratio)
        return step_s / new_step if new_step > 0 else 1.0
