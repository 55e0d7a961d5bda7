"""``gradcomp.register(ddp_model, ...)``: pick a method, fit the planner on the real link, install the hook."""

from __future__ import annotations

import torch
import torch.distributed as dist

from gradcomp.hooks import GradcompState, gradcomp_hook
from gradcomp.memory import NoMemory
from gradcomp.methods import build_communicator, method
from gradcomp.planner import Decision, Planner, fit_line, time_at_sizes

__all__ = ["register", "fit_planner"]

_PLANS = ("auto", "always", "never")


def _model_device(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def fit_planner(state: GradcompState, max_numel: int, device: torch.device, reps: int = 3) -> Planner:
    """Time dense all-reduce, the full compressed sync and the compressor alone at a few sizes; fit lines.

    Probes use their own keys and no error-feedback memory, so training state is untouched.
    """
    # At least two sizes even for a tiny model: a line through one point has no intercept to speak of.
    sizes = sorted({n for n in (1024, 16384, 262144, 1 << 20) if n <= max(max_numel, 16384)})
    comm = state.communicator
    probe_memory, comm.memory = comm.memory, NoMemory()
    try:
        dense = time_at_sizes(
            lambda x: dist.all_reduce(x, group=state.group), sizes, reps, device, state.group
        )
        sync = time_at_sizes(
            lambda x: state.sync(x, "__probe__", Decision(True, 1)).wait(), sizes, reps, device, state.group
        )

        def encode(x: torch.Tensor) -> None:
            payload, ctx = comm.compressor.compress(x, "__probe__")
            comm.compressor.decompress(payload, ctx)
            comm.compressor.aggregate([payload] * state.world, ctx)

        enc = time_at_sizes(encode, sizes, reps, device, state.group)
    finally:
        comm.memory = probe_memory
    return Planner(fit_line(sizes, dense), fit_line(sizes, sync), fit_line(sizes, enc))


def register(
    model: torch.nn.parallel.DistributedDataParallel,
    compressor: str = "mstopk",
    ratio: float = 0.01,
    error_feedback: bool = True,
    plan: str = "auto",
    process_group: dist.ProcessGroup | None = None,
    **options: object,
) -> GradcompState:
    """Compress ``model``'s gradient synchronisation; returns the hook state (planner, timings, residuals).

    Args:
        model: a ``DistributedDataParallel`` model; every rank must call ``register`` with the same arguments.
        compressor: one of ``gradcomp.methods.NAMES`` (a compressor paired with a communicator).
        ratio: density kept by sparsifiers (top-k, MSTopK, random-k, gTop-k, hierarchical top-k).
        error_feedback: keep what was dropped and add it to the next gradient (needed by biased methods).
        plan: ``"auto"`` fits a cost model now (a few timed collectives) and compresses a bucket only when it is
            predicted to be clearly faster; ``"always"`` compresses every bucket; ``"never"`` sends all dense.
    Returns:
        The hook state. ``state.hooked`` is False when plan="auto" found that no bucket would be compressed on
        this link: then no hook is installed and DDP keeps its built-in all-reduce.

        options: ``partitions`` (plan="always"), ``rounds`` (MSTopK), ``levels`` (QSGD), ``seed`` (random-k),
            ``powersgd_rank``, ``start_iter`` (PowerSGD warm-up steps), ``local_size`` (hitopk: ranks per node,
            default ``$LOCAL_WORLD_SIZE``), ``margin`` (auto: required predicted gain).
    """
    if not hasattr(model, "register_comm_hook"):
        raise TypeError(
            f"gradcomp.register needs a DistributedDataParallel model, got {type(model).__name__}"
        )
    method(compressor)  # an unknown name fails here, before any collective
    if plan not in _PLANS:
        raise ValueError(f"plan must be one of {_PLANS}, got {plan!r}")
    communicator = build_communicator(compressor, ratio, error_feedback, process_group, options)
    state = GradcompState(communicator, plan, partitions=int(options.get("partitions", 1)), name=compressor)
    # Communicators that are not plannable apply their own rule (PowerSGD) or always compress (hierarchical
    # top-k); the dense one never compresses.
    if plan == "auto" and communicator.plannable:
        total = sum(p.numel() for p in model.parameters() if p.requires_grad)
        state.planner = fit_planner(state, total, _model_device(model))
        if "margin" in options:
            state.planner.margin = float(options["margin"])
        # When no bucket size this model can produce would be compressed, DDP's own C++ all-reduce is the
        # fastest dense path: install nothing, so plan="auto" costs nothing on a fast link.
        sizes = [total >> s for s in range(0, 12)] + [4096]
        if not any(state.planner.decide(max(n, 1)).compress for n in sizes):
            state.hooked = False
            return state
    model.register_comm_hook(state, gradcomp_hook)
    state.hooked = True
    return state
