"""Fault: the sample cache holds entries written by an older deterministic transform.

Promise: a job whose deterministic prep differs (another resize here; a changed decoder or parameter
works the same way: the transform's repr is in the key) never gets those arrays: every lookup is a
miss, and its images are bit-identical to a run without any cache. Each run is its own process, as
two jobs (or yesterday's job and today's) are; the store outlives the first one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memcache import LocalStore

ROOT = Path(__file__).resolve().parents[2]
N = 18

# argv: dataset root, resize, output .npy, store kind ("none", "redis", "local"), store address/dir.
RUN = """
import json, sys
sys.path.insert(0, {root!r})
import numpy as np
import coordl
from memcache import LocalStore, RedisStore
root, resize, out, kind, where = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
store = {{"none": lambda: None, "redis": lambda: RedisStore(where.split(",")),
          "local": lambda: LocalStore(16 << 20, name="oldprep", directory=where)}}[kind]()
ds = coordl.ImageFolder(root, transform=coordl.transforms.eval_transform(32, resize=resize))
with coordl.DataLoader(ds, batch_size=6, num_workers=2, sample_cache=store) as loader:
    images = np.concatenate([x.numpy() for x, _ in loader])
    stats = loader.stats()
np.save(out, images)
print(json.dumps({{k: stats.get(k, 0) for k in ("sample_cache_hits", "sample_cache_misses",
                                                "sample_cache_errors")}}))
"""


@pytest.fixture(scope="module")
def image_root(tmp_path_factory) -> str:
    from coordl.datasets.synth import make_dataset

    return str(make_dataset(tmp_path_factory.mktemp("imgs"), n=N, classes=3, width=64, height=48, seed=0))


def _run(tmp_path: Path, root: str, resize: int, kind: str, where: str, tag: str) -> tuple[np.ndarray, dict]:
    out = tmp_path / f"{tag}.npy"
    done = subprocess.run(
        [sys.executable, "-c", RUN.format(root=str(ROOT)), root, str(resize), str(out), kind, where],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out), json.loads(done.stdout.strip().splitlines()[-1])


def _old_then_new(tmp_path: Path, root: str, kind: str, where: str) -> None:
    _, old = _run(tmp_path, root, 40, kind, where, "old")
    assert old["sample_cache_misses"] == N  # the old transform's run filled the store
    again, repeat = _run(tmp_path, root, 40, kind, where, "again")
    assert repeat["sample_cache_hits"] == N  # the entries are there and served to the same transform
    new, stats = _run(tmp_path, root, 48, kind, where, "new")
    assert stats["sample_cache_hits"] == 0 and stats["sample_cache_misses"] == N, stats
    reference, _ = _run(tmp_path, root, 48, "none", "", "reference")
    assert np.array_equal(new, reference)  # never a pixel of the old transform's arrays
    assert not np.array_equal(again, reference)  # (the two transforms do differ)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_local_store_never_serves_an_older_transforms_entry(tmp_path: Path, image_root: str) -> None:
    keeper = LocalStore(16 << 20, name="oldprep", directory=tmp_path)  # the store outlives each run
    try:
        _old_then_new(tmp_path, image_root, "local", str(tmp_path))
    finally:
        keeper.close()


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_redis_store_never_serves_an_older_transforms_entry(
    tmp_path: Path, image_root: str, redis_nodes
) -> None:
    _old_then_new(tmp_path, image_root, "redis", ",".join(s.address for s in redis_nodes))
