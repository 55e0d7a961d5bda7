"""A prep-bound job for the remote-prep what-if: the standard recipe at 224 px, one local worker, no
model (the step is free), optionally with ``--remote ADDRESS --token TOKEN`` (coordl's remote_prep=).

    python tests/dsanalyzer/remote_job.py ROOT [--remote HOST:PORT --token T] [--epochs N]
"""

from __future__ import annotations

import argparse
import os

import torch

import coordl

parser = argparse.ArgumentParser()
parser.add_argument("root")
parser.add_argument("--remote")
parser.add_argument("--token")
parser.add_argument("--epochs", type=int, default=100)
parser.add_argument("--depth", type=int, default=int(os.environ.get("REMOTE_JOB_DEPTH", "2")))
args = parser.parse_args()
remote = coordl.RemotePrep(args.remote, token=args.token, depth=args.depth) if args.remote else None
data = coordl.ImageFolder(args.root, transform=coordl.transforms.train_transform(224))
loader = coordl.DataLoader(
    data,
    batch_size=32,
    shuffle=True,
    num_workers=1,
    generator=torch.Generator().manual_seed(0),
    remote_prep=remote,
)
for _ in range(args.epochs):
    for _batch in loader:  # no model: the job is its data path (prep-bound)
        pass
loader.close()
