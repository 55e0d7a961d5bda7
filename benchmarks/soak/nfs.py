"""The soak's NFS job's world: the items as files exported by the user-space NFS server (nfs-ganesha,
tests/support/ganesha.py), a 2 MiB tmpfs as the local stage disk, and the two faults of that disk.

- ``stage_disk_full``: fill the tmpfs to the last byte and remove some staged copies (as an operator
  freeing space would), so their next reads stage again into a full disk; hold, then free it.
- ``staged_corrupt``: change one byte of some staged copies (same size): the CRC-32 check must catch it
  and fetch the item again.
"""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

from items import item_bytes


class NfsStage:
    def __init__(self, rundir: Path, n: int) -> None:
        from tests.support.ganesha import GaneshaServer

        self.export = rundir / "export"
        self.export.mkdir()
        for i in range(n):
            (self.export / f"{i:05d}.bin").write_bytes(item_bytes(i))
        self.stage_dir = rundir / "stage"
        self.stage_dir.mkdir()
        self.mounted = False
        if os.geteuid() == 0:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(self.stage_dir)],
                           check=True, timeout=20)  # fmt: skip
            self.mounted = True
        self.server = GaneshaServer(self.export, tag="cdlsoak").start()

    @property
    def url(self) -> str:
        return self.server.url()

    def staged(self) -> list[Path]:
        return sorted(self.stage_dir.glob("*.bin"))

    def fill(self, rng: random.Random, remove: int) -> dict:
        filler = self.stage_dir / ".soak-filler"
        written = 0
        try:
            with open(filler, "wb") as f:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
                    written += 65536
        except OSError:
            pass  # ENOSPC: the disk is full
        gone = rng.sample(self.staged(), min(remove, len(self.staged())))
        for p in gone:
            p.unlink(missing_ok=True)
        return {"filled_bytes": written, "removed": [p.name for p in gone]}

    def unfill(self) -> None:
        (self.stage_dir / ".soak-filler").unlink(missing_ok=True)

    def corrupt(self, rng: random.Random, count: int) -> dict:
        done = []
        for p in rng.sample(self.staged(), min(count, len(self.staged()))):
            data = bytearray(p.read_bytes())
            if not data:
                continue
            pos = rng.randrange(len(data))
            data[pos] ^= 0x5A
            p.write_bytes(bytes(data))  # same size: only the CRC can tell
            done.append(p.name)
        return {"corrupted": done}

    def stop(self) -> None:
        self.server.stop()
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.stage_dir)], check=False, timeout=20)
