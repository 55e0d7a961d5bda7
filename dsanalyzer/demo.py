"""``dsanalyzer demo``: profile a job with a real data stall, apply the fix the report names, verify it.

It writes a synthetic JPEG dataset (``coordl.synth``, cached between runs in the temp directory)
and profiles this module's own training script exactly as a user's script would be profiled
(``dsanalyzer profile -- python -m dsanalyzer.demo --train --data DIR ...``): a small CNN fed by
``coordl.DataLoader`` over the dataset on **emulated slow storage** (:mod:`dsanalyzer.demo_storage`:
reads rate-limited to ``--storage-mbps`` in user space, no page cache, labelled as emulated in the
report). The job is fetch-bound; the report's verdict names the change (a MinIO cache of so many
bytes) and its predicted samples/s; the demo then runs the job with that change three times
(``dsanalyzer verify --runs 3``) and shows predicted vs the measured median.

**The accelerator.** On a machine with a GPU the CNN's step runs there. On a CPU-only machine the
demo **emulates an accelerator**: each training step is a fixed ``--step-ms`` wait (default 30 ms,
what the CNN's step took on one core of the 2-core CI VM) instead of the CNN's forward/backward on
the CPU, labelled as emulated in the report. A GPU's step leaves the CPUs to the loader's workers;
a step on the CPU does not, and on a small shared machine it moved by 10-16% between the profile
and the verify runs (reports/bench_whatif.md, session 8), which is the demo's whole 10% target.
``--step-ms 0`` runs the CNN on the CPU as before.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["run_demo", "demo_dataset", "changed_command"]

_SIZE = (320, 240)
_CLASSES = 10
_FLAGS = {"num_workers": "--workers", "cache_bytes": "--cache-bytes"}
DEFAULT_STEP_MS = 30.0


def demo_dataset(items: int) -> Path:
    """The synthetic dataset (created once per size; later calls return at once)."""
    from coordl.datasets.synth import make_dataset

    root = Path(tempfile.gettempdir()) / f"dsanalyzer-demo-data-{items}"
    return make_dataset(root, items, _CLASSES, width=_SIZE[0], height=_SIZE[1])


def changed_command(command: list[str], change: dict) -> list[str]:
    """The demo's training command with the verdict's change applied as its flags."""
    out = list(command)
    for key, value in change.items():
        out += [_FLAGS[key], str(value)]
    return out


def run_demo(
    out_dir: str | None = None,
    items: int = 1500,
    iters: int = 60,
    quiet: bool = False,
    storage_mbps: float = 1.5,
    verify_runs: int = 3,
    min_seconds: float = 10.0,
    step_ms: float | None = None,
) -> int:
    """Make the dataset, profile the demo job, verify the fix; returns an exit code.

    ``step_ms``: None picks the accelerator: the GPU where there is one, else an emulated step of
    ``DEFAULT_STEP_MS``; 0 runs the CNN on the CPU; a positive value is the emulated step's length.
    """
    from dsanalyzer.profiler import default_out_dir, profile_command
    from dsanalyzer.report.text import summary_text, verify_text
    from dsanalyzer.verify import verify_command

    print(f"dsanalyzer demo: writing {items} synthetic {_SIZE[0]}x{_SIZE[1]} JPEGs (cached) ...", flush=True)
    root = demo_dataset(items)
    command = [sys.executable, "-m", "dsanalyzer.demo", "--train", "--data", str(root)]
    command += ["--storage-mbps", f"{storage_mbps:g}"]
    device, step_ms = _accelerator(step_ms)
    command += ["--device", device, "--step-ms", f"{step_ms:g}"]
    out = Path(out_dir) if out_dir else default_out_dir("demo")
    print(f"dsanalyzer demo: profiling `{' '.join(command)}`", flush=True)
    note = (
        f"emulated: the demo dataset's reads are rate-limited to {storage_mbps:g} MB/s in user space, "
        "with no page cache (dsanalyzer.demo_storage)"
    )
    report = profile_command(
        command,
        out_dir=out,
        iters=iters,
        warmup=5,
        show_progress=not quiet,
        page_cache_bytes=0,
        storage_note=note,
        compute_note=_compute_note(device, step_ms),
        min_seconds=min_seconds,
    )
    report.pop("_out_dir", None)
    print(summary_text(report))
    fix = (report.get("verdict") or {}).get("fix")
    if fix and not set(fix["change"]) <= set(
        _FLAGS
    ):  # e.g. the trainer's threads: not a flag of the demo job
        print(f"dsanalyzer demo: the fix ({fix['code']}) is not one of the demo job's flags; not verified")
    elif fix:
        changed = changed_command(command, fix["change"])
        print(f"dsanalyzer demo: verifying the fix: `{' '.join(changed)}`", flush=True)
        v = verify_command(
            out / "report.json",
            changed,
            iters=iters,
            show_progress=not quiet,
            runs=verify_runs,
            min_seconds=min_seconds,
        )
        print(verify_text(v))
    print(f"report: {out}/report.json  {out}/report.html")
    return 0


def _accelerator(step_ms: float | None) -> tuple[str, float]:
    """(device, step_ms) for the demo job: the GPU if there is one and no step was asked, else emulated."""
    if step_ms is None:
        import torch

        return ("cuda", 0.0) if torch.cuda.is_available() else ("cpu", DEFAULT_STEP_MS)
    return "cpu", float(step_ms)


def _compute_note(device: str, step_ms: float) -> str | None:
    if step_ms > 0:
        return (
            f"emulated accelerator: each training step is a {step_ms:g} ms wait in place of the CNN's "
            "forward/backward, leaving the CPUs to the loader as a GPU step would (dsanalyzer.demo)"
        )
    return "the CNN on the GPU" if device == "cuda" else "the CNN on the CPU, beside the loader's workers"


def _train(argv: list[str]) -> int:
    """The demo job: what a user's ``train.py`` looks like (only its storage is the demo's)."""
    p = argparse.ArgumentParser(prog="python -m dsanalyzer.demo --train")
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("-b", "--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--storage-mbps", type=float, default=0.0, help="emulated storage rate (0: the real disk)")
    p.add_argument("--cache-bytes", type=int, default=0, help="coordl's MinIO cache")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the CNN runs")
    p.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="emulate an accelerator: each step waits this long (0: run the CNN)",
    )
    args = p.parse_args(argv)

    import torch
    from torch import nn

    import coordl

    torch.set_num_threads(1)
    torch.manual_seed(0)
    transform = coordl.transforms.train_transform(96, resize=112)
    if args.storage_mbps > 0:
        from dsanalyzer.demo_storage import RateLimitedImageFolder

        dataset = RateLimitedImageFolder(args.data, args.storage_mbps * 1e6, transform=transform)
    else:
        dataset = coordl.ImageFolder(args.data, transform=transform)
    loader = coordl.DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, drop_last=True,
        cache_bytes=args.cache_bytes,
    )  # fmt: skip
    model = nn.Sequential(
        nn.Conv2d(3, 16, 5, stride=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, _CLASSES),
    )  # fmt: skip
    model = model.to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(args.epochs):
        for images, labels in loader:
            if args.step_ms > 0:  # the emulated accelerator: the step's time, none of the CPUs
                time.sleep(args.step_ms / 1e3)
                continue
            images, labels = images.to(args.device), labels.to(args.device)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            opt.step()
            if args.device == "cuda":
                torch.cuda.synchronize()  # the iteration ends when the step's work is done
        print(f"epoch {epoch}" + ("" if args.step_ms > 0 else f" loss {loss.item():.3f}"), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--train"]:
        sys.exit(_train(sys.argv[2:]))
    sys.exit(run_demo())
