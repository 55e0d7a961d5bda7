"""A plain GPU training script whose CNN's width is an argument, for the what-if's GPU axis.

    python scripts/gpu/train_job.py --data DIR --width 384 --device cuda

What a user's ``train.py`` looks like: ``coordl.DataLoader`` over an ImageFolder, the model's
forward/backward on the device, synchronised at the end of each step. A narrower network is the same
job with a shorter step: the "faster GPU" of ``dsanalyzer whatif --gpu-speedup``.
"""

from __future__ import annotations

import argparse
import sys


def build_model(width: int, blocks: int, classes: int):
    """A plain CNN: a stride-2 stem, ``blocks`` 3x3 conv-BN-ReLU layers at ``width``, pool, linear."""
    from torch import nn

    layers = [nn.Conv2d(3, width, 5, stride=2, padding=2), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
    for _ in range(blocks):
        layers += [
            nn.Conv2d(width, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        ]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes)]
    return nn.Sequential(*layers)


def make_step(model, device: str, lr: float = 0.05):
    """The training step: forward, backward, SGD; synchronised so its end is the iteration's end."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    def step(images, labels):
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        return loss

    return step


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="train_job.py")
    p.add_argument("--data", required=True)
    p.add_argument("--width", type=int, default=384, help="channels of every conv layer")
    p.add_argument("--blocks", type=int, default=8, help="3x3 conv layers after the stem")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--size", type=int, default=96, help="crop size")
    p.add_argument("-b", "--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=100)
    args = p.parse_args(argv)

    import torch

    import coordl

    torch.manual_seed(0)
    data = coordl.ImageFolder(
        args.data, transform=coordl.transforms.train_transform(args.size, resize=args.size + 16)
    )
    loader = coordl.DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                               drop_last=True, pin_memory=args.device == "cuda")  # fmt: skip
    model = build_model(args.width, args.blocks, len(data.classes)).to(args.device)
    step = make_step(model, args.device)
    for epoch in range(args.epochs):
        for images, labels in loader:
            loss = step(images, labels)
        print(f"epoch {epoch} loss {loss.item():.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
