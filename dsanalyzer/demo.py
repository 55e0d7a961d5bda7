"""``dsanalyzer demo``: the whole profile on an embedded default job, in a few minutes on 2 cores.

It writes a synthetic JPEG dataset (``coordl.synth``, cached between runs in the temp directory),
then profiles this module's own training script, an ordinary PyTorch loop (plain
``torch.utils.data.DataLoader`` over ``coordl.ImageFolder``, a small CNN), exactly as a user's
script would be profiled: ``dsanalyzer profile -- python -m dsanalyzer.demo --train --data DIR``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

__all__ = ["run_demo", "demo_dataset"]

_SIZE = (320, 240)
_CLASSES = 10


def demo_dataset(items: int) -> Path:
    """The synthetic dataset (created once per size; later calls return at once)."""
    from coordl.synth import make_dataset

    root = Path(tempfile.gettempdir()) / f"dsanalyzer-demo-data-{items}"
    return make_dataset(root, items, _CLASSES, width=_SIZE[0], height=_SIZE[1])


def run_demo(out_dir: str | None = None, items: int = 1500, iters: int = 60, quiet: bool = False) -> int:
    """Make the dataset, profile the demo training script, print the summary; returns an exit code."""
    from dsanalyzer.profiler import default_out_dir, profile_command
    from dsanalyzer.report import summary_text

    print(f"dsanalyzer demo: writing {items} synthetic {_SIZE[0]}x{_SIZE[1]} JPEGs (cached) ...", flush=True)
    root = demo_dataset(items)
    command = [sys.executable, "-m", "dsanalyzer.demo", "--train", "--data", str(root)]
    out = Path(out_dir) if out_dir else default_out_dir("demo")
    print(f"dsanalyzer demo: profiling `{' '.join(command)}`", flush=True)
    report = profile_command(command, out_dir=out, iters=iters, warmup=5, show_progress=not quiet)
    report.pop("_out_dir", None)
    print(summary_text(report))
    print(f"report: {out}/report.json  {out}/report.html")
    print(f"try:    dsanalyzer whatif {out}/report.json --cache-gb 1 --cpus 8")
    return 0


def _train(argv: list[str]) -> int:
    """The demo job: what a user's ``train.py`` looks like (nothing dsanalyzer-specific in it)."""
    p = argparse.ArgumentParser(prog="python -m dsanalyzer.demo --train")
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("-b", "--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)

    import torch
    from torch import nn

    import coordl

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dataset = coordl.ImageFolder(args.data, transform=coordl.transforms.train_transform(96, resize=112))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, drop_last=True
    )
    model = nn.Sequential(
        nn.Conv2d(3, 16, 5, stride=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, _CLASSES),
    )  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(args.epochs):
        for images, labels in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            opt.step()
        print(f"epoch {epoch} loss {loss.item():.3f}", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--train"]:
        sys.exit(_train(sys.argv[2:]))
    sys.exit(run_demo())
