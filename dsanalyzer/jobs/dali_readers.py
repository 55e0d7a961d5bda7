"""The files a user's DALI pipeline reads, found from the pipeline itself.

A pipeline such as ``fn.readers.file(file_root=...) -> fn.decoders.image -> ...`` names its files
nowhere but in its reader operators' arguments. :func:`pipeline_ops` reads every operator's schema,
instance name and arguments from ``Pipeline.serialize()`` (DALI's public serialisation, a
``dali_proto.PipelineDef`` protobuf, read with the small wire-format reader below so that no protobuf
package is needed). DALI cannot serialise a pipeline with a Python operator (``fn.python_function``);
such a pipeline is read from its Python operator graph instead. :func:`reader_files` turns the
readers' ``file_root``, ``file_list``, ``files``/``filenames`` and ``path``/``paths`` arguments
into paths, listing a bare ``file_root`` the way ``fn.readers.file`` does (one sub-directory per
class, files matching ``file_filters``).

Never imports DALI: it works on the pipeline objects it is given.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

from dsanalyzer.measure import fetchrate

__all__ = ["Op", "pipeline_ops", "is_reader", "reader_files", "epoch_items", "prep_device"]

# fn.readers.file's documented default for `file_filters` (DALI 2.4), matched case-insensitively
# unless `case_sensitive_filter=True`.
FILE_READER_FILTERS = (
    "*.jpg", "*.jpeg", "*.png", "*.bmp", "*.tif", "*.tiff", "*.pnm", "*.ppm", "*.pgm", "*.pbm",
    "*.jp2", "*.webp", "*.flac", "*.ogg", "*.wav",
)  # fmt: skip


class Op(NamedTuple):
    """One operator of a pipeline: its schema (``readers__File``), instance name and arguments."""

    schema: str
    name: str
    args: dict[str, list[Any]]


# -- reading Pipeline.serialize() ------------------------------------------------------------------


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field of a protobuf message; varints as ints, the rest as bytes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        wire = key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            yield key >> 3, value
            continue
        if wire == 2:
            size, i = _varint(buf, i)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not used by dali_proto")
        yield key >> 3, buf[i : i + size]
        i += size


def _argument(buf: bytes) -> tuple[str, list[Any]]:
    """``dali_proto.Argument``: name = 1, ints = 4, strings = 5, bools = 6, vector elements = 7."""
    name, values = "", list[str | int]()
    for field, value in _fields(buf):
        if field == 1 and isinstance(value, bytes):
            name = value.decode()
        elif field == 5 and isinstance(value, bytes):
            values.append(value.decode(errors="replace"))
        elif field in (4, 6) and isinstance(value, int):
            values.append(value)
        elif field == 7 and isinstance(value, bytes):
            values.extend(_argument(value)[1])
    return name, values


def _op_def(buf: bytes) -> Op:
    """``dali_proto.OpDef``: schema name = 1, arguments = 4, instance name = 5."""
    schema, name, args = "", "", {}
    for field, value in _fields(buf):
        if not isinstance(value, bytes):
            continue
        if field == 1:
            schema = value.decode()
        elif field == 4:
            key, values = _argument(value)
            args[key] = values
        elif field == 5:
            name = value.decode()
    return Op(schema, name, args)


def _graph_ops(pipe: Any) -> list[Op]:
    """The operators from the pipeline's Python graph (its explicitly given arguments)."""
    ops = []
    for instance in getattr(pipe, "_ops", None) or []:
        op = getattr(instance, "_op", None)
        args = {
            key: list(value) if isinstance(value, (list, tuple)) else [value]
            for key, value in dict(getattr(op, "_init_args", None) or {}).items()
        }
        args.setdefault("device", [getattr(op, "device", "cpu")])
        schema = str(getattr(op, "schema_name", None) or type(op).__name__)
        ops.append(Op(schema, str(getattr(instance, "name", "")), args))
    return ops


def pipeline_ops(pipe: Any) -> list[Op]:
    """Every operator of a built DALI pipeline, with the arguments it was given."""
    try:
        serialized = pipe.serialize()
    except Exception:  # noqa: BLE001 - DALI refuses pipelines with Python operators: read the graph
        return _graph_ops(pipe)
    return [_op_def(value) for field, value in _fields(serialized) if field == 5 and isinstance(value, bytes)]


# -- from reader arguments to files ----------------------------------------------------------------


def is_reader(op: Op) -> bool:
    return op.schema.startswith("readers__") or op.schema.endswith("Reader")


def _first(args: dict[str, list[Any]], key: str) -> str | None:
    values = args.get(key) or []
    return str(values[0]) if values else None


def _from_file_list(list_path: str, root: str | None) -> list[str]:
    """``file_list``: one ``name [label]`` per line, relative to ``file_root`` or to the list's folder."""
    base = root or os.path.dirname(os.path.abspath(list_path))
    out = []
    with open(list_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            parts = line.rsplit(None, 1)
            if len(parts) == 2 and parts[1].lstrip("-").isdigit():
                line = parts[0]  # names may hold spaces; the label is the last token
            if line:
                out.append(os.path.join(base, line))
    return out


def _matches(name: str, patterns: list[Any], case_sensitive: bool) -> bool:
    if not case_sensitive:
        name = name.lower()
    return any(fnmatch.fnmatchcase(name, str(p) if case_sensitive else str(p).lower()) for p in patterns)


def _class_folders(root: str, args: dict[str, list[Any]]) -> list[str]:
    """``fn.readers.file`` over a bare ``file_root``: files of its sub-directories (one per class)."""
    filters = list(args.get("file_filters") or FILE_READER_FILTERS)
    dir_filters = list(args.get("dir_filters") or ["*"])
    case = bool((args.get("case_sensitive_filter") or [False])[0])
    out: list[str] = []
    for sub in sorted(os.listdir(root)):
        folder = os.path.join(root, sub)
        if not os.path.isdir(folder) or not _matches(sub, dir_filters, case):
            continue
        for dirpath, dirs, names in os.walk(folder, followlinks=True):
            dirs.sort()
            out.extend(os.path.join(dirpath, n) for n in sorted(names) if _matches(n, filters, case))
    return out


def _op_files(op: Op) -> list[str]:
    """The files one reader operator reads, from its arguments (``[]`` when they name none)."""
    args = op.args
    root = _first(args, "file_root")
    listing = _first(args, "file_list")
    if listing and os.path.isfile(listing):
        return _from_file_list(listing, root)
    for key in ("files", "filenames"):
        if args.get(key):
            return [os.path.join(root, str(n)) if root else str(n) for n in args[key]]
    paths = [str(p) for key in ("path", "paths") for p in args.get(key) or []]
    if paths:  # shards (TFRecord, RecordIO, webdataset tars) or an LMDB folder
        return [f for p in paths for f in fetchrate.files_under(p)]
    if root and os.path.isdir(root):
        return _class_folders(root, args) if op.schema == "readers__File" else fetchrate.files_under(root)
    return []


def reader_files(ops: list[Op]) -> tuple[list[str], list[dict]]:
    """Files the pipeline's readers read (each once, in order) and, per reader, where they came from."""
    files: dict[str, None] = {}
    readers = []
    for op in ops:
        if not is_reader(op):
            continue
        found = _op_files(op)
        keys = [
            k for k in ("file_root", "file_list", "files", "filenames", "path", "paths") if op.args.get(k)
        ]
        readers.append({"name": op.name, "op": op.schema, "arguments": keys, "files": len(found)})
        files.update(dict.fromkeys(found))
    return [f for f in files if os.path.isfile(f)], readers


def epoch_items(pipe: Any) -> int | None:
    """Samples in one epoch of the pipeline's readers (``reader_meta``), None without a reader."""
    try:
        meta = pipe.reader_meta()
    except Exception:  # noqa: BLE001 - a pipeline without readers (external_source) has no epoch size
        return None
    sizes = [int(m.get("epoch_size") or 0) for m in (meta or {}).values()]
    return max(sizes) if sizes and max(sizes) > 0 else None


def prep_device(ops: list[Op]) -> str:
    """``"gpu"`` when an operator runs on the GPU (``device="mixed"`` decode or ``"gpu"``), else ``"cpu"``."""
    devices = {str(v) for op in ops for v in op.args.get("device") or []}
    return "gpu" if devices & {"gpu", "mixed"} else "cpu"
