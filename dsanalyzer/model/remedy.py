"""One remedy's prediction (:class:`Remedy`): what a coordl remedy would give a job, and what it costs.

Every remedy the what-if knows (one intra-op thread in the trainer, more workers, a MinIO cache,
coordinated prep for K jobs, the partitioned cache over N nodes, the sample cache, GPU prep, remote CPUs) answers in this one shape, so that the
verdict can rank them (:func:`rank`) and ``verify`` can apply the one it names. Each remedy's rate is a
pure function of the job's measured parameters in a module named for it (:mod:`~dsanalyzer.model.stages`
for workers and cache); this module only holds the shape and the order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Remedy", "rank", "COST_ORDER"]

# What a remedy costs, cheapest first: a loader argument on the same machine costs nothing but memory;
# other jobs' cooperation, GPU time, other machines' cores and whole nodes cost more. rank() breaks ties
# between remedies that remove the stall by this order, then by the memory they hold.
COST_ORDER = (
    "threads",
    "in_order",
    "workers",
    "fetch_ahead",
    "cache",
    "sample_cache",
    "coordinate",
    "gpu_prep",
    "remote_prep",
    "nodes",
)


@dataclass(frozen=True)
class Remedy:
    """A remedy's predicted rate at the asked operating point and what it costs.

    ``samples_per_s`` is per job (for ``coordinate``, each of the K jobs); None when it cannot be
    predicted here (GPU prep without a GPU: ``why_unknown`` says so). ``cost`` holds plain numbers
    (``memory_bytes``, ``cores``, ``nodes``, ``jobs``, ``remote_cpus``, ``gpus``), ``loader_args`` the exact
    ``coordl.DataLoader`` keyword arguments (as source text where a value is an object, e.g.
    ``"coordl.Coordinate('job-group', jobs=4)"``). ``cost`` lists only what is not zero. ``code`` is the
    exact call or line that applies it; ``switch_to`` the loader class its arguments need when the job's
    loader is another (``"coordl.DataLoader"`` for a torch loader); ``torch_threads`` the main process's
    intra-op threads it sets (``torch.set_num_threads``), None when it leaves them.
    """

    name: str
    samples_per_s: float | None
    bound: str | None = None
    cost: dict = field(default_factory=dict)
    loader_args: dict = field(default_factory=dict)
    note: str = ""
    why_unknown: str = ""
    code: str = ""
    switch_to: str = ""
    torch_threads: int | None = None

    def removes_stall(self, compute_rate: float, tol: float = 1e-6) -> bool:
        """Whether this remedy makes the job compute-bound (within ``tol``)."""
        return self.samples_per_s is not None and self.samples_per_s >= compute_rate * (1 - tol)

    def as_json(self) -> dict:
        return {
            "name": self.name,
            "samples_per_s": self.samples_per_s,
            "bound": self.bound,
            "cost": dict(self.cost),
            "loader_args": dict(self.loader_args),
            "note": self.note,
            "why_unknown": self.why_unknown,
            "code": self.code,
            "switch_to": self.switch_to,
            "torch_threads": self.torch_threads,
        }


def _cost_key(r: Remedy) -> tuple:
    order = COST_ORDER.index(r.name) if r.name in COST_ORDER else len(COST_ORDER)
    return (order, float(r.cost.get("memory_bytes", 0.0)))


def rank(remedies: list[Remedy], compute_rate: float) -> list[Remedy]:
    """Remedies best first: those that remove the stall, cheapest first; then the rest, fastest first;
    the ones that cannot be predicted here last."""
    known = [r for r in remedies if r.samples_per_s is not None]
    fixes = sorted((r for r in known if r.removes_stall(compute_rate)), key=_cost_key)
    rest = sorted(
        (r for r in known if not r.removes_stall(compute_rate)), key=lambda r: -(r.samples_per_s or 0)
    )
    return fixes + rest + [r for r in remedies if r.samples_per_s is None]
