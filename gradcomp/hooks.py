"""The DDP communication hook: per bucket, dense all-reduce or compressed sync, as the plan decides.

The bucket is divided by the world size first (so every path sums averages, and 16-bit sums cannot overflow),
then synchronised. Dense and all-gather paths return the collective's Future, so communication still overlaps
the rest of the backward pass; gTop-k, hierarchical top-k and PowerSGD run their rounds inside the hook.
"""

# No ``from __future__ import annotations`` here: DDP inspects the hook's annotations at registration and wants
# the real ``dist.GradBucket`` and ``torch.futures.Future[torch.Tensor]`` objects, not strings.
import threading
import time

import torch
import torch.distributed as dist

from gradcomp.collectives import allgather_payloads, gtopk, hierarchical_topk
from gradcomp.compressors import Compressor, k_for
from gradcomp.memory import NoMemory, ResidualMemory
from gradcomp.planner import Decision, Planner
from gradcomp.powersgd import PowerSGDReducer

__all__ = ["HookTimer", "GradcompState", "gradcomp_hook", "timed_hook"]


def _done(t: torch.Tensor) -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(t)
    return fut


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
    """Everything the hook needs: the method, its error-feedback memory, the plan and per-step timings."""

    def __init__(
        self,
        name: str,
        compressor: Compressor,
        ratio: float,
        error_feedback: bool,
        plan: str,
        group: dist.ProcessGroup | None = None,
        powersgd: PowerSGDReducer | None = None,
        node_groups: tuple[dist.ProcessGroup, dist.ProcessGroup] | None = None,
        partitions: int = 1,
    ) -> None:
        self.name = name
        self.compressor = compressor
        self.ratio = ratio
        self.error_feedback = error_feedback
        self.memory = ResidualMemory() if error_feedback else NoMemory()
        self.plan = plan
        self.group = group
        self.world = dist.get_world_size(group)
        self.powersgd = powersgd
        self.node_groups = node_groups
        self.partitions = partitions
        self.planner: Planner | None = None
        self.hooked = False
        super().__init__()

    # ---- decisions -------------------------------------------------------------------------------------------
    def decide(self, numel: int) -> Decision:
        """Dense or compressed for a bucket of ``numel`` elements; identical on every rank."""
        if self.name == "none" or self.plan == "never":
            return Decision(False)
        if self.plan == "always" or self.planner is None:
            return Decision(True, self.partitions)
        return self.planner.decide(numel)

    # ---- synchronisation -------------------------------------------------------------------------------------
    def sync(
        self, x: torch.Tensor, key: object, decision: Decision, shapes: list | None = None
    ) -> torch.futures.Future:
        """Sum over ranks of flat ``x`` (already divided by the world size), as a Future."""
        if not decision.compress:
            # The collective's own future (its value is a one-element list; the hook unwraps it).
            return dist.all_reduce(x, group=self.group, async_op=True).get_future()
        if self.name == "powersgd":
            assert self.powersgd is not None
            return _done(self.powersgd.reduce(x, shapes or [x.shape], key, self.group))
        if self.name == "gtopk":
            return _done(self._gtopk(x, key))
        if self.name == "hitopk":
            assert self.node_groups is not None
            intra, inter = self.node_groups
            return _done(hierarchical_topk(x, self.ratio, intra, inter, self.memory, key))
        if self.compressor.collective == "allreduce":
            return self._allreduce_compressed(x, key)
        return self._allgather_compressed(x, key, decision.partitions)

    def _compress(self, x: torch.Tensor, key: object) -> tuple[list[torch.Tensor], object]:
        comp = self.memory.compensate(x, key)
        payload, ctx = self.compressor.compress(comp, key)
        if self.error_feedback:
            self.memory.update(comp, key, self.compressor.decompress(payload, ctx))
        return payload, ctx

    def _allreduce_compressed(self, x: torch.Tensor, key: object) -> torch.futures.Future:
        payload, ctx = self._compress(x, key)
        summed = payload[0].clone()
        fut = dist.all_reduce(summed, group=self.group, async_op=True).get_future()
        return fut.then(lambda f: self.compressor.decompress([f.value()[0]] + payload[1:], ctx))

    def _allgather_compressed(self, x: torch.Tensor, key: object, partitions: int) -> torch.futures.Future:
        # Part i+1 is compressed while part i is on the wire (SeCoPa's partitions, pipelined).
        parts = torch.tensor_split(x, partitions) if partitions > 1 else (x,)
        futs, ctxs = [], []
        for i, part in enumerate(parts):
            payload, ctx = self._compress(part, (key, i))
            ctxs.append(ctx)
            futs.append(allgather_payloads(payload, self.group, async_op=True))

        def finish(_: object) -> torch.Tensor:
            outs = [self.compressor.aggregate(f.value(), c) for f, c in zip(futs, ctxs, strict=True)]
            return outs[0] if len(outs) == 1 else torch.cat(outs)

        return torch.futures.collect_all(futs).then(finish)

    def _gtopk(self, x: torch.Tensor, key: object) -> torch.Tensor:
        comp = self.memory.compensate(x, key)
        k = k_for(comp.numel(), self.ratio)
        val, idx = self.compressor.compress(comp, key)[0]
        idx = idx.long()
        g_idx, g_val = gtopk(idx, val, k, self.group)
        if self.error_feedback:
            # Local picks that lost globally go back into the residual (they were not sent after all).
            kept = torch.isin(idx, g_idx)
            sent = torch.zeros_like(comp)
            sent[idx[kept]] = val[kept]
            self.memory.update(comp, key, sent)
        out = torch.zeros_like(x)
        out[g_idx] = g_val
        return out


def gradcomp_hook(state: GradcompState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: ``model.register_comm_hook(state, gradcomp_hook)`` (``gradcomp.register`` does this)."""
    t0 = time.perf_counter()
    state._ready(t0)
    x = bucket.buffer().div_(state.world)
    decision = state.decide(x.numel())
    shapes = [p.shape for p in bucket.parameters()] if state.name == "powersgd" else None
    fut = state.sync(x, bucket.index(), decision, shapes)

    def stamp(f: torch.futures.Future) -> torch.Tensor:
        state._record(t0, decision.compress)
        value = f.value()
        # A collective's own future holds a list of tensors; the compressed paths' futures hold one tensor.
        return value[0] if isinstance(value, list) else value

    return fut.then(stamp)


class _TimedState(HookTimer):
    def __init__(self, inner_state: object, inner_hook: object) -> None:
        super().__init__()
        self.inner_state = inner_state
        self.inner_hook = inner_hook


def _timed(state: _TimedState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    t0 = time.perf_counter()
    state._ready(t0)

    def stamp(f: torch.futures.Future) -> torch.Tensor:
        state._record(t0, False)
        return f.value()

    return state.inner_hook(state.inner_state, bucket).then(stamp)


def timed_hook(inner_state: object, inner_hook: object) -> tuple[HookTimer, object]:
    """Wrap any DDP comm hook (e.g. PyTorch's ``fp16_compress_hook``) so it reports the same timings as ours.

    Returns ``(state, hook)`` for ``ddp.register_comm_hook(state, hook)``; ``state.take_stats()`` as above.
    """
    return _TimedState(inner_state, inner_hook), _timed
