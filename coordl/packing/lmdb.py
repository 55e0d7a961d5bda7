"""The LMDB side of ``coordl pack``: resumable writes in commits of a few MB, then a read-back check.

A pack resumes from its record count: records are written in index order and every commit is
atomic (LMDB), so after a kill the environment holds records ``0 .. k-1`` and the run goes on at ``k``.
The metadata record says ``complete: false`` until the label table is written with the last commit.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from coordl.packed.shards import NO_LABEL
from coordl.packing.items import Progress, SourceItems, Verification, verify_items

__all__ = ["pack_lmdb", "verify_lmdb"]

_LMDB_COMMIT_BYTES = 32 << 20  # a killed pack loses at most this much work
_LMDB_START_MAP_BYTES = 1 << 30  # doubled whenever it fills (the file grows only as written)


def _lmdb_meta(identity: str, count: int, classes: list[str], complete: bool) -> bytes:
    meta = {"format": "coordl-lmdb", "version": 1, "count": count, "complete": complete,
            "classes": classes, "source": identity}  # fmt: skip
    return json.dumps(meta).encode()


def _lmdb_open_for_write(dst: str, identity: str, count: int) -> tuple[Any, int]:
    """(writable env, records already written); refuses a DST holding another pack."""
    import lmdb

    from coordl.packed.lmdb import META_KEY
    from coordl.packed.lmdbenv import close_process_env

    os.makedirs(dst, exist_ok=True)
    # py-lmdb opens a file once per process: a reader of this DST in this process must let go first.
    close_process_env(os.path.realpath(os.path.join(dst, "data.mdb")))
    env = lmdb.open(dst, map_size=_LMDB_START_MAP_BYTES, subdir=True, max_dbs=0)
    env.set_mapsize(max(_LMDB_START_MAP_BYTES, env.info()["map_size"]))
    with env.begin() as txn:
        raw = txn.get(META_KEY)
        entries = txn.stat()["entries"]
    if raw is None and entries:
        env.close()
        raise FileExistsError(f"coordl pack: {dst} holds an LMDB environment not written by coordl pack")
    if raw is not None:
        meta = json.loads(raw)
        if meta.get("source") != identity or meta.get("count") != count:
            env.close()
            raise FileExistsError(
                f"coordl pack: {dst} holds a pack of {meta.get('source')!r} ({meta.get('count')} items), "
                f"not of {identity!r} ({count} items): use another DST or delete it"
            )
        return env, entries - (2 if meta.get("complete") else 1)
    return env, 0


def _lmdb_put(env: Any, batch: list[tuple[bytes, bytes]], extra: dict[bytes, bytes] | None = None) -> None:
    """Commit ``batch`` (and ``extra``) in one transaction, growing the map while it is full."""
    import lmdb

    while True:
        try:
            with env.begin(write=True) as txn:
                for key, value in batch:
                    txn.put(key, value)
                for key, value in (extra or {}).items():
                    txn.put(key, value)
            return
        except lmdb.MapFullError:
            env.set_mapsize(env.info()["map_size"] * 2)


def pack_lmdb(items: SourceItems, dst: str, identity: str, classes: list[str], progress: bool) -> int:
    from coordl.packed.lmdb import LABELS_KEY, META_KEY, pack_record, record_key

    n = len(items.source)
    env, done = _lmdb_open_for_write(dst, identity, n)
    try:
        if done == 0:
            _lmdb_put(env, [], {META_KEY: _lmdb_meta(identity, n, classes, complete=False)})
        bar = Progress(n, done, "pack lmdb", progress)
        batch: list[tuple[bytes, bytes]] = []
        pending = 0
        for i in range(done, n):
            payload, label = items.get(i)
            batch.append((record_key(i), pack_record(payload, label)))
            pending += len(payload)
            bar.update()
            if pending >= _LMDB_COMMIT_BYTES:
                _lmdb_put(env, batch)
                batch, pending = [], 0
        _lmdb_put(env, batch)
        bar.close()
        labels = np.array(
            [NO_LABEL if items.label(i) is None else items.label(i) for i in range(n)], dtype="<i8"
        )
        _lmdb_put(env, [], {LABELS_KEY: labels.tobytes(), META_KEY: _lmdb_meta(identity, n, classes, True)})
        env.sync(True)
    finally:
        env.close()
    return n - done


def verify_lmdb(items: SourceItems, dst: str, progress: bool) -> Verification:
    from coordl.packed.lmdb import LMDBDataset

    ds = LMDBDataset(dst, verify=True)
    # payload(): header, length, CRC32 (computed from the source) and label table checked
    return verify_items(ds, items, len(ds), lambda i: ds.payload(ds.fetch(i), i), Verification(), progress)
