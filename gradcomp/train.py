"""Reference data-parallel trainer: data stalls and communication stalls measured side by side.

Run under torchrun (one process per worker; without torchrun it runs as a world of one)::

    torchrun --nproc-per-node 2 -m gradcomp.cli train --compressor mstopk --ratio 0.01 --plan auto

Per iteration it records the wait for the batch (``dsanalyzer.measure.timeline.Timeline``, the same boundary the
profiler uses), the step time, the communication time the hook measured, and the part of it that was not hidden
behind backward compute (``comm_exposed_s``: from the last bucket's arrival to the end of ``backward()``).
``compute_s = step_s - comm_exposed_s``. Rank 0 writes a JSON report (per-iteration rows and a summary).
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from gradcomp.models import build_model

__all__ = ["train", "TensorImages", "BASELINES"]

#: PyTorch's own comm hooks, for comparison (``--baseline``); each is timed through ``hooks.timed_hook``.
BASELINES = ("ddp", "torch-fp16", "torch-powersgd")


class TensorImages(Dataset):
    """In-memory synthetic images, for measuring communication without data stalls: a smooth class pattern
    (a random 4x4 image per class, upsampled, unit variance) times ``signal`` plus unit Gaussian noise.

    The pattern is low-frequency so that it survives the CNNs' pooling (a per-pixel pattern would average out
    and leave the VGG-like net on a long plateau). ``split="eval"`` draws fresh noise over the same class
    patterns: a held-out set from the same distribution.
    """

    def __init__(
        self, n: int, classes: int, size: int, seed: int = 0, signal: float = 0.5, split: str = "train"
    ) -> None:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        gen = torch.Generator().manual_seed(seed)
        coarse = torch.randn(classes, 3, 4, 4, generator=gen)
        base = torch.nn.functional.interpolate(
            coarse, size=(size, size), mode="bilinear", align_corners=False
        )
        base = base / base.std()
        noise = torch.Generator().manual_seed(seed * 2 + (1 if split == "train" else 2) + 1000)
        self.labels = torch.arange(n) % classes
        self.images = base[self.labels] * signal + torch.randn(n, 3, size, size, generator=noise)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], int(self.labels[i])


def _init_dist(backend: str) -> tuple[int, int, torch.device]:
    if not dist.is_initialized():
        if "RANK" in os.environ:
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300))
        else:
            # A world of one rendezvouses with itself: an in-process store, no port to pick (a port found free
            # can be taken by another process before it is bound).
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    rank = dist.get_rank()
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    return rank, dist.get_world_size(), device


def _datasets(args, rank: int) -> tuple[Dataset, Dataset | None]:
    """(training set, held-out evaluation set or None when evaluation is off)."""
    evaluate = args.eval_every > 0
    if args.data == "tensors":

        def make(n: int, split: str) -> TensorImages:
            return TensorImages(n, args.classes, args.image_size, args.seed, args.signal, split)

        return make(args.samples, "train"), make(args.eval_samples, "eval") if evaluate else None
    import coordl

    root = args.data
    if root is None:
        root = os.path.join(tempfile.gettempdir(), f"gradcomp-synth-{args.samples}-{args.classes}")
        if rank == 0:  # one writer; make_dataset is idempotent, the others wait at the barrier
            coordl.synth.make_dataset(root, args.samples, args.classes, width=64, height=48, workers=1)
        dist.barrier()
    train_set = coordl.ImageFolder(root, transform=coordl.transforms.train_transform(args.image_size))
    if not evaluate:
        return train_set, None
    # Hold out every k-th file (a fixed, class-balanced-enough subset) and train on the rest.
    items = train_set.items
    n_eval = min(args.eval_samples, len(items) // 2)
    held = set(range(0, len(items), max(len(items) // max(n_eval, 1), 1))[:n_eval])
    eval_set = coordl.ImageFolder(
        root, transform=coordl.transforms.eval_transform(args.image_size, resize=args.image_size)
    )
    eval_set.items = [it for i, it in enumerate(items) if i in held]
    train_set.items = [it for i, it in enumerate(items) if i not in held]
    return train_set, eval_set


class HeldOut:
    """A fixed held-out set split across ranks. ``accuracy(model)`` sums (correct, seen) over ranks in one
    all-reduce of exact integer counts, so every rank gets the same accuracy and takes the same stop decision."""

    def __init__(self, dataset: Dataset, rank: int, world: int, device: torch.device) -> None:
        samples = [dataset[i] for i in range(rank, len(dataset), world)]
        self.x = torch.stack([torch.as_tensor(x) for x, _ in samples]).to(device)
        self.y = torch.tensor([int(y) for _, y in samples], dtype=torch.long, device=device)
        self.device = device

    def accuracy(self, model: torch.nn.Module, chunk: int = 256) -> float:
        was_training = model.training
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(self.y), chunk):
                correct += int((model(self.x[i : i + chunk]).argmax(1) == self.y[i : i + chunk]).sum())
        model.train(was_training)
        counts = torch.tensor([correct, len(self.y)], dtype=torch.float64, device=self.device)
        dist.all_reduce(counts)
        return float(counts[0] / counts[1])


def _install_sync(model: torch.nn.parallel.DistributedDataParallel, args):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    from gradcomp.hooks import timed_hook

    if args.baseline is None:
        import gradcomp

        state = gradcomp.register(
            model, compressor=args.compressor, ratio=args.ratio, error_feedback=not args.no_error_feedback,
            plan=args.plan, powersgd_rank=args.powersgd_rank, start_iter=args.warmup_iters,
        )  # fmt: skip
        if state.hooked:
            return state
        # plan="auto" left DDP's own all-reduce in place; time it the way the "ddp" baseline is timed.
        timer, hook = timed_hook(None, default_hooks.allreduce_hook)
        timer.planner = state.planner
        model.register_comm_hook(timer, hook)
        return timer
    if args.baseline == "ddp":
        state, hook = timed_hook(None, default_hooks.allreduce_hook)
    elif args.baseline == "torch-fp16":
        state, hook = timed_hook(None, default_hooks.fp16_compress_hook)
    else:
        ps = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=args.powersgd_rank,
            start_powerSGD_iter=max(args.warmup_iters, 2),
        )  # fmt: skip
        state, hook = timed_hook(ps, powerSGD_hook.powerSGD_hook)
    model.register_comm_hook(state, hook)
    return state


def _loader(dataset: Dataset, args, rank: int, world: int):
    import coordl

    sampler = torch.utils.data.DistributedSampler(dataset, world, rank, shuffle=True, seed=args.seed)
    workers = 0 if args.data == "tensors" else args.workers
    with warnings.catch_warnings():
        # In-memory tensors have no fetch/prep split to cache; coordl's warning about that is expected here.
        warnings.filterwarnings("ignore", message=".*no fetch/prep split.*")
        loader = coordl.DataLoader(
            dataset, batch_size=args.batch_size, sampler=sampler, num_workers=workers, drop_last=True
        )
    return loader, sampler


def _summary(rows: list[dict], batch: int, warmup: int) -> dict:
    from dsanalyzer.measure.timeline import summarize

    body = rows[warmup:] or rows
    timeline = summarize(
        [r["data_wait_s"] for r in rows], [r["step_s"] for r in rows], [batch] * len(rows), warmup
    )

    def med(key: str) -> float:
        return statistics.median(r[key] for r in body)

    tail = rows[-min(len(rows), 20) :]
    return {
        "iters": len(rows),
        "data_wait_s": timeline.wait_s,
        "step_s": timeline.step_s,
        "iter_s": timeline.iter_s,
        "samples_per_s_per_rank": timeline.samples_per_s,
        "compute_s": med("compute_s"),
        "comm_s": med("comm_s"),
        "comm_exposed_s": med("comm_exposed_s"),
        "compressed_buckets": med("compressed_buckets"),
        "final_loss": statistics.fmean(r["loss"] for r in tail),
        "final_acc": statistics.fmean(r["acc"] for r in tail),
        "total_s": rows[-1]["t_s"] if rows else 0.0,
    }


def _setup(args, device: torch.device):
    """(DDP model, the installed sync's timer/state, seconds ``register`` took, optimizer)."""
    model = build_model(args.model, args.classes).to(device)
    bucket_cap_mb = args.bucket_cap_mb
    if args.baseline == "torch-powersgd" and args.backend == "gloo":
        # PyTorch's PowerSGD hook waits on collectives inside gloo's callback threads; with two buckets in
        # flight both gloo threads block and training deadlocks (seen with torch 2.13). One bucket avoids it.
        bucket_cap_mb = max(
            bucket_cap_mb, sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20 + 1
        )
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    t_reg = time.perf_counter()
    sync = _install_sync(ddp, args)
    register_s = time.perf_counter() - t_reg
    if args.pto:
        from gradcomp.pto import PartitionedOptimizer

        opt = PartitionedOptimizer(ddp.parameters(), torch.optim.SGD, lr=args.lr, momentum=0.9)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    return ddp, sync, register_s, opt


def _step(ddp, opt, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> tuple:
    """One training step: (logits, loss, time backward ended, time the step ended)."""
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    opt.zero_grad()
    out = ddp(x)
    loss = torch.nn.functional.cross_entropy(out, y)
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t_bwd = time.perf_counter()
    opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, loss, t_bwd, time.perf_counter()


def train(args) -> dict:
    """Train for ``args.iters`` iterations; returns the report (rank 0 also writes it to ``args.report``)."""
    rank, world, device = _init_dist(args.backend)
    torch.manual_seed(args.seed)
    if args.target_acc is not None and args.eval_every <= 0:
        args.eval_every = 10  # a target needs evaluations to be reached
    dataset, eval_set = _datasets(args, rank)
    ddp, sync, register_s, opt = _setup(args, device)
    loader, sampler = _loader(dataset, args, rank, world)
    held_out = HeldOut(eval_set, rank, world, device) if eval_set is not None else None
    eval_curve: list[tuple[int, float, float]] = []  # (iterations done, training wall s, held-out accuracy)
    eval_s = 0.0  # time spent evaluating: left out of t_s, so time to accuracy counts training only
    reached: tuple[int, float] | None = None
    from dsanalyzer.measure.timeline import Timeline

    timeline = Timeline(sync=torch.cuda.synchronize if device.type == "cuda" else None)
    rows: list[dict] = []
    epoch, it = 0, iter(loader)
    acc_window: list[float] = []
    dist.barrier()
    t_start = time.perf_counter()
    while len(rows) < args.iters:
        timeline.next_started()
        try:
            x, y = next(it)
        except StopIteration:
            timeline.abandon_pending()
            epoch += 1
            sampler.set_epoch(epoch)
            it = iter(loader)
            continue
        t_got = timeline.next_ended(len(y))
        out, loss, t_bwd, t_end = _step(ddp, opt, x, y, device)
        t_s = t_end - t_start - eval_s
        stats = sync.take_stats()
        exposed = max(0.0, t_bwd - stats["last_ready"]) if stats["buckets"] else 0.0
        acc = float((out.argmax(1) == y.to(device)).float().mean())
        acc_window = (acc_window + [acc])[-20:]
        step_s = t_end - t_got
        rows.append({
            "iter": len(rows), "t_s": t_s, "data_wait_s": timeline.wait_s[-1], "step_s": step_s,
            "compute_s": max(step_s - exposed, 0.0), "comm_s": stats["comm_s"], "comm_exposed_s": exposed,
            "compressed_buckets": stats["compressed_buckets"], "buckets": stats["buckets"],
            "loss": loss.item(), "acc": acc, "running_acc": statistics.fmean(acc_window),
        })  # fmt: skip
        if held_out is not None and (len(rows) % args.eval_every == 0 or len(rows) == args.iters):
            t_eval = time.perf_counter()
            eval_acc = held_out.accuracy(ddp.module)
            eval_s += time.perf_counter() - t_eval
            eval_curve.append((len(rows), t_s, eval_acc))
            # eval_acc is identical on every rank (one all-reduce of integer counts), so all ranks stop here
            # together: this is the broadcast of the decision.
            if args.target_acc is not None and eval_acc >= args.target_acc:
                reached = (len(rows), t_s)
                break
    timeline.next_started()  # closes the last step
    report = {
        "method": args.baseline or f"gradcomp:{args.compressor}",
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "world_size": world,
        "device": str(device),
        "register_s": register_s,
        "planner": getattr(getattr(sync, "planner", None), "describe", lambda: None)(),
        "summary": _summary(rows, args.batch_size, args.warmup_report),
        "target_acc": args.target_acc,
        "iters_to_accuracy": reached[0] if reached else None,
        "time_to_accuracy_s": reached[1] if reached else None,
        "eval_acc": eval_curve[-1][2] if eval_curve else None,
        "eval_s": eval_s,
        "eval_curve": eval_curve,
        "iterations": rows,
    }
    _write_report(report, rank, args)
    return report


def _write_report(report: dict, rank: int, args) -> None:
    if rank == 0 and args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(report, indent=1))
    if rank == 0 and not args.quiet:
        print(format_summary(report), file=sys.stdout, flush=True)


def format_summary(report: dict) -> str:
    """A short table: data wait, compute, communication (total and exposed), throughput, accuracy."""
    s = report["summary"]
    ms = lambda v: f"{v * 1e3:.1f} ms"  # noqa: E731
    lines = [
        f"gradcomp train: {report['method']}, world {report['world_size']}, {s['iters']} iterations",
        "| data wait | compute | comm (total) | comm (exposed) | iteration | samples/s/rank | final acc |",
        "|---|---|---|---|---|---|---|",
        f"| {ms(s['data_wait_s'])} | {ms(s['compute_s'])} | {ms(s['comm_s'])} | {ms(s['comm_exposed_s'])} "
        f"| {ms(s['iter_s'])} | {s['samples_per_s_per_rank']:.1f} | {s['final_acc']:.3f} |",
    ]
    if report.get("eval_curve"):
        it, wall, acc = report["eval_curve"][-1]
        if report.get("target_acc") is None:
            lines.append(f"held-out accuracy {acc:.3f} after {it} iterations")
        elif report["iters_to_accuracy"] is None:
            lines.append(
                f"target {report['target_acc']:g} not reached in {it} iterations (held-out {acc:.3f})"
            )
        else:
            lines.append(
                f"target {report['target_acc']:g} reached: held-out {acc:.3f} after {it} iterations, "
                f"{wall:.1f} s of training"
            )
    if report.get("planner"):
        lines.append(f"planner fit: {report['planner']}")
    return "\n".join(lines)
