"""A dataset read from an object store: find the bucket behind it, and probe its GET rate at several concurrencies.

Where :mod:`dsanalyzer.measure.fetchrate` reads a local or NFS dataset's files cold, a bucket has no page
cache to evict and no single bytes/s: its rate depends on the requests in flight (see
:mod:`dsanalyzer.model.store`). So for a bucket the profile

* finds it (:func:`find_bucket`): a ``coordl.ImageFolder("s3://...")``, a ``FileListDataset`` of ``s3://``
  keys, or any dataset whose item list (``samples``, ``files``, ``paths``, ``urls``, ``keys``...) or
  ``describe(i)`` holds ``s3://`` URLs: the endpoint, bucket, prefix, object count and mean object size;
* probes it (:func:`probe_bucket`) with the client coordl reads buckets with (:class:`coordl.objectstore.ObjectStore`,
  the dataset's own one when it has one, so the same endpoint and credentials): GETs of whole objects and
  of 1-byte ranges, one at a time and many at once, then whole objects at the loader's own concurrency;
* fits the store's four rates to the first four and checks the fit against the fifth (``check``): the
  model's items/s at the loader's concurrency beside the measured, with the measured rate's own spread
  over windows of the probe.

The probe costs a few hundred requests (a few seconds); they are counted in the dataset's ``stats()``.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dsanalyzer.model.store import StoreModel, fit

__all__ = ["BucketSource", "find_bucket", "probe_bucket", "bucket_section", "prep_without_fetch"]

_URL_ATTRS = ("samples", "imgs", "files", "paths", "file_list", "filenames", "urls", "keys", "objects")
_SCHEMES = ("s3://", "s3a://")
_MAX_CONNECTIONS = 32  # coordl's ObjectStore keeps this many connections per process
_WINDOWS = 5  # the check's spread: the measured rate over this many windows of the probe


def _is_url(value: Any) -> bool:
    return isinstance(value, str) and value.lower().startswith(_SCHEMES)


def _split(url: str) -> tuple[str, str]:
    bucket, _, key = url.split("://", 1)[1].partition("/")
    return bucket, key


class BucketSource:
    """The objects a dataset reads from one bucket, and a store to read them with."""

    def __init__(self, urls: list[str], store: Any = None, sizes: dict[str, int] | None = None) -> None:
        self.urls = urls
        self.bucket = _split(urls[0])[0]
        keys = [_split(u)[1] for u in urls if _split(u)[0] == self.bucket]
        self.keys = keys
        self.prefix = os.path.commonpath(keys) if len(keys) > 1 else os.path.dirname(keys[0])
        self.store = store
        self.sizes = sizes or {}

    def open_store(self) -> Any:
        """The dataset's own ObjectStore when it has one for this bucket, else one from the environment."""
        if self.store is None or self.store.location.bucket != self.bucket:
            from coordl.objectstore import ObjectStore  # dsanalyzer reads buckets through coordl's client

            self.store = ObjectStore(f"s3://{self.bucket}")
        return self.store

    def key_of(self, url_or_key: str) -> str:
        return _split(url_or_key)[1] if _is_url(url_or_key) else url_or_key


def _chain(obj: Any) -> list[Any]:
    out: list[Any] = []
    for _ in range(8):
        if obj is None or any(o is obj for o in out):
            break
        out.append(obj)
        obj = getattr(obj, "dataset", None) or getattr(obj, "source", None)
    return out


def _urls_of(obj: Any) -> list[str]:
    for attr in _URL_ATTRS:
        try:
            entries = getattr(obj, attr, None)
        except Exception:  # noqa: BLE001 - a property may refuse (e.g. a split it has not)
            continue
        if isinstance(entries, (list, tuple)) and entries:
            first = entries[0][0] if isinstance(entries[0], (list, tuple)) and entries[0] else entries[0]
            if _is_url(first):
                return [str(e[0] if isinstance(e, (list, tuple)) else e) for e in entries]
    describe = getattr(obj, "describe", None)
    if callable(describe):
        try:
            n = len(obj)
            if n and _is_url(describe(0)):
                return [str(describe(i)) for i in range(n)]
        except Exception:  # noqa: BLE001 - a describe that fails names no bucket
            pass
    return []


def _coordl_store(obj: Any) -> tuple[Any, dict[str, int]]:
    """A coordl bucket source or URL reader held by the dataset: its store and the listing's sizes."""
    for value in list(getattr(obj, "__dict__", {}).values()):
        module = type(value).__module__
        if not module.startswith("coordl.objectstore"):
            continue
        store = getattr(value, "store", None)
        if store is not None and callable(getattr(value, "objects", None)):  # S3Source: it has the listing
            return store, {o.key: o.size for o in value.objects()}
        options = getattr(value, "storage_options", None)
        if isinstance(options, dict) and callable(getattr(value, "read", None)):  # UrlReader: its options
            return options, {}
    return None, {}


def _stages(obj: Any) -> bool:
    """Whether the dataset copies what it reads onto local disk (an ``nfs_cache`` stager)."""
    return any(
        type(v).__module__.startswith("nfs_cache.") for v in list(getattr(obj, "__dict__", {}).values())
    )


def find_bucket(*datasets: Any) -> BucketSource | None:
    """The bucket a dataset reads (the first of ``datasets`` that names one: a loader's dataset, its
    source), or None when its items are not ``s3://`` objects."""
    chain = [obj for d in datasets for obj in _chain(d)]
    if any(
        _stages(obj) for obj in chain
    ):  # staged to local disk (stage_dir=): after a first read, not a bucket
        return None
    urls = next((u for u in map(_urls_of, chain) if u), [])
    if not urls:
        return None
    store, sizes = next((found for found in map(_coordl_store, chain) if found[0] is not None), (None, {}))
    if isinstance(store, dict):  # a URL reader's storage_options: a store for the first URL's bucket
        from coordl.objectstore import ObjectStore

        store = ObjectStore(f"s3://{_split(urls[0])[0]}", store)
    return BucketSource(urls, store, sizes)


def _run_point(
    read: Callable[[str], int], keys: list[str], concurrency: int, budget_s: float, max_requests: int
) -> dict:
    """``concurrency`` threads each GET the next key as soon as their last one ended, until the budget."""
    lock = threading.Lock()
    pending = iter(keys * (1 + max_requests // max(1, len(keys))))
    done: list[tuple[float, float, int]] = []  # (end time, seconds, bytes)
    deadline = time.perf_counter() + budget_s

    def worker() -> None:
        for _ in range(max_requests):
            with lock:
                key = next(pending, None) if len(done) < max_requests else None
            if key is None or time.perf_counter() > deadline:
                return
            t0 = time.perf_counter()
            n = read(key)
            t1 = time.perf_counter()
            with lock:
                done.append((t1, t1 - t0, n))

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        for f in [pool.submit(worker) for _ in range(concurrency)]:
            f.result()
    elapsed = max(time.perf_counter() - start, 1e-9)
    lat = sorted(d[1] for d in done)
    rates = _window_rates(done, start, elapsed)
    nbytes = sum(d[2] for d in done)
    return {
        "concurrency": concurrency,
        "requests": len(done),
        "request_bytes": nbytes / max(1, len(done)),
        "requests_per_s": len(done) / elapsed,
        "bytes_per_s": nbytes / elapsed,
        "latency_s": statistics.median(lat) if lat else 0.0,
        "latency_p10_s": lat[len(lat) // 10] if lat else 0.0,
        "latency_p90_s": lat[(len(lat) * 9) // 10] if lat else 0.0,
        "window_rates": rates,
        "spread": _spread(rates),
    }


def _window_rates(done: list[tuple[float, float, int]], start: float, elapsed: float) -> list[float]:
    """Requests/s in equal windows of the probe (the measured rate's own spread)."""
    width = elapsed / _WINDOWS
    counts = [0] * _WINDOWS
    for end, _s, _n in done:
        counts[min(_WINDOWS - 1, int((end - start) / width))] += 1
    return [c / width for c in counts]


def _spread(rates: list[float]) -> float:
    """The largest distance of a window's rate from their median, relative to the median."""
    med = statistics.median(rates) if rates else 0.0
    return max(med - min(rates), max(rates) - med) / med if med > 0 else 0.0


def probe_bucket(
    bucket: BucketSource,
    loader_concurrency: int,
    budget_s: float = 1.5,
    max_requests: int = 400,
    seed: int = 0,
) -> dict:
    """GET rates of the bucket at 1, the loader's and a high concurrency; the fitted store and its check."""
    store = bucket.open_store()
    keys = list(bucket.keys)
    random.Random(seed).shuffle(keys)

    def whole(key: str) -> int:
        return len(store.get(key))

    def tiny(key: str) -> int:
        return len(store.get_range(key, 0, 1))

    top = min(_MAX_CONNECTIONS, max(8, 2 * loader_concurrency))
    _run_point(whole, keys, top, budget_s, top)  # connections opened and the client made: not timed
    points = []
    for c, read in ((1, tiny), (1, whole), (top, tiny), (top, whole)):
        points.append({**_run_point(read, keys, c, budget_s, max_requests), "what": read.__name__})
    own = min(top, max(1, loader_concurrency))
    check_point = next((p for p in points if p["concurrency"] == own and p["what"] == "whole"), None)
    if check_point is None:
        check_point = {**_run_point(whole, keys, own, budget_s, max_requests), "what": "whole"}
        points.append(check_point)
    item_bytes = check_point["request_bytes"]
    model = fit(points, item_bytes)
    predicted = model.items_per_s(own, item_bytes)
    spread = check_point["spread"]
    error = check_point["requests_per_s"] / predicted - 1
    return {
        "points": points,
        "model": model.params(),
        "check": {
            "concurrency": own,
            "predicted_items_per_s": predicted,
            "measured_items_per_s": check_point["requests_per_s"],
            "error": error,
            "spread": spread,
            "agrees": abs(error) <= spread,
            "bound": model.bound(own, item_bytes),
        },
        "fetch": {
            "bytes_per_s": check_point["bytes_per_s"],
            "items_per_s": check_point["requests_per_s"],
            "items": check_point["requests"],
            "bytes": int(check_point["request_bytes"] * check_point["requests"]),
            "threads": own,
            "method": f"bucket GETs at the loader's concurrency ({own} in flight)",
        },
    }


def bucket_section(
    bucket: BucketSource, loader_concurrency: int, fetch_ahead: int, workers: int, budget_s: float = 1.5
) -> dict:
    """The report's ``source`` for a bucket: where it is, what it holds, the probe (``budget_s`` per point)
    and the fitted store."""
    out: dict[str, Any] = {
        "kind": "bucket",
        "url": f"s3://{bucket.bucket}/{bucket.prefix}".rstrip("/"),
        "bucket": bucket.bucket,
        "prefix": bucket.prefix,
        "objects": len(bucket.keys),
        "workers": workers,
        "fetch_ahead": fetch_ahead,
        "concurrency": loader_concurrency,
        "items_per_request": 1.0,
    }
    try:
        probe = probe_bucket(bucket, loader_concurrency, budget_s=budget_s)
    except Exception as e:  # noqa: BLE001 - a store that cannot be probed leaves a note, not a lost profile
        out["probe_error"] = f"{type(e).__name__}: {e}"
        return out
    store = bucket.store
    out["endpoint"] = getattr(store, "endpoint", None) or os.environ.get("AWS_ENDPOINT_URL") or None
    sizes = [bucket.sizes[k] for k in bucket.keys if k in bucket.sizes]
    if len(sizes) == len(bucket.keys):
        out["mean_object_bytes"], out["size_method"] = sum(sizes) / max(1, len(sizes)), "the bucket's listing"
    else:
        out["mean_object_bytes"], out["size_method"] = (
            probe["fetch"]["bytes"] / max(1, probe["fetch"]["items"]),
            "the probe's GETs",
        )
    out.update(probe)
    return out


def prep_without_fetch(scaling: dict, source: dict) -> dict:
    """The prep rates of a loader-alone run that could not be served from memory, its GETs taken out.

    A plain torch ``Dataset`` that GETs its objects itself (boto3, s3fs) has no fetch to replace, so its
    loader-alone run read the bucket too: each of its ``k`` workers waited one round trip per item
    (``request_s``) and then prepped, so ``rate_k = k / (request_s + k / P(k))`` and
    ``P(k) = k / (k / rate_k - request_s)``. Where a ceiling of the store bound the run (not the round trips:
    its rate within 10% of the store's request or byte ceiling) prep is unknown and the measured rate stays, a lower bound. The measured
    rates are kept as ``samples_per_s_with_fetch``.
    """
    params, avg = source.get("model"), source.get("mean_object_bytes")
    if not isinstance(params, dict) or not avg or not scaling.get("workers"):
        return scaling
    store = StoreModel(**params)
    own_s = store.request_s(avg)
    measured = list(scaling.get("samples_per_s") or [])
    prep = []
    for k, rate in zip(scaling["workers"], measured, strict=False):
        left = k / rate - own_s if rate > 0 else 0.0
        store_bound = store.bound(k, avg) != "latency" and rate >= 0.9 * store.items_per_s(k, avg)
        prep.append(rate if store_bound or left <= 0 else k / left)
    return {
        **scaling,
        # those runs waited on the bucket, not for cores: their share of the cores says nothing of other processes
        "cpu_share": [None] * len(prep),
        "samples_per_s": prep,
        "samples_per_s_with_fetch": measured,
        "fetch_subtracted": f"each worker's own GET ({own_s * 1e3:.1f} ms an item, the probed store) taken out: "
        "the dataset reads the bucket itself, so its items could not be served from memory",
    }
