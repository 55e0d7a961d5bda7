"""What a remote hit of the partitioned cache costs beyond its bytes on the link: a probe on loopback Redis.

``coordl.DataLoader(partitioned=True)`` reads the items other nodes own from their Redis, one ``MGET``
per owner per batch (:mod:`coordl.partitioned.redis_peer`). Over a real link an item then costs its bytes
at the link's rate plus what the client and the server spend on it (parsing, copies) plus, per batch,
one round trip. The link is an input of the what-if (``--peer-gbps``); the rest depends on this host's
cores, so the profile measures it here: a throw-away ``redis-server`` on 127.0.0.1 holding items of the
job's mean size, read through coordl's own client in batches of 1 and of the job's batch size::

    t(k) = batch_s + k * item_s           (the median of ``rounds`` fetches of k random items)

``item_s`` includes loopback's own copy of the bytes (memory speed, a few us per 100 kB), which a real
link replaces by its transfer: counted once more than it should be, a small over-estimate. Without
``redis-server`` (or when it cannot start) the result says why and the what-if charges the link alone.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import time

__all__ = ["measure_peer_fetch"]

_PROBE_ITEMS = 64  # distinct items stored (fetches pick among them at random)
_MAX_ITEM_BYTES = 8 << 20  # larger items are probed at this size (the per-byte cost is linear)


def measure_peer_fetch(item_bytes: float, batch: int, rounds: int = 15, seed: int = 0) -> dict:
    """``{"item_s", "batch_s", ...}`` of a remote hit on loopback Redis, or ``{"error": why}``."""
    if shutil.which("redis-server") is None:
        return {
            "error": "redis-server is not installed (apt-get install redis-server): remote hits not probed"
        }
    size = max(1, min(int(item_bytes), _MAX_ITEM_BYTES))
    batch = max(2, min(int(batch), _PROBE_ITEMS))
    try:  # coordl's own client (dsanalyzer runs without coordl too: then no probe)
        from coordl.partitioned.redis_peer import RedisPeerClient, key_prefix
        from memcache.server import start_redis
    except ImportError as e:
        return {"error": f"coordl is not importable ({e}): remote hits not probed"}

    secret = os.urandom(16).hex()
    try:
        server = start_redis(
            _PROBE_ITEMS * (size + 4096) * 2 + (64 << 20), password=secret, die_with_parent=True
        )
    except (OSError, RuntimeError) as e:
        return {"error": f"redis-server did not start: {e}"}
    client = RedisPeerClient(
        [(server.host, server.port)], password=secret, prefix=key_prefix("dsanalyzer-peer-probe"),
        item_size=lambda _i: size,
    )  # fmt: skip
    try:
        payload = os.urandom(size)
        client.put_many(0, [(i, payload) for i in range(_PROBE_ITEMS)])
        rng = random.Random(seed)

        def median_s(k: int) -> float:
            times = []
            for _ in range(rounds + 2):  # the first two open the connection and warm the server
                wanted = {0: rng.sample(range(_PROBE_ITEMS), k)}
                t0 = time.perf_counter()
                got = client.fetch(wanted)
                times.append(time.perf_counter() - t0)
                if len(got) != k:
                    raise RuntimeError(f"the probe's Redis returned {len(got)} of {k} items")
            return statistics.median(times[2:])

        one, many = median_s(1), median_s(batch)
    except (OSError, RuntimeError) as e:
        return {"error": f"the loopback probe failed: {e}"}
    finally:
        client.close()
        server.stop()
    item_s = max(0.0, (many - one) / (batch - 1)) * (item_bytes / size)
    return {
        "item_s": item_s,
        "batch_s": max(0.0, one - item_s),
        "item_bytes": size,
        "batch": batch,
        "rounds": rounds,
        "method": "coordl's Redis client, MGET of 1 and of a batch of random items, loopback redis-server",
    }
