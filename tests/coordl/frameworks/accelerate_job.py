"""A 2-rank Accelerate job on CPU (gloo) over torch's or coordl's loader, prepared by ``accelerator.prepare``.

    torchrun --nproc_per_node=2 tests/coordl/frameworks/accelerate_job.py --loader coordl --out DIR
        [--epochs 2] [--stateful]   # use_stateful_dataloader (torchdata) and use_seedable_sampler: save_state resumes exactly
        [--save-at STEP --state DIR]         # accelerator.save_state after global step STEP, then stop
        [--resume DIR]                       # accelerator.load_state, then finish the run

Each rank writes DIR/rank<r>.json: the items it trained on per epoch, the prepared loader's class and
collate_fn, and for coordl the cache statistics per epoch (differences of ``loader.stats()`` on the
loader given to ``prepare``: Accelerate iterates a loader of its own over ``loader.dataset``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jobdata import loader_report, make_loader, write_rank  # noqa: E402

import coordl  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--loader", choices=("torch", "coordl"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--stateful", action="store_true")  # and a seedable sampler: each epoch's order is fixed
    p.add_argument("--save-at", type=int)
    p.add_argument("--state")
    p.add_argument("--resume")
    args = p.parse_args()
    config = DataLoaderConfiguration(
        use_stateful_dataloader=args.stateful,
        use_seedable_sampler=args.stateful,
        data_seed=0 if args.stateful else None,
    )
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    loader = make_loader(args.loader)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    start_epoch, step = 0, 0
    if args.resume:
        accelerator.load_state(args.resume)
        with open(os.path.join(args.resume, "progress.json")) as f:
            start_epoch, step = json.load(f)
    seen: dict[int, list[int]] = {}
    cache: list[dict[str, float]] = []
    for epoch in range(start_epoch, args.epochs):
        prepared.set_epoch(epoch)
        before = loader.stats() if isinstance(loader, coordl.DataLoader) else None
        for batch in prepared:
            seen.setdefault(epoch, []).extend(int(i) for i in batch)
            loss = model(batch.float().unsqueeze(1)).sum() * 0.0
            accelerator.backward(loss)
            optimizer.step()
            step += 1
            if step == args.save_at:
                accelerator.save_state(args.state)
                if accelerator.is_main_process:
                    with open(os.path.join(args.state, "progress.json"), "w") as f:
                        json.dump([epoch, step], f)
                break
        if before is not None:
            after = loader.stats()
            hits, misses = (after[k] - before[k] for k in ("cache_hits", "cache_misses"))
            cache.append({"epoch": epoch, "cache_hits": hits, "cache_misses": misses,
                          "hit_ratio": hits / (hits + misses) if hits + misses else 0.0})  # fmt: skip
        if step == args.save_at:
            break
    record = {
        "rank": accelerator.process_index,
        "world": accelerator.num_processes,
        "seen": seen,
        "epoch_cache": cache,
        "prepared_dataset": type(prepared.dataset).__name__,
        **loader_report(prepared),
    }
    if isinstance(loader, coordl.DataLoader):
        record["minio_paths"] = list(loader._chain.minio.paths)
    write_rank(args.out, accelerator.process_index, record)
    accelerator.end_training()
    # As torch's docs ask: without it gloo's threads may still hold work while the interpreter is torn
    # down, and a rank can die by SIGSEGV after its last line (seen once in CI; pytorch/pytorch#179291).
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
