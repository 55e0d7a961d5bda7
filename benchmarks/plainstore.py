"""A dataset folder as it is, behind slowstore.SlowStore's interface, for prep-bound tables where no slow
store can be made (the GPU machines: no cgroup the benchmark may use, or none needed when every item is cached).

``PlainStore``: nothing throttled or bounded, runs are plain child processes. ``link_copies``: hard-linked
copies of every image, for longer epochs without generating more images.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


class PlainStore:
    """:class:`SlowStore`'s interface without its throttle, cgroups or page-cache bound: the dataset stays in
    ``mount`` (a plain folder) and runs are plain child processes. For a prep-bound, fully cached comparison
    where SlowStore cannot run (no root or no cgroup v1, as on a GPU host): nothing is evicted, so after a first
    epoch every file read is a page-cache hit; there is no storage counter (``device`` is empty)."""

    device, name, io_counter, controller_cpu_s = "", "", "", 0.0

    def __init__(self, mount: str | os.PathLike) -> None:
        self.mount = str(mount)

    def __enter__(self) -> PlainStore:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def set_page_cache_bytes(self, page_cache_bytes: int) -> None:
        pass

    def set_read_bps(self, read_bps: int | None) -> None:
        pass

    def evict(self, root: str | None = None) -> None:
        pass

    def run(self, cmd: list[str], timeout_s: float = 900, env: dict[str, str] | None = None) -> str:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:4])}... failed (rc {out.returncode}):\n{out.stderr[-3000:]}")
        return out.stdout


def link_copies(src: str | os.PathLike, copies: int) -> Path:
    """``src``'s dataset with every image hardlinked ``copies`` times (``<stem>-r<k>.jpg``), beside it.

    A longer epoch without more images to make: an epoch's start and end (workers filling, the last
    batches draining) then weigh less on its rate. The copies share their pages in the page cache; a cache
    by item (coordl's) holds each copy. Idempotent: a marker file, written last, means complete."""
    src = Path(src)
    dst = src.with_name(f"{src.name}-x{copies}")
    marker = dst / ".coordl_copies"
    if not marker.exists():
        for f in sorted(src.glob("class_*/*.jpg")):
            (dst / f.parent.name).mkdir(parents=True, exist_ok=True)
            for k in range(copies):
                link = dst / f.parent.name / f"{f.stem}-r{k}{f.suffix}"
                if not link.exists():
                    os.link(f, link)
        marker.write_text(str(copies))
    return dst
