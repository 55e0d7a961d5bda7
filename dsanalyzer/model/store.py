"""An object store's fetch rate: requests per second and bytes per second, at the loader's concurrency.

A bucket answers each GET after a round trip, whatever its size, and its link (or its servers) carry only so
many bytes and so many requests per second. So, unlike a local disk, a bucket's rate depends on how many
requests the loader keeps in flight (``concurrency``: its workers, times coordl's ``fetch_ahead`` threads in
each) and on how many items one request brings (1 for loose files, a shard's items for tar shards)::

    request_s(b)    = latency_s + b / stream_bytes_per_s            one request of b bytes, alone
    requests/s      = min(concurrency / request_s(b), request_rate, bandwidth_bytes_per_s / b)
    items/s         = requests/s * items_per_request, with b = item_bytes * items_per_request

that is, a batch's fetch time is the longest of its requests x the round trip / concurrency, its requests /
the request rate and its bytes / the bandwidth. The request and byte ceilings are separate resources (the
server's work per request, the link's bytes) that work side by side, hence a min and not a sum: on a local
moto server with 2 kB objects, whole objects and 1-byte ranges both ran at ~230 GETs/s with 8 in flight, so a
summed cost would have halved the predicted rate. The four parameters come from :func:`fit`, over the probe of
:mod:`dsanalyzer.measure.objectstore`: GETs of whole objects and of 1-byte ranges, one at a time (the round
trip and one stream's speed) and many at once (the store's request and byte ceilings). A ceiling the probe
did not reach (its rate still grew with concurrency) is a lower bound and says so (``*_is_lower_bound``).

Pure functions over numbers: nothing here opens a connection.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = ["StoreModel", "fit", "store_fields", "loader_concurrency", "miss_costs"]

_SATURATED = 0.8  # a rate below this share of concurrency / round trip: the store's ceiling was reached
_NOISE_FLOOR = 0.05  # two rates closer than this (or than their own spread) are the same rate


@dataclass(frozen=True)
class StoreModel:
    """The fitted store: round trip, one stream's bytes/s, and the aggregate request and byte ceilings."""

    latency_s: float
    stream_bytes_per_s: float
    request_rate: float
    bandwidth_bytes_per_s: float
    request_rate_is_lower_bound: bool = False
    bandwidth_is_lower_bound: bool = False

    def __post_init__(self) -> None:
        for name in ("latency_s", "stream_bytes_per_s", "request_rate", "bandwidth_bytes_per_s"):
            value = getattr(self, name)
            if not (value > 0) or math.isnan(value):
                raise ValueError(f"StoreModel: {name} must be a positive number, got {value}")

    def request_s(self, nbytes: float) -> float:
        """Seconds one request of ``nbytes`` takes with nothing else in flight."""
        return self.latency_s + nbytes / self.stream_bytes_per_s

    def requests_per_s(self, concurrency: float, nbytes: float) -> float:
        """Requests of ``nbytes`` per second with ``concurrency`` in flight: latency- or ceiling-bound."""
        if concurrency <= 0:
            raise ValueError(f"concurrency must be positive, got {concurrency}")
        ceiling = min(self.request_rate, self.bandwidth_bytes_per_s / max(nbytes, 1e-9))
        return min(concurrency / self.request_s(nbytes), ceiling)

    def items_per_s(self, concurrency: float, item_bytes: float, items_per_request: float = 1.0) -> float:
        """Items per second: requests per second times the items each request brings."""
        if items_per_request <= 0:
            raise ValueError(f"items_per_request must be positive, got {items_per_request}")
        return self.requests_per_s(concurrency, item_bytes * items_per_request) * items_per_request

    def bound(self, concurrency: float, item_bytes: float, items_per_request: float = 1.0) -> str:
        """What limits the store's rate here: ``latency`` (more concurrency helps), ``requests`` or ``bytes``."""
        b = item_bytes * items_per_request
        if concurrency / self.request_s(b) <= self.requests_per_s(concurrency, b) * (1 + 1e-9):
            return "latency"
        return "requests" if self.request_rate <= self.bandwidth_bytes_per_s / max(b, 1e-9) else "bytes"

    def with_bandwidth(self, bandwidth_bytes_per_s: float) -> StoreModel:
        """The same store behind a link of another speed (one stream never faster than the link)."""
        stream = min(self.stream_bytes_per_s, bandwidth_bytes_per_s)
        return StoreModel(
            self.latency_s, stream, self.request_rate, bandwidth_bytes_per_s,
            self.request_rate_is_lower_bound, False,
        )  # fmt: skip

    def params(self) -> dict:
        return asdict(self)


def fit(points: list[dict], item_bytes: float) -> StoreModel:
    """The store's parameters from probe points.

    Each point: ``concurrency``, ``request_bytes`` (payload per GET), ``requests_per_s``, ``latency_s`` (the
    median seconds one GET took) and optionally ``spread`` (the relative spread of its rate over windows of the
    probe: its noise). Needed: one point of full objects and one of tiny ranges at concurrency 1 (round trip
    and stream speed), and the same two at the highest concurrency probed (the ceilings); ``item_bytes`` is
    the mean object size.

    * request rate: the tiny ranges' rate at the top concurrency; a lower bound when that rate is still what
      the round trips alone allow (the store was not saturated);
    * bandwidth: the whole objects' bytes/s at the top concurrency when they came measurably slower than tiny
      ranges (beyond both points' noise: the bytes bound them); else that bytes/s is a lower bound.
    """
    if item_bytes <= 0:
        raise ValueError(f"item_bytes must be positive, got {item_bytes}")
    one = [p for p in points if p["concurrency"] == 1]
    top_c = max((p["concurrency"] for p in points), default=0)
    top = [p for p in points if p["concurrency"] == top_c]
    small1, full1 = _pair(one, "concurrency 1")
    small_top, full_top = _pair(top, f"concurrency {top_c}")
    # One at a time: T(b) = latency + b / stream, from a tiny range and a whole object.
    extra_bytes = full1["request_bytes"] - small1["request_bytes"]
    extra_s = full1["latency_s"] - small1["latency_s"]  # a whole object's transfer beyond the tiny one's
    stream = (
        extra_bytes / extra_s if extra_s > 0 and extra_bytes > 0 else 1e15
    )  # too fast to see at this size
    latency = max(small1["latency_s"] - small1["request_bytes"] / stream, 1e-9)
    request_rate = small_top["requests_per_s"]
    r_lower = request_rate >= _SATURATED * top_c / (latency + small_top["request_bytes"] / stream)
    noise = max(_NOISE_FLOOR, small_top.get("spread") or 0.0, full_top.get("spread") or 0.0)
    bandwidth = full_top["requests_per_s"] * full_top["request_bytes"]
    full_s = latency + full_top["request_bytes"] / stream
    b_lower = (
        full_top["requests_per_s"] >= small_top["requests_per_s"] * (1 - noise)  # no slower than tiny ranges
        or full_top["requests_per_s"] >= _SATURATED * top_c / full_s  # or still what the round trips allow
    )
    return StoreModel(latency, stream, request_rate, bandwidth, r_lower, b_lower)


def _pair(points: list[dict], where: str) -> tuple[dict, dict]:
    if len(points) < 2:
        raise ValueError(f"store fit: the probe needs a tiny-range and a whole-object point at {where}")
    ordered = sorted(points, key=lambda p: p["request_bytes"])
    small, full = ordered[0], ordered[-1]
    for p in (small, full):
        if not (p["requests_per_s"] > 0 and p["latency_s"] > 0):
            raise ValueError(f"store fit: a probe point at {where} measured no request: {p}")
    return small, full


def loader_concurrency(workers: int, fetch_ahead: int) -> int:
    """Requests a loader keeps in flight: each worker's read-ahead threads (or the worker itself); loading in
    the main process (0 workers) reads one item at a time."""
    return max(1, int(workers) * max(1, int(fetch_ahead)))


def miss_costs(
    store: StoreModel, item_bytes: float, h: float, workers: int, fetch_ahead: int, items_per_request: float,
    batch_size: int,
) -> tuple[float, float]:  # fmt: skip
    """Seconds per missed item: the store's aggregate cost at the loader's concurrency, and what one worker
    waits beyond it (``ItemCosts.miss_s`` and ``miss_overhead_s`` of :mod:`dsanalyzer.model.rates`).

    Without read-ahead (torch's loader, ``fetch_ahead=0``, or loading in the main process) a worker waits each
    request's whole round trip itself. With coordl's read-ahead the threads fetch only the items of the worker's
    current batch, so a batch with at least one miss (probability ``1 - h**B``) still waits about one round trip
    before its first miss can be prepped: spread over the batch's misses, that is the worker's extra wait. With
    a warm cache (``h`` near 1) this, not the store's rate, is what a bucket costs.
    """
    k = items_per_request
    miss_s = 1.0 / store.items_per_s(loader_concurrency(workers, fetch_ahead), item_bytes, k)
    own_s = store.request_s(item_bytes * k) / k
    if fetch_ahead <= 0 or workers <= 0:
        return miss_s, max(0.0, own_s - miss_s)
    if h >= 1.0:
        return miss_s, 0.0
    batch_requests = max(1.0, batch_size / k)
    exposed = (1.0 - h**batch_requests) * store.request_s(item_bytes * k)  # per batch
    return miss_s, exposed / (batch_size * (1.0 - h))


def store_fields(report: dict) -> dict:
    """The what-if model's store arguments from a report's ``source`` (empty for a source that is not a bucket)."""
    source = report.get("source") or {}
    if source.get("kind") != "bucket":
        return {}
    params = source.get("model")
    if not isinstance(params, dict) or "latency_s" not in params:
        raise ValueError(
            "report.json: the source is a bucket but source.model (the store's fitted rates) is missing: "
            f"{source.get('probe_error') or 're-run dsanalyzer profile'}"
        )
    keys = ("latency_s", "stream_bytes_per_s", "request_rate", "bandwidth_bytes_per_s",
            "request_rate_is_lower_bound", "bandwidth_is_lower_bound")  # fmt: skip
    return {
        "store": StoreModel(**{k: params[k] for k in keys if k in params}),
        "fetch_ahead": int(source.get("fetch_ahead") or 0),
        "items_per_request": float(source.get("items_per_request") or 1.0),
    }
