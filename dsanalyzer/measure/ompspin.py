"""How long torch's idle intra-op threads spin on this host: the CPU one spends after a parallel region.

On more cores a CPU step runs torch's intra-op threads, and after each parallel region OpenMP's idle
threads spin before they sleep (:mod:`dsanalyzer.model.cores` charges the cores they hold). The spin is
a count of iterations of a pause loop (GNU OpenMP's ``GOMP_SPINCOUNT``, 300,000 by default), so how
long it lasts is a property of the CPU: the pause instruction costs a different number of cycles on
different cores. Measured here, 2026-11-28: 3.4-5 ms on the Intel Xeon VM, 0.5-0.7 ms with
``GOMP_SPINCOUNT=30000``, and the README's job ran at 1,014-1,107 samples/s on 2 cores against
1,346-1,368 with the shorter spin (its main process 20-27 ms of CPU per batch against 11-12). A model
that charged the longest spin on every host under-predicted the same check by 2% on one host and 20% on
another (issue 49).

:func:`measure_omp_spin` times it in a child process: two intra-op threads, a tiny parallel region,
then a pause far longer than any spin, and the helper thread's CPU clock (``/proc/<pid>/task/*/schedstat``)
across it; the median of several regions, and again after pauses twice as long (a helper that spins
through the pause costs twice as much there). GNU OpenMP spins only briefly when it has more threads than
CPUs, so the child needs two CPUs: those of its affinity if it has two, else any of the machine's (a
profile pinned to one core by ``taskset`` still measures the host's spin; the spin of a core is the
same on each). Under a cpuset of one CPU, without torch, or without schedstat, the spin is unknown and
the model charges the longest (the helper runnable throughout). The environment is the job's, so
``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT`` are measured as the job would run them.

The probe takes 2-3 s (most of it importing torch), so its result is kept per host in
``$XDG_CACHE_HOME/dsanalyzer/`` (``~/.cache``), keyed by what decides it: the boot (a VM moved to other
hardware boots anew), the CPU model, torch's version and the OpenMP environment. ``DSANALYZER_OMP_SPIN=measure``
always measures.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["measure_omp_spin", "host_omp_spin", "PROBE"]

GAP_S = 0.06  # the pause after each region: longer than a spin measured on any host so far (~20 ms)
REGIONS = 7

PROBE = r"""
import json, os, statistics, sys, time
gap, regions = float(sys.argv[1]), int(sys.argv[2])
cpus = sorted(os.sched_getaffinity(0))
if len(cpus) < 2:
    try:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    except OSError:
        pass
    cpus = sorted(os.sched_getaffinity(0))
if len(cpus) < 2:
    print(json.dumps({"spin_s": None, "why": "one CPU available (a cpuset): GNU OpenMP spins briefly there"}))
    sys.exit(0)
os.sched_setaffinity(0, set(cpus[:2]))  # before torch loads OpenMP: it counts the CPUs once
import torch
torch.set_num_threads(2)
x = torch.ones(1 << 16)  # two chunks of torch's grain: each thread's share takes microseconds
me = os.getpid()

def helpers():
    total = 0
    for tid in os.listdir(f"/proc/{me}/task"):
        if int(tid) != me:
            try:
                with open(f"/proc/{me}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return total / 1e9

if not os.path.exists(f"/proc/{me}/task/{me}/schedstat"):
    print(json.dumps({"spin_s": None, "why": "no /proc/<pid>/task/*/schedstat on this kernel"}))
    sys.exit(0)
for _ in range(5):
    x.mul(2)
time.sleep(gap)
def spins(pause, n):
    out = []
    for _ in range(n):
        h0 = helpers()
        x.mul(2)
        time.sleep(pause)
        out.append(helpers() - h0)
    return out

short, long_ = spins(gap, regions), spins(2 * gap, max(3, regions // 2))
print(json.dumps({"spin_s": statistics.median(short), "spins_s": short, "spin_long_s": statistics.median(long_),
                  "cpus": cpus[:2], "gap_s": gap, "threads": torch.get_num_threads()}))
"""


def measure_omp_spin(gap_s: float = GAP_S, regions: int = REGIONS, timeout_s: float = 60.0) -> dict:
    """``{"spin_s": seconds of CPU an idle intra-op thread spends after a region (None: unknown), "why": ...}``.

    A spin that lasts the whole pause (``OMP_WAIT_POLICY=active`` spins forever) is reported as None
    with ``spins_through``: the helper is runnable throughout, what the model charges without a measurement.
    """
    if gap_s <= 0 or regions <= 0:
        raise ValueError(f"gap_s and regions must be positive, got {gap_s}, {regions}")
    cmd = [sys.executable, "-c", PROBE, str(gap_s), str(regions)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=dict(os.environ))
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"spin_s": None, "why": f"the spin probe did not finish: {e}"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        return {"spin_s": None, "why": f"the spin probe failed (torch missing?): {tail[0][:200]}"}
    try:
        out = json.loads(lines[-1])
    except ValueError:
        return {"spin_s": None, "why": f"the spin probe printed {lines[-1][:200]!r}"}
    spin, longer = out.get("spin_s"), out.get("spin_long_s")
    # a finite spin costs the same after a pause twice as long; one that spins through costs a pause more,
    # at least a quarter of it even on a loaded machine where a spinning thread gets only part of a core
    # (CI's parallel phase: 11.7 ms of CPU in a 30 ms pause); a ratio of the two misread small noisy spins
    if isinstance(spin, (int, float)) and isinstance(longer, (int, float)) and longer - spin > 0.25 * gap_s:
        out["spin_s"], out["spins_through"] = None, True
        out["why"] = f"the helper spun through a {gap_s * 1e3:.0f} ms pause (OMP_WAIT_POLICY=active?)"
    out.setdefault("why", "")
    out["method"] = (
        "CPU of torch's second intra-op thread after a tiny parallel region and a pause longer than its spin, "
        "in a child process on two CPUs with the job's environment; median of the regions"
    )
    return out


_ENV = (
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "OMP_NUM_THREADS",
    "OMP_PROC_BIND",
    "OMP_PLACES",
    "KMP_BLOCKTIME",
)


def _host_key() -> str:
    """What the spin depends on: the boot, the CPU model, torch's version, the OpenMP environment."""
    facts = [sys.executable]
    for path in ("/proc/sys/kernel/random/boot_id",):
        try:
            facts.append(Path(path).read_text().strip())
        except OSError:
            facts.append("")
    try:
        facts += [
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")
        ][:1]
    except OSError:
        pass
    try:
        from importlib.metadata import version

        facts.append(version("torch"))
    except Exception:  # no torch: the probe says so, and that too is kept
        facts.append("no torch")
    facts += [f"{k}={os.environ.get(k, '')}" for k in _ENV]
    return hashlib.sha256("\n".join(facts).encode()).hexdigest()[:20]


def host_omp_spin(cache_dir: str | os.PathLike | None = None) -> dict:
    """:func:`measure_omp_spin` once per host and OpenMP environment: later profiles read the kept result."""
    base = Path(cache_dir or os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dsanalyzer"
    path = base / f"omp-spin-{_host_key()}.json"
    if os.environ.get("DSANALYZER_OMP_SPIN") != "measure":
        try:
            kept = json.loads(path.read_text())
            if isinstance(kept, dict) and "spin_s" in kept:
                return {**kept, "kept": str(path)}
        except (OSError, ValueError):
            pass
    out = measure_omp_spin()
    if out.get("spin_s") is not None or out.get(
        "spins_through"
    ):  # an unknown spin is measured again next time
        try:
            base.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(out))
            os.replace(tmp, path)
        except OSError:
            pass
    return out
