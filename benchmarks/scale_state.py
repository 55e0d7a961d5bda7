"""Two bookkeeping costs per item that grew with the item count (issue 59 item 4), measured so that the same
command runs on an older checkout (``PYTHONPATH=<old checkout>``) for a before/after in one sitting:

* ``restart N...``: an ``nfs_cache`` stage directory's manifest of N records (written directly, no files) and
  a listing of the same N files; the CPU microseconds per item to read the manifest into a fresh process,
  to hold the listing, and for ``forget_changed`` (every staged copy checked against the listing, what a
  restart does before it copies anything).
* ``tar-state N SHARD_MB``: ``coordl pack --format tar`` of N tiny items; the bytes written to the pack's resume
  state (every ``json.dump``), in all, per shard and per item.

    .venv/bin/python benchmarks/scale_state.py restart 10000 100000 1000000
    .venv/bin/python benchmarks/scale_state.py tar-state 100000 1

The stage directories and packs are made under ``$TMPDIR`` (``/dev/shm`` keeps the disk out of it) and removed.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import urllib.parse
import zlib


def restart(n: int) -> str:
    from nfs_cache.copies import forget_changed
    from nfs_cache.entries import RemoteFiles
    from nfs_cache.layout import StageLayout
    from nfs_cache.manifest import Manifest, _encode
    from nfs_cache.sources import RemoteFile

    work = tempfile.mkdtemp(prefix="scale-state-")
    try:
        os.makedirs(os.path.join(work, ".coordl", "tmp"))
        names = [f"class_{i % 1000:03d}/item_{i:08d}.bin" for i in range(n)]
        with open(os.path.join(work, ".coordl", "manifest.log"), "wb") as f:
            f.write(b"".join(
                _encode(f"+ 16 {1000 + i} {zlib.crc32(r.encode()):08x} {urllib.parse.quote(r)}")
                for i, r in enumerate(names)
            ))  # fmt: skip
        files = [RemoteFile(r, 16, 1000 + i) for i, r in enumerate(names)]
        layout = StageLayout(work)
        t0 = time.process_time()
        manifest = Manifest(layout.manifest)
        manifest.refresh()
        t1 = time.process_time()
        listing = RemoteFiles()
        listing.update((f.relpath, f) for f in files)
        t2 = time.process_time()
        forget_changed(layout, manifest, listing)
        t3 = time.process_time()
        manifest.close()
    finally:
        shutil.rmtree(work)
    us = 1e6 / n
    return f"{n:>9} {us * (t1 - t0):>14.2f} {us * (t2 - t1):>12.2f} {us * (t3 - t2):>19.2f}"


def tar_state(n: int, shard_mb: float) -> str:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from scale_paths_files import TinySource

    from coordl.packing.pack import pack

    written: list[int] = []
    real = json.dump

    def counted(obj: object, f: object, **kwargs: object) -> None:
        text = json.dumps(obj, **kwargs)  # type: ignore[arg-type]
        written.append(len(text))
        f.write(text)  # type: ignore[attr-defined]

    json.dump = counted  # type: ignore[assignment]
    work = tempfile.mkdtemp(prefix="scale-state-")
    try:
        result = pack(TinySource(n), os.path.join(work, "out"), "tar", shard_mb=shard_mb, progress=False)
        shards = sum(1 for name in os.listdir(os.path.join(work, "out")) if name.endswith(".tar"))
    finally:
        json.dump = real
        shutil.rmtree(work)
    if not result.ok:
        raise RuntimeError(f"tar-state: the pack of {n} items did not read back: {result.mismatches[:3]}")
    total = sum(written)
    return f"{n:>9} {shards:>7} {len(written):>7} {total:>14} {total / shards:>12.0f} {total / n:>10.2f}"


def main(argv: list[str]) -> int:
    if argv[:1] == ["restart"] and len(argv) > 1:
        print(
            f"{'items':>9} {'manifest us/it':>14} {'listing us/it':>12} {'forget_changed us/it':>19}  (CPU)"
        )
        for n in argv[1:]:
            print(restart(int(float(n))), flush=True)
        return 0
    if argv[:1] == ["tar-state"] and len(argv) == 3:
        print(
            f"{'items':>9} {'shards':>7} {'writes':>7} {'bytes written':>14} {'per shard':>12} {'per item':>10}"
        )
        print(tar_state(int(float(argv[1])), float(argv[2])))
        return 0
    print(__doc__.split("\n\n")[2], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
