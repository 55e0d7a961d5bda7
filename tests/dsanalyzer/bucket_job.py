"""A training job that reads a bucket, for dsanalyzer's tests and benchmarks: unmodified, profiled from outside.

``coordl.ImageFolder("s3://...")`` streamed through ``coordl.DataLoader`` (endpoint and keys from the
environment, as a user's job gets them), or with ``--plain`` a torch ``Dataset`` that GETs its ``urls`` with
boto3 through torch's DataLoader; the step sleeps a fixed time (a GPU step on a CPU-only machine).

    python tests/dsanalyzer/bucket_job.py --url s3://data/train --workers 2 --fetch-ahead 1 --cache-bytes 0
"""

from __future__ import annotations

import argparse
import io
import time

import numpy as np
import torch

import coordl


class PlainBucketDataset(torch.utils.data.Dataset):
    """What a user writes without coordl: a list of s3:// URLs, one boto3 GET per item, PIL to decode."""

    def __init__(self, url: str) -> None:
        import boto3

        bucket, _, prefix = url[len("s3://") :].partition("/")
        self.bucket, self._client = bucket, None
        pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        keys = sorted(
            o["Key"] for page in pages for o in page.get("Contents", []) if o["Key"].endswith(".jpg")
        )
        self.urls = [f"s3://{bucket}/{k}" for k in keys]
        classes = sorted({k.split("/")[-2] for k in keys})
        self.targets = [classes.index(k.split("/")[-2]) for k in keys]

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, i: int):
        import boto3
        from PIL import Image

        if self._client is None:  # one client per worker process
            self._client = boto3.client("s3")
        key = self.urls[i][len(f"s3://{self.bucket}/") :]
        raw = self._client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return np.asarray(Image.open(io.BytesIO(raw)).convert("RGB")), self.targets[i]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--fetch-ahead", type=int, default=1)
    p.add_argument("--cache-bytes", type=int, default=0)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--epochs", type=int, default=1000)
    p.add_argument("--plain", action="store_true", help="torch's DataLoader over a boto3 Dataset")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.plain:
        loader = torch.utils.data.DataLoader(
            PlainBucketDataset(a.url), batch_size=a.batch, shuffle=True, num_workers=a.workers, drop_last=True
        )
    else:
        ds = coordl.ImageFolder(a.url, transform=coordl.transforms.Compose([coordl.transforms.Decode()]))
        loader = coordl.DataLoader(
            ds, batch_size=a.batch, shuffle=True, num_workers=a.workers, fetch_ahead=a.fetch_ahead,
            cache_bytes=a.cache_bytes, drop_last=True,
        )  # fmt: skip
    for _ in range(a.epochs):
        for _images, _labels in loader:
            time.sleep(a.step_ms / 1e3)


if __name__ == "__main__":
    main()
