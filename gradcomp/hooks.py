"""The DDP communication hook: per bucket, the dense communicator or the method's, as the plan decides.

The bucket is divided by the world size first (so every path sums averages, and 16-bit sums cannot overflow),
then handed to a communicator (``gradcomp.communicators``). Dense, all-reduce and all-gather communicators return
the collective's Future, so communication still overlaps the rest of the backward pass; gTop-k, hierarchical
top-k and PowerSGD run their rounds inside the hook.
"""

# No ``from __future__ import annotations`` here: DDP inspects the hook's annotations at registration and wants
# the real ``dist.GradBucket`` and ``torch.futures.Future[torch.Tensor]`` objects, not strings.
import threading
import time

import torch
import torch.distributed as dist

# the interface dsanalyzer defines; a no-op outside a profile
from dsanalyzer.jobs.comm import record_collective
from gradcomp import futures
from gradcomp.communicators import Communicator, DenseAllReduce
from gradcomp.compressors import Compressor
from gradcomp.memory import Memory
from gradcomp.planner import Decision, Planner

__all__ = ["HookTimer", "GradcompState", "gradcomp_hook", "timed_hook"]


class HookTimer:
    """Per-step communication timings of a comm hook, safe to update from gloo's callback threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._comm_s = 0.0
        self._last_ready = 0.0
        self._last_done = 0.0
        self._buckets = 0
        self._compressed = 0

    def _ready(self, t0: float) -> None:
        with self._lock:
            self._last_ready = max(self._last_ready, t0)

    def _record(self, t0: float, compressed: bool) -> None:
        t1 = time.perf_counter()
        with self._lock:
            self._comm_s += t1 - t0
            self._last_done = max(self._last_done, t1)
            self._buckets += 1
            self._compressed += int(compressed)

    def take_stats(self) -> dict[str, float]:
        """Stats since the last call: summed bucket sync time (``comm_s``, may overlap backward), when the last
        bucket became ready (backward compute done: ``last_ready``) and when the last sync ended."""
        with self._lock:
            out = {
                "comm_s": self._comm_s,
                "last_ready": self._last_ready,
                "last_done": self._last_done,
                "buckets": self._buckets,
                "compressed_buckets": self._compressed,
            }
            self._comm_s = self._last_ready = self._last_done = 0.0
            self._buckets = self._compressed = 0
        return out


class GradcompState(HookTimer):
    """Everything the hook needs: the method's communicator (with its compressor and memory), the dense
    communicator for buckets the plan keeps dense, the plan, and per-step timings.

    Args:
        communicator: the method, built by ``gradcomp.methods.build_communicator``.
        plan: ``"auto"`` (ask ``planner`` once it is fitted), ``"always"`` or ``"never"``.
        partitions: pipelined parts per compressed bucket under ``plan="always"`` (all-gather methods).
        name: the public method name, for reports only.
    """

    def __init__(
        self, communicator: Communicator, plan: str = "always", partitions: int = 1, name: str | None = None
    ) -> None:
        super().__init__()
        self.communicator = communicator
        self.dense = DenseAllReduce(group=communicator.group)
        self.plan = plan
        self.partitions = partitions
        self.name = name or type(communicator).__name__
        self.group = communicator.group
        self.world = communicator.world
        self.planner: Planner | None = None
        self.hooked = False

    @property
    def compressor(self) -> Compressor:
        return self.communicator.compressor

    @property
    def memory(self) -> Memory:
        """The error-feedback memory (residuals per bucket)."""
        return self.communicator.memory

    @property
    def error_feedback(self) -> bool:
        return self.communicator.memory.enabled

    def decide(self, numel: int) -> Decision:
        """Dense or compressed for a bucket of ``numel`` elements; identical on every rank."""
        if not self.communicator.compresses or self.plan == "never":
            return Decision(False)
        if self.plan == "always" or self.planner is None:
            return Decision(True, self.partitions)
        return self.planner.decide(numel)

    def sync(
        self, x: torch.Tensor, key: object, decision: Decision, shapes: list | None = None
    ) -> torch.futures.Future:
        """Sum over ranks of flat ``x`` (already divided by the world size), as a Future."""
        if not decision.compress:
            return self.dense.sync(x, key)
        return self.communicator.sync(x, key, decision.partitions, shapes)


def gradcomp_hook(state: GradcompState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: ``model.register_comm_hook(state, gradcomp_hook)`` (``gradcomp.register`` does this)."""
    t0 = time.perf_counter()
    state._ready(t0)
    x = bucket.buffer().div_(state.world)
    decision = state.decide(x.numel())
    shapes = [p.shape for p in bucket.parameters()] if state.communicator.needs_shapes else None
    fut = state.sync(x, bucket.index(), decision, shapes)
    wire_bytes = x.numel() * x.element_size()  # the bucket's dense bytes (compression shows in the seconds)
    is_last = bucket.is_last()

    def stamp(f: torch.futures.Future) -> torch.Tensor:
        state._record(t0, decision.compress)
        seconds = time.perf_counter() - t0
        record_collective(f"gradcomp.{state.name}", wire_bytes, seconds, seconds if is_last else 0.0)
        value = f.value()
        # A collective's own future holds a list of tensors; the compressed paths' futures hold one tensor.
        return value[0] if isinstance(value, list) else value

    return futures.then(fut, stamp, keep=(x,))


class _TimedState(HookTimer):
    def __init__(self, inner_state: object, inner_hook: object) -> None:
        super().__init__()
        self.inner_state = inner_state
        self.inner_hook = inner_hook


def _timed(state: _TimedState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    t0 = time.perf_counter()
    state._ready(t0)
    wire_bytes = bucket.buffer().numel() * bucket.buffer().element_size()
    is_last = bucket.is_last()

    def stamp(f: torch.futures.Future) -> torch.Tensor:
        state._record(t0, False)
        seconds = time.perf_counter() - t0
        record_collective("allreduce", wire_bytes, seconds, seconds if is_last else 0.0)
        return f.value()

    return futures.then(state.inner_hook(state.inner_state, bucket), stamp)


def timed_hook(inner_state: object, inner_hook: object) -> tuple[HookTimer, object]:
    """Wrap any DDP comm hook (e.g. PyTorch's ``fp16_compress_hook``) so it reports the same timings as ours.

    Returns ``(state, hook)`` for ``ddp.register_comm_hook(state, hook)``; ``state.take_stats()`` as above.
    """
    return _TimedState(inner_state, inner_hook), _timed
