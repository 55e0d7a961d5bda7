"""A 2-rank Lightning DDP job on CPU (gloo) whose train_dataloader returns torch's or coordl's loader.

    python tests/coordl/frameworks/lightning_job.py --loader coordl --out DIR [--epochs 2] [--strategy ddp_spawn]
        [--save-at STEP --ckpt FILE]   # write a checkpoint after global step STEP and stop there
        [--resume FILE]                # continue from that checkpoint

Each rank writes DIR/rank<r>.json: the items it trained on per epoch (and the global step of each
batch), the loader Lightning actually iterated and, for coordl, its per-epoch cache statistics.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import lightning as L
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jobdata import loader_report, make_loader, write_rank  # noqa: E402


class Module(L.LightningModule):
    def __init__(self, kind: str, out: str) -> None:
        super().__init__()
        self.kind, self.out = kind, out
        self.caught: list[str] = []
        self.layer = torch.nn.Linear(1, 1)
        self.seen: dict[int, list[int]] = {}
        self.steps: dict[int, list[int]] = {}
        self.report: dict = {}

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return make_loader(self.kind)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.setdefault(self.current_epoch, []).extend(int(i) for i in batch)
        self.steps.setdefault(self.current_epoch, []).append(int(self.global_step))
        return self.layer(batch.float().unsqueeze(1)).sum() * 0.0

    def on_train_epoch_end(self) -> None:
        self.report = loader_report(self.trainer.train_dataloader)

    def on_train_end(self) -> None:
        # In each rank's process (with ddp_spawn the launching process only holds a copy).
        record = {
            "rank": self.global_rank,
            "world": self.trainer.world_size,
            "seen": self.seen,
            "steps": self.steps,
        }
        record["warnings"] = [w for w in self.caught if "coordl" in w]
        write_rank(self.out, self.global_rank, {**record, **self.report})

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


class SaveAndStop(L.Callback):
    """Save a checkpoint after global step ``step`` (mid-epoch), then stop the run there."""

    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--loader", choices=("torch", "coordl"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--save-at", type=int)
    p.add_argument("--ckpt")
    p.add_argument("--resume")
    p.add_argument("--strategy", default="ddp", choices=("ddp", "ddp_spawn"))
    args = p.parse_args()
    L.seed_everything(0, verbose=False)
    module = Module(args.loader, args.out)
    callbacks = [SaveAndStop(args.save_at, args.ckpt)] if args.save_at is not None else []
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy=args.strategy, max_epochs=args.epochs, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=callbacks, num_sanity_val_steps=0,
    )  # fmt: skip
    warnings.showwarning = lambda message, *rest: module.caught.append(str(message))  # every rank's
    warnings.simplefilter("always")
    trainer.fit(module, ckpt_path=args.resume)


if __name__ == "__main__":
    main()
