"""Fault: a JPEG in an ImageFolder is corrupt (truncated, empty, not a JPEG at all).

Promise: with the default ``on_error="raise"`` the batch holding the item raises ``CorruptItemError``
naming the file, in the training process, from a worker, and the epoch goes on as torch's does; with ``on_error="skip"`` the epoch completes
without that item, which is counted in ``stats()["skipped_items"]`` and logged once.
Real worker processes; with and without a sample cache (the decode then runs in the cached prefix).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import coordl
from coordl.datasets.synth import make_dataset
from coordl.errors import CorruptItemError
from memcache import LocalStore

N = 24
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def clean_root(tmp_path_factory) -> Path:
    return Path(make_dataset(tmp_path_factory.mktemp("jpegs"), n=N, classes=3, width=64, height=48, seed=0))


def _damage(root: Path, how: str) -> Path:
    victim = sorted(root.rglob("*.jpg"))[N // 2]
    data = victim.read_bytes()
    victim.write_bytes(
        {"truncated": data[: len(data) // 3], "empty": b"", "not-jpeg": b"GIF89a" + data[6:]}[how]
    )
    return victim


def _copy(src: Path, dst: Path) -> Path:
    for f in src.rglob("*"):
        if f.is_file():
            (dst / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            (dst / f.relative_to(src)).write_bytes(f.read_bytes())
    return dst


def _expect_corrupt(root: Path, tmp_path: Path, cached: bool) -> CorruptItemError:
    ds = coordl.ImageFolder(root, transform=coordl.transforms.train_transform(32, resize=40))
    store = LocalStore(8 << 20, name="jpeg", directory=tmp_path) if cached else None
    try:
        with coordl.DataLoader(ds, batch_size=4, num_workers=2, sample_cache=store) as loader:
            try:
                for _ in loader:
                    pass
            except CorruptItemError as e:
                return e
        raise AssertionError("the corrupt JPEG raised nothing")
    finally:
        if store is not None:
            store.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["truncated", "empty", "not-jpeg"])
@pytest.mark.parametrize("cached", [False, True], ids=["plain", "sample-cache"])
def test_corrupt_jpeg_is_named(tmp_path: Path, clean_root: Path, how: str, cached: bool) -> None:
    root = _copy(clean_root, tmp_path / "ds")
    victim = _damage(root, how)
    error = _expect_corrupt(root, tmp_path, cached)
    assert f"{victim}: cannot decode image" in str(error), str(error)


@pytest.mark.timeout(120)
def test_corrupt_jpeg_error_carries_path_and_index_across_workers(tmp_path: Path, clean_root: Path) -> None:
    root = _copy(clean_root, tmp_path / "ds")
    victim = _damage(root, "truncated")
    error = _expect_corrupt(root, tmp_path, cached=False)
    assert error.path == str(victim) and error.index == N // 2


SKIP_RUN = """
import json, logging, sys
sys.path.insert(0, {root!r})
import coordl
from memcache import LocalStore
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="LOG %(name)s %(message)s")
root, cached, store_dir = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
ds = coordl.ImageFolder(root, transform=coordl.transforms.train_transform(32, resize=40))
store = LocalStore(8 << 20, name="jpeg", directory=store_dir) if cached else None
with coordl.DataLoader(ds, batch_size=4, num_workers=2, sample_cache=store, on_error="skip") as loader:
    counts = [sum(len(y) for _, y in loader) for _ in range(2)]
    stats = loader.stats()
print(json.dumps({{"counts": counts, "skipped": stats["skipped_items"]}}))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cached", [False, True], ids=["plain", "sample-cache"])
def test_corrupt_jpeg_is_a_counted_skip(tmp_path: Path, clean_root: Path, cached: bool) -> None:
    root = _copy(clean_root, tmp_path / "ds")
    victim = _damage(root, "truncated")
    # Its own process, so that the workers' log lines reach a stream the test can read.
    done = subprocess.run(
        [sys.executable, "-c", SKIP_RUN.format(root=str(ROOT)), str(root), "1" if cached else "0", str(tmp_path)],
        capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["counts"] == [N - 1, N - 1]  # each epoch completes without the bad item
    assert result["skipped"] == 2  # counted once per epoch
    logged = [ln for ln in done.stderr.splitlines() if ln.startswith("LOG") and str(victim) in ln]
    assert len(logged) == 1, done.stderr[-3000:]  # logged once, naming the file


@pytest.mark.timeout(120)
@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_a_corrupt_item_costs_its_batch_and_the_workers_stop_with_the_epoch(
    tmp_path: Path, clean_root: Path, persistent: bool
) -> None:
    """As torch's DataLoader: the worker's error reaches the caller for its batch, the epoch goes on with
    the next batch, and the epoch's workers stop when it ends (fresh) or at ``close()`` (persistent).

    Regression (flake hunt): an epoch's workers once idled on after it, until the collector stopped them,
    5 s per worker, inside an unrelated test's allocation."""
    import psutil

    root = _copy(clean_root, tmp_path / "ds")
    _damage(root, "truncated")
    before = {p.pid for p in psutil.Process().children()}
    ds = coordl.ImageFolder(root, transform=coordl.transforms.train_transform(32, resize=40))
    loader = coordl.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=persistent)
    for _epoch in range(2):  # the next epoch meets the item again
        items, errors, it = 0, [], iter(loader)
        while True:
            try:
                items += len(next(it)[1])
            except StopIteration:
                break
            except CorruptItemError as e:  # held: the caller keeps the error while it goes on
                errors.append(e)
        assert [e.index for e in errors] == [N // 2]
        assert items == N - 4  # only the failed batch is lost
    workers = [p for p in psutil.Process().children() if p.pid not in before]
    if persistent:
        assert len(workers) == 2 and all(w.is_running() for w in workers)  # kept for the next epoch
    else:
        gone, alive = psutil.wait_procs(workers, timeout=30)
        assert alive == [], f"{len(alive)} workers still running after the epoch ended"
    loader.close()
    gone, alive = psutil.wait_procs(workers, timeout=30)
    assert alive == [], f"{len(alive)} workers still running after close()"
