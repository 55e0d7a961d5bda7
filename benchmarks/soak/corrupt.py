"""Store wrong values under real keys of a cache's Redis, with the right password (a fault of the soak).

Three kinds of wrong value, each one a reader must refuse (count an error, read the item from storage):

- ``swap``: another key's whole value (a valid frame, but its key tag and length are another item's);
- ``flip``: the key's own value with one byte of its frame header changed (the header CRC refuses it);
- ``junk``: random bytes of the same length (not a frame at all).

A valid frame whose payload alone is changed (right key tag, right length) is not among them: the
partitioned cache's payload carries no CRC on purpose (docs/distributed.md, "holds the password"), and
the sample cache's payload CRC is checked by ``flip_payload`` (``--modes`` may add it for the sample cache).

Runs as a script so it can run inside a network namespace (``ip netns exec``); the password is read from
``SOAK_REDIS_PASSWORD``, never from the command line. Prints one JSON line: the keys it changed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

import redis


def corrupt(
    client: redis.Redis, pattern: str, count: int, modes: list[str], rng: random.Random
) -> list[dict]:
    keys = sorted(k for k in client.scan_iter(match=pattern, count=1000))
    if len(keys) < 2:
        return []
    done = []
    for key in rng.sample(keys, min(count, len(keys) - 1)):
        mode = rng.choice(modes)
        value = client.get(key)
        if value is None:
            continue
        if mode == "swap":
            other = rng.choice([k for k in keys if k != key])
            new = client.get(other)
            if new is None or new == value:
                continue
        elif mode == "flip":  # a byte of the frame's header (its first 32 bytes)
            pos = rng.randrange(min(32, len(value)))
            new = value[:pos] + bytes([value[pos] ^ 0x5A]) + value[pos + 1 :]
        elif mode == "flip_payload":  # a byte of the payload (the frame's last bytes)
            pos = len(value) - 1 - rng.randrange(min(16, len(value)))
            new = value[:pos] + bytes([value[pos] ^ 0x5A]) + value[pos + 1 :]
        else:
            new = rng.randbytes(len(value))
        client.set(key, new)
        done.append({"key": key.decode(errors="replace"), "mode": mode})
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("address", help="host:port")
    p.add_argument("--pattern", required=True)
    p.add_argument("--count", type=int, default=5)
    p.add_argument("--modes", default="swap,flip,junk")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    host, port = args.address.rsplit(":", 1)
    client = redis.Redis(host=host, port=int(port), password=os.environ.get("SOAK_REDIS_PASSWORD") or None,
                         socket_timeout=5, socket_connect_timeout=5)  # fmt: skip
    try:
        done = corrupt(client, args.pattern, args.count, args.modes.split(","), random.Random(args.seed))
    except redis.RedisError as e:
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 1
    print(json.dumps({"changed": done}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
