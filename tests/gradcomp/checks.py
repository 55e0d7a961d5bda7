"""Checks that run inside each rank of a gloo group (see test_distributed.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from gradcomp.collectives import gtopk
from gradcomp.hooks import GradcompState
from gradcomp.methods import build_communicator
from gradcomp.planner import Decision


def _data(rank: int, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed * 100 + rank))


def _dense_sum(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    dist.all_reduce(y)
    return y


def _state(name: str, ratio: float = 1.0, **options) -> GradcompState:
    # PowerSGD at rank 64 from the first step is exact on an 8 x 12 matrix; hierarchical top-k on 2 ranks per node
    # where the world size allows it.
    options.update(powersgd_rank=64, start_iter=0, min_compression_rate=0.0)
    options.update(local_size=2 if dist.get_world_size() % 2 == 0 else 1)
    return GradcompState(build_communicator(name, ratio, True, None, options), "always", name=name)


def lossless(rank: int, world: int) -> None:
    """Every method at ratio 1 / lossless settings reproduces the dense all-reduce."""
    n = 96
    x = _data(rank, n)
    want = _dense_sum(x)
    # Equal magnitudes make sign and TernGrad exact (scale = |x| everywhere, keep-probability 1).
    signed = torch.sign(_data(rank, n, 1)) * 0.5
    want_signed = _dense_sum(signed)
    cases = [
        ("none", x, want, 0.0),
        ("fp16", x, want, 5e-3),
        ("bf16", x, want, 5e-2),
        ("topk", x, want, 1e-5),
        ("mstopk", x, want, 1e-5),
        ("randomk", x, want, 1e-5),
        ("gtopk", x, want, 1e-5),
        ("hitopk", x, want, 1e-5),
        ("qsgd", x, want, 1e-3 * world),
        ("terngrad", signed, want_signed, 1e-6),
        ("signsgd", signed, want_signed, 1e-6),
        ("powersgd", x, want, 1e-4),
    ]
    for name, inp, expect, tol in cases:
        state = _state(name, levels=1 << 20)
        shapes = [torch.Size([8, 12])] if name == "powersgd" else None
        got = state.sync(inp.clone(), 0, Decision(True, 2 if name == "topk" else 1), shapes).wait()
        # The dense all-reduce hands back the collective's own one-element list.
        got = got[0] if isinstance(got, list) else got
        err = (got - expect).abs().max().item()
        assert err <= tol + 1e-6, f"{name}: max error {err} > {tol} (world {world})"


def _ref_gtopk(vectors: list[torch.Tensor], k: int) -> torch.Tensor:
    """Straightforward dense reference of the gTop-k tree, including the fold of non-power-of-two ranks."""

    def keep(v: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(v)
        i = torch.topk(v.abs(), k).indices
        out[i] = v[i]
        return out

    world = len(vectors)
    p2 = 1 << (world.bit_length() - 1)
    cur = [keep(v) for v in vectors]
    for r in range(p2, world):
        cur[r - p2] = keep(cur[r - p2] + cur[r])
    step = 1
    while step < p2:
        cur = [keep(cur[r] + cur[r ^ step]) for r in range(p2)]
        step <<= 1
    return cur[0]


def gtopk_matches_reference(rank: int, world: int) -> None:
    n, k = 200, 10
    x = _data(rank, n, 3)
    val, idx = torch.topk(x.abs(), k)
    val = x[idx]
    g_idx, g_val = gtopk(idx, val, k)
    got = torch.zeros(n)
    got[g_idx] = g_val
    everyone = [torch.zeros(n) for _ in range(world)]
    dist.all_gather(everyone, x)
    want = _ref_gtopk(everyone, k)
    assert g_idx.numel() == k
    assert torch.allclose(got, want, atol=1e-6), f"gtopk differs from reference (world {world})"


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 16)
        self.b = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _train(rank: int, hook_args: dict | None, steps: int = 3) -> list[torch.Tensor]:
    import gradcomp

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(_Net(), bucket_cap_mb=0.0005)
    if hook_args is not None:
        gradcomp.register(model, **hook_args)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank + 10)
    for _ in range(steps):
        x = torch.randn(8, 6, generator=gen)
        y = torch.randint(0, 3, (8,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def hook_parity(rank: int, world: int) -> None:
    """With compression off (or lossless), the hook gives the same parameters as plain DDP."""
    plain = _train(rank, None)
    for args, tol in [
        (dict(compressor="none", plan="never"), 1e-6),
        (dict(compressor="topk", ratio=1.0, plan="always"), 1e-5),
        (dict(compressor="mstopk", ratio=0.01, plan="never"), 1e-6),
        (dict(compressor="fp16", plan="always"), 1e-2),
    ]:
        got = _train(rank, args)
        for a, b in zip(plain, got, strict=True):
            assert torch.allclose(a, b, atol=tol), f"hook {args} diverges from plain DDP (world {world})"


def plan_auto_agrees(rank: int, world: int) -> None:
    """plan='auto' fits a model on every rank and takes the same decisions everywhere."""
    import gradcomp

    model = torch.nn.parallel.DistributedDataParallel(_Net())
    state = gradcomp.register(model, compressor="mstopk", ratio=0.01, plan="auto")
    assert state.planner is not None
    sizes = [10, 5000, 100_000, 3_000_000]
    mine = torch.tensor([float(state.decide(n).compress) + 10 * state.decide(n).partitions for n in sizes])
    lo, hi = mine.clone(), mine.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    assert torch.equal(lo, hi), f"ranks disagree on the plan: {mine.tolist()}"
    assert not state.decide(10).compress


def pto_parity(rank: int, world: int) -> None:
    """A partitioned optimizer step gives the same parameters as the full step on every rank."""
    from gradcomp.pto import PartitionedOptimizer

    for cls, kw in [(torch.optim.SGD, dict(lr=0.1, momentum=0.9)), (torch.optim.Adam, dict(lr=0.01))]:
        torch.manual_seed(0)
        a, b = _Net(), _Net()
        b.load_state_dict(a.state_dict())
        full = cls(a.parameters(), **kw)
        part = PartitionedOptimizer(b.parameters(), cls, **kw)
        for step in range(3):
            torch.manual_seed(step)  # same gradient on every rank, as after an all-reduce
            for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
                g = torch.randn_like(pa)
                pa.grad, pb.grad = g.clone(), g.clone()
            full.step()
            part.step()
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.allclose(pa, pb, atol=1e-6), f"PTO with {cls.__name__} differs (world {world})"


def all_checks(rank: int, world: int) -> None:
    for check in (lossless, gtopk_matches_reference, hook_parity, plan_auto_agrees, pto_parity):
        check(rank, world)


def _clusters(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points of a fixed 10-class task (the class centres never change), sampled with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(10, 32, generator=torch.Generator().manual_seed(99)) * 0.45
    y = torch.randint(0, 10, (n,), generator=gen)
    return centers[y] + torch.randn(n, 32, generator=gen), y


#: Steps to the plateau of dense training (at 200 steps top-1% + EF still lags by ~2.5 points).
EF_STEPS = 500


def accuracy_after(rank: int, hook_args: dict | None, seed: int = 0, steps: int = EF_STEPS) -> float:
    """Held-out accuracy of a 32-512-10 MLP after ``steps`` DDP steps of 32 samples per rank.

    ``seed`` fixes the initial weights and each rank's training draw (seed 0 is the historical single run); the
    held-out set and the class centres are the same for every seed, so seeds differ only in init and sampling.
    """
    import gradcomp

    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    model = torch.nn.parallel.DistributedDataParallel(net)
    if hook_args is not None:
        gradcomp.register(model, **hook_args)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = _clusters(steps * 32, seed=rank + 10_000 * seed)
    for i in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[i * 32 : (i + 1) * 32]), y[i * 32 : (i + 1) * 32])
        loss.backward()
        opt.step()
    xt, yt = _clusters(4000, seed=1000)
    with torch.no_grad():
        return float((net(xt).argmax(1) == yt).float().mean())


TOPK_EF = dict(compressor="topk", ratio=0.01, error_feedback=True, plan="always")
TOPK_NO_EF = dict(compressor="topk", ratio=0.01, error_feedback=False, plan="always")

# Why several seeds and this margin. The top-1% run is chaotic: a last-bit difference in any sum flips one
# top-k pick and the runs part ways, so the same seed gives a different accuracy on a CPU with other vector
# kernels (seed 0 alone: 0.7910-0.7945 across ATEN_CPU_CAPABILITY / MKL_CBWR settings on one machine, while
# dense stays at 0.8030). That spread is the seed-to-seed spread in small, so the check averages seeds and its
# margin comes from the distribution over seeds, measured with
# ``python -m tests.gradcomp.measure_ef_margin --seeds 20`` (numbers in that module's docstring).
EF_SEEDS = (0, 1, 2, 3)
EF_MARGIN = 0.015  # 4.5 standard deviations of the 4-seed mean below its measured mean (20 seeds)


def topk_ef_accuracy_close_to_dense(rank: int, world: int) -> None:
    """Top-1% with error feedback reaches dense accuracy within ``EF_MARGIN``, averaged over ``EF_SEEDS``."""
    gaps = []
    for seed in EF_SEEDS:
        dense = accuracy_after(rank, None, seed)
        sparse = accuracy_after(rank, TOPK_EF, seed)
        gaps.append(sparse - dense)
        if rank == 0:
            print(f"seed {seed}: dense {dense:.4f}, top-1% + EF {sparse:.4f}")
    mean_gap = sum(gaps) / len(gaps)
    assert mean_gap >= -EF_MARGIN, (
        f"top-1% + EF trails dense by {-mean_gap:.4f} on average over seeds {EF_SEEDS} "
        f"(per seed {[round(g, 4) for g in gaps]}); allowed {EF_MARGIN}"
    )
