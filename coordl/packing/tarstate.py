"""A tar pack's resume state: one small header, and one record per finished shard, each written once.

``DST/.coordl-pack.json`` (the header) says what is packed: the source's identity, its item count, the
shard size and, at the end, ``complete`` and the classes. It is written when the pack starts and when it
ends. Each finished shard adds ``DST/.coordl-pack/data-NNNNNN.json``: its name, its item count and the
CRC32 of every payload. So the bytes written per shard are that shard's own (about 5.4 per item), the
same for the first shard and the ten-thousandth. Before, one file held every shard's CRCs and was
rewritten after each shard: about 2.7 x items x shards bytes in all (21 MB for 10^6 tiny items in 8
shards, ~2 GB at 10^7; ``reports/bench_scale.md``).

Every file is written to ``<name>.tmp``, fsynced and renamed, so a kill leaves the old file or the new
one. A shard's record is written after the shard is renamed into place and indexed: a shard with no
record is packed again. Records are read in shard order up to the first one missing.

A header written by an earlier coordl (version 1: every shard's record inside it, ``"shards": [...]``)
is converted in place at the next run (the records are written out, then the header without them) and
the pack resumes; one that cannot be read as either raises ``ValueError`` naming the file.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

__all__ = ["STATE_FILE", "SHARD_DIR", "VERSION", "PackState", "write_json"]

STATE_FILE = ".coordl-pack.json"
SHARD_DIR = ".coordl-pack"
VERSION = 2
_RECORD_RE = re.compile(r"^data-(\d{6,})\.json$")
_RECORD_KEYS = ("name", "count", "crc32")


def write_json(path: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` whole or not at all (tmp file, fsync, rename)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(
            f"coordl pack: {path} is not a tar pack's state file ({e}); delete DST to pack again"
        ) from e


def _check_record(record: Any, path: str) -> dict[str, Any]:
    if (
        not isinstance(record, dict)
        or any(k not in record for k in _RECORD_KEYS)
        or not isinstance(record["count"], int)
        or not isinstance(record["crc32"], str)
    ):
        raise ValueError(
            f"coordl pack: {path}: a shard record needs {', '.join(_RECORD_KEYS)}, got {str(record)[:200]}; "
            "delete DST to pack again"
        )
    return record


class PackState:
    """The resume state of the tar pack in ``dst`` (see the module docstring).

    Attributes:
        header: what is packed (``format``, ``version``, ``source``, ``count``, ``shard_bytes``,
            ``complete``, and ``classes`` once complete).
        shards: the finished shards' records, in order (``name``, ``count``, ``crc32`` base64 of <u4).
    """

    def __init__(self, dst: str, header: dict[str, Any], shards: list[dict[str, Any]]) -> None:
        self.dst = dst
        self.header = header
        self.shards = shards

    @property
    def path(self) -> str:
        return os.path.join(self.dst, STATE_FILE)

    @property
    def shard_dir(self) -> str:
        return os.path.join(self.dst, SHARD_DIR)

    @property
    def items_done(self) -> int:
        return sum(int(s["count"]) for s in self.shards)

    @classmethod
    def start(cls, dst: str, identity: str, count: int, shard_bytes: int) -> PackState:
        """The state to resume in ``dst``, or a new one written there (``dst`` empty but for ``.partial`` files).

        Raises FileExistsError when ``dst`` holds something else (another source's pack, other files).
        """
        state = cls.read(dst)
        if state is None:
            if os.path.isdir(dst) and [n for n in os.listdir(dst) if not n.endswith(".partial")]:
                raise FileExistsError(
                    f"coordl pack: {dst} is not empty and holds no coordl pack: use another DST"
                )
            header = {"format": "coordl-tar", "version": VERSION, "source": identity, "count": count,
                      "shard_bytes": shard_bytes, "complete": False}  # fmt: skip
            state = cls(dst, header, [])
            write_json(state.path, header)
            return state
        if state.header.get("source") != identity or state.header.get("count") != count:
            raise FileExistsError(
                f"coordl pack: {dst} holds a pack of {state.header.get('source')!r} "
                f"({state.header.get('count')} items), not of {identity!r} ({count} items): "
                "use another DST or delete it"
            )
        return state

    @classmethod
    def read(cls, dst: str) -> PackState | None:
        """The state in ``dst`` (an old one-file state converted on the way), or None when there is none."""
        path = os.path.join(dst, STATE_FILE)
        if not os.path.exists(path):
            return None
        header = _read_json(path)
        if not isinstance(header, dict) or header.get("format") != "coordl-tar":
            raise ValueError(f"coordl pack: {path} is not a tar pack's state file; delete DST to pack again")
        state = cls(dst, header, [])
        if "shards" in header:  # version 1: every record inside the header
            state._convert(header.pop("shards"))
        elif header.get("version") != VERSION:
            raise ValueError(
                f"coordl pack: {path} has state version {header.get('version')!r}, this coordl reads "
                f"{VERSION} (and converts 1): delete DST to pack again"
            )
        state.shards = state._read_records()
        return state

    def _convert(self, old: Any) -> None:
        """Write a version-1 header's records as files, then the header without them (a kill in between: the
        old header is still there and is converted again)."""
        if not isinstance(old, list):
            raise ValueError(f"coordl pack: {self.path}: 'shards' is not a list; delete DST to pack again")
        for number, record in enumerate(old):
            self.add_shard(number, _check_record(record, self.path))
        self.header["version"] = VERSION
        write_json(self.path, self.header)

    def _read_records(self) -> list[dict[str, Any]]:
        try:
            names = os.listdir(self.shard_dir)
        except FileNotFoundError:
            return []
        numbers = {int(m.group(1)) for m in map(_RECORD_RE.match, names) if m}
        records: list[dict[str, Any]] = []
        while len(records) in numbers:  # in shard order, up to the first missing
            path = self._record_path(len(records))
            records.append(_check_record(_read_json(path), path))
        return records

    def _record_path(self, number: int) -> str:
        return os.path.join(self.shard_dir, f"data-{number:06d}.json")

    def add_shard(self, number: int, record: dict[str, Any]) -> None:
        """Record finished shard ``number`` (written once; call after the shard is in place and indexed)."""
        os.makedirs(self.shard_dir, exist_ok=True)
        write_json(self._record_path(number), record)
        if number == len(self.shards):
            self.shards.append(record)

    def finish(self, classes: list[str]) -> None:
        """Mark the pack complete (the header's second and last write)."""
        self.header["complete"] = True
        self.header["classes"] = classes
        write_json(self.path, self.header)
