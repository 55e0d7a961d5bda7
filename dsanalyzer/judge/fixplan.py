"""What ``dsanalyzer fix`` runs: the next step from the ranked remedies, for the job as it now stands.

A step is one remedy the import hook can apply to the unmodified script (:mod:`dsanalyzer.measure.apply`):
the trainer's intra-op threads, the loader's ``num_workers``, coordl's read-ahead, MinIO cache (a torch
loader switched to ``coordl.DataLoader``) and sample cache. :func:`next_step` asks the ranked remedies
(:mod:`dsanalyzer.judge.remedies`) of the profiled model *with the changes kept so far applied*
(:func:`applied_model`), so that when a change moves the bound (one thread frees a core, then prep binds)
the next step is the remedy of the new bound: those that remove the stall cheapest first, then the one that
gains most, within this machine's cores and the memory budget. Remedies that need more than this machine
(nodes, remote CPUs, GPU prep) or a probe the profile did not make are left to the verdict's list.

One step comes before the ranked list: while the job's step computes on this CPU (the main process busy at
least :data:`~coordl.tune.model.STEP_ON_CPU` of the step's time, of the CPU other processes left it: a CPU
step's share of its time falls with the host's load, a sleeping one's does not; measured at load ~4, 33%
(bench_fix's fetch and prep jobs) against 0.3% (a sleep); not a step that waits on an accelerator) and the
trainer's intra-op threads plus the loader's workers outnumber the cores
(:func:`coordl.tune.model.oversubscribed`), one thread, as a trial predicted no lower than the job as it
runs, unless the ranked steps come to the threads themselves (then the model's order stands); a
compute-bound job too, since the contention slows the step itself (bench_fix's compute job, profiled
compute-bound on the loaded host, ran 4.6x faster on one thread). The model prices the threads that spin, not a worker preempted at a
parallel region's barrier; on the 2-core host the README job ran 2x faster with one thread on 1 worker,
where the model predicted nothing from it and ranked one more worker first, which measured no better
with both threads on (benchmarks/bench_fix.py, docs/tune.md). Any other step's prediction assumes the
cores are not fought over, so this one is settled first; not where the profile's real run left a quarter
of the cores idle (no thread waited for one). Last, where nothing ranked applies and the workers wait
rather than compute: more reads in flight, twice the workers (:func:`_waiting_workers_trial`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from coordl.tune.model import IDLE_CORES_FREE, STEP_ON_CPU, oversubscribed
from dsanalyzer.judge.loadercode import change_text, is_dali
from dsanalyzer.judge.remedies import GAIN, current, ranked
from dsanalyzer.judge.verdict import recommend
from dsanalyzer.model.cores import intra_op_threads
from dsanalyzer.model.measured import host_idle_cores
from dsanalyzer.model.whatif import Model

__all__ = ["Config", "Step", "APPLIED", "applied_model", "next_step", "plan"]

# the remedies the hook applies to the script (the sample cache only where the profile predicted it: a
# coordl loader over a source that splits its prep)
APPLIED = ("threads", "workers", "fetch_ahead", "cache", "sample_cache")
# a lone worker on its CPU at least this share of its time computes, rather than waits: its prep needs a core
WORKERS_COMPUTE = 0.3


@dataclass(frozen=True)
class Config:
    """The changes in force, all rounds' together (empty: the script as written)."""

    torch_threads: int | None = None
    loader_args: dict = field(default_factory=dict)
    switch_to: str = ""

    def with_step(self, step: Step) -> Config:
        return Config(
            step.torch_threads if step.torch_threads is not None else self.torch_threads,
            {**self.loader_args, **step.loader_args},
            step.switch_to or self.switch_to,
        )

    def as_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Step:
    """One round's change and what the model predicts for the job with it (and the earlier ones)."""

    name: str
    code: str
    predicted_samples_per_s: float
    bound: str | None
    torch_threads: int | None = None
    loader_args: dict = field(default_factory=dict)
    switch_to: str = ""
    removes_stall: bool = False

    def as_json(self) -> dict:
        return asdict(self)


def applied_model(model: Model, config: Config) -> Model:
    """The profiled model with ``config`` in force: one intra-op thread, its workers, cache and read-ahead."""
    kw: dict = {}
    if config.torch_threads is not None:
        kw.update(torch_threads=config.torch_threads, threads_follow_cores=False)
    args = config.loader_args
    if "num_workers" in args:
        kw["workers"] = int(args["num_workers"])
    if "cache_bytes" in args:
        kw.update(cache_bytes=float(args["cache_bytes"]), cache_policy="minio")
    if "fetch_ahead" in args:
        kw["fetch_ahead"] = int(args["fetch_ahead"])
    return replace(model, **kw) if kw else model


def _report_after(report: dict, config: Config) -> dict:
    """``report`` as the remedies read it once ``config`` switched the loader to coordl's."""
    if not config.switch_to:
        return report
    return {**report, "loader": {**(report.get("loader") or {}), "class": "coordl.dataloader.DataLoader"}}


def next_step(
    report: dict,
    kept: Config,
    memory_budget_bytes: float,
    excluded: frozenset[str] = frozenset(),
    idle_cores: float | None = None,
) -> Step | None:
    """The next change on top of ``kept``: the first applicable remedy of the ranked list that gains
    more than :data:`~dsanalyzer.judge.remedies.GAIN` and fits the cores and ``memory_budget_bytes``
    (``excluded``: remedies already tried and reverted), or one intra-op thread first where the job's
    threads and workers fight over the cores and the ranked steps never reach it (the module's
    docstring); None when none does (the job is compute-bound, or nothing here helps). ``idle_cores``:
    the cores the host left idle in a run of the job with ``kept`` (default: the profile's real run's
    while nothing is kept; unknown after a change)."""
    if is_dali(report):
        return None  # a built DALI pipeline's threads cannot be changed through the loader call
    model = applied_model(Model.from_report(report), kept)
    step = _ranked_step(report, model, kept, memory_budget_bytes, excluded)
    if _reaches_threads(report, kept, memory_budget_bytes, excluded, step):
        return step  # the model prices the threads itself, in its own order
    now = current(model).samples_per_s
    if idle_cores is None and kept == Config():
        idle_cores = host_idle_cores(report)
    trial = _threads_trial(model, now, excluded, idle_cores) or step
    return trial or _waiting_workers_trial(report, model, kept, now, excluded)


def _reaches_threads(
    report: dict, kept: Config, budget: float, excluded: frozenset[str], step: Step | None
) -> bool:
    """Whether the ranked steps from ``kept`` (``step`` first) come to the trainer's threads."""
    for _ in range(len(APPLIED)):
        if step is None:
            return False
        if step.torch_threads is not None:
            return True
        kept = kept.with_step(step)
        model = applied_model(Model.from_report(report), kept)
        step = _ranked_step(report, model, kept, budget, excluded)
    return False


def _ranked_step(
    report: dict, model: Model, kept: Config, budget: float, excluded: frozenset[str]
) -> Step | None:
    """The first applicable remedy of the ranked list for ``model`` (the job with ``kept``)."""
    now = current(model).samples_per_s
    after = _report_after(report, kept)
    for r in ranked(model, after, recommend(model)):
        if r.name not in APPLIED or r.name in excluded or r.samples_per_s is None:
            continue
        if r.samples_per_s <= now * (1 + GAIN):
            continue
        if float(r.cost.get("memory_bytes") or 0.0) > budget:
            continue
        if int(r.loader_args.get("num_workers") or 0) > model.cpus:
            continue
        return Step(r.name, r.code, r.samples_per_s, r.bound, r.torch_threads, dict(r.loader_args),
                    r.switch_to, r.removes_stall(model.compute_rate()))  # fmt: skip
    return None


def _threads_trial(
    model: Model, now: float, excluded: frozenset[str], idle_cores: float | None
) -> Step | None:
    """One intra-op thread while the job stalls on data and its threads and workers outnumber the cores
    (the module's docstring), predicted at the model's rate for it or the job's as it runs, the higher.
    Not while the profile's real run left ``IDLE_CORES_FREE`` of the cores idle: no thread waited for one."""
    threads = intra_op_threads(model.cpus, model.torch_threads, model.threads_follow_cores)
    if "threads" in excluded or not oversubscribed(threads, model.workers, model.cpus):
        return None
    if idle_cores is not None and idle_cores >= IDLE_CORES_FREE * model.cpus:
        return None
    step_s = model.batch_size / model.compute_per_s if model.compute_per_s > 0 else 0.0
    left = max(model.free_share or 1.0, 0.05)  # of the host's CPU, what other processes left the job
    if not model.step_on_cpu or (model.step_cpu_s or 0.0) < STEP_ON_CPU * step_s * left:
        return None  # a step that waits (an accelerator, a sleep): its threads take no core from anyone
    pred = current(model)  # compute-bound or not: the contention slows the step itself, which it then binds
    one = current(replace(model, torch_threads=1, threads_follow_cores=False))
    best = one if one.samples_per_s > now else pred
    return Step("threads", "torch.set_num_threads(1)", max(one.samples_per_s, now), best.bound, 1)


def _waiting_workers(model: Model) -> bool:
    """Whether a lone worker spends most of its time off its CPU (storage, a remote reply, a sleep)."""
    return (model.prep_cpu_s or 0.0) * model.prep.rate_one_core_per_s < WORKERS_COMPUTE


def _waiting_workers_trial(
    report: dict, model: Model, kept: Config, now: float, excluded: frozenset[str]
) -> Step | None:
    """More reads in flight for workers that wait rather than compute, when nothing ranked applies: twice
    the workers (up to twice the cores); predicted as ``coordl.tune.model`` predicts workers that wait on
    storage (the rate scales with the workers, one read in flight each), up to the step's rate. The
    ranked list's workers stop at the cores: its prep curve is fitted in cores, and a worker that sleeps
    on storage needs little of one. Not ``prefetch_factor``: a worker makes one batch at a time, so a
    deeper queue adds no read in flight (bench_fix's fetch job on the quiet VM, 4 workers: 2, 4 and 8
    measured within 1% of each other)."""
    if not _waiting_workers(model) or current(model).bound == "compute" or model.workers < 1:
        return None
    workers = model.workers
    if "workers" in excluded or workers >= 2 * model.cpus:
        return None
    more = min(2 * workers, 2 * model.cpus)
    name, change, factor = "workers", {"num_workers": more}, more / workers
    compute = model.compute_rate()
    predicted = min(now * factor, compute)
    bound = "compute" if predicted >= compute else current(model).bound
    return Step(name, change_text(change, report), predicted, bound, None, change, "", predicted >= compute)


def plan(report: dict, rounds: int, memory_budget_bytes: float) -> list[Step]:
    """The steps ``fix`` would take if each measured as predicted (what ``--dry-run`` prints)."""
    steps: list[Step] = []
    kept = Config()
    for _ in range(rounds):
        step = next_step(report, kept, memory_budget_bytes)
        if step is None:
            break
        steps.append(step)
        kept = kept.with_step(step)
        if step.removes_stall:
            break
    return steps
