"""What ``coordl pack`` reads from a source item (payload, label, name) and how it shows progress."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from coordl.errors import CorruptItemError
from coordl.packed.shards import NO_LABEL

__all__ = ["SourceItems", "Progress", "Verification", "sniff_ext", "verify_items"]

_PROGRESS_EVERY_S = 5.0


@dataclass
class Verification:
    """The read-back of a pack: records intact, what was wrong with the others, payload bytes read."""

    verified: int = 0
    bad: list[str] = field(default_factory=list)
    payload_bytes: int = 0
    pattern: str = ""


class SourceItems:
    """(payload, label or None, name) of each source item, from ``fetch`` and ``targets``."""

    def __init__(self, source: Any, rewrite: Callable[[bytes, int], bytes] | None = None) -> None:
        self.source = source
        self.rewrite = rewrite  # payload, index -> the bytes to store (coordl pack --crop-index)
        targets = getattr(source, "targets", None)
        self.labels = list(targets) if targets is not None else None
        self.payload = getattr(source, "payload", None)  # an LMDB record holds a header before the bytes

    def label(self, i: int) -> int | None:
        if self.labels is None or self.labels[i] is None or self.labels[i] == NO_LABEL:
            return None
        return int(self.labels[i])

    def get(self, i: int) -> tuple[bytes, int | None]:
        raw = self.source.fetch(i)
        data = bytes(self.payload(raw, i)) if callable(self.payload) else bytes(raw)
        if self.rewrite is not None:
            data = self.rewrite(data, i)
        return data, self.label(i)

    def name(self, i: int) -> tuple[str, str]:
        """(key, extension) for a tar member: the source's relative name where it has one."""
        items = getattr(self.source, "items", None)
        member_name = getattr(self.source, "member_name", None)
        if isinstance(items, Sequence) and len(items) and isinstance(items[i][0], str):
            rel = items[i][0]  # ImageFolder, FileListDataset (a list view): the relative path
        elif callable(member_name):
            rel = member_name(i)  # TarShards: the member it came from
        else:
            rel = f"{i:09d}"
        rel = "/".join(p for p in rel.split("/") if p not in ("", ".", ".."))  # no absolute or ../ members
        directory, _, base = rel.rpartition("/")
        stem, _, ext = base.rpartition(".") if "." in base else (base, "", "")
        key = (f"{directory}/" if directory else "") + stem.replace(".", "_")
        return key, ext.lower()


def sniff_ext(payload: bytes) -> str:
    if payload[:3] == b"\xff\xd8\xff":
        return "jpg"
    if payload[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    return "bin"


class Progress:
    """tqdm on a terminal, else one line every few seconds (logs of batch jobs stay readable)."""

    def __init__(self, total: int, done: int, what: str, enabled: bool) -> None:
        self.total, self.done, self.what, self.enabled = total, done, what, enabled
        self.bar = None
        self.t0 = self.last = time.monotonic()
        self.start_done = done
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, desc=what, unit="item", file=sys.stderr)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.monotonic()
        if self.enabled and now - self.last >= _PROGRESS_EVERY_S:
            self.last = now
            rate = (self.done - self.start_done) / max(now - self.t0, 1e-9)
            print(
                f"{self.what}: {self.done}/{self.total} items, {rate:.0f} items/s",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def verify_items(
    ds: Any,
    items: SourceItems,
    count: int,
    payload: Callable[[int], bytes],
    out: Verification,
    progress: bool,
) -> Verification:
    """Read back ``count`` packed items of ``ds`` and compare them with the source.

    ``payload(i)`` returns item ``i``'s payload once its own check passed (or raises
    :class:`CorruptItemError`); then its stored label must be the source's. What fails goes to
    ``out.bad``, one line naming the item; ``ds`` is closed at the end.
    """
    bar = Progress(count, 0, "verify", progress)
    try:
        for i in range(count):
            try:
                out.payload_bytes += len(payload(i))
                stored = int(ds._labels[i])
                if items.label(i) != (None if stored == NO_LABEL else stored):
                    raise CorruptItemError(
                        f"{ds.describe(i)}: label {stored}, the source says {items.label(i)}"
                    )
                out.verified += 1
            except CorruptItemError as e:
                out.bad.append(str(e))
            bar.update()
    finally:
        bar.close()
        ds.close()
    return out
