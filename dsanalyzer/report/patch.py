"""The change to keep, as a unified diff of the training script: its loader call, or the lines to add.

``dsanalyzer fix`` knows where the script built its loader (the file and line the hook recorded from
the construction's stack, :mod:`dsanalyzer.measure.callsite`). :func:`script_patch` parses that file,
finds the ``DataLoader(...)`` call spanning that line (:mod:`ast`), sets the kept arguments in it (a
keyword the call already passes, by name or by position, gets the new value; others are added), renames
the call to ``coordl.DataLoader`` when the change switches the loader (and adds ``import coordl``), and
adds ``torch.set_num_threads(N)`` after ``import torch``. Without a readable call site it returns None
and the caller prints the lines to add instead.
"""

from __future__ import annotations

import ast
import difflib
import os
from pathlib import Path

__all__ = ["script_patch", "lines_to_add"]

# torch.utils.data.DataLoader's positional order (coordl's is the same): a value passed by position
_POSITIONAL = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn",
               "pin_memory", "drop_last", "timeout", "worker_init_fn", "multiprocessing_context", "generator")  # fmt: skip


def _value(v: object) -> str:
    return v if isinstance(v, str) else repr(v)


def _offsets(source: str) -> list[int]:
    """Character offset of each line's start (ast positions are line, column)."""
    starts, total = [0], 0
    for line in source.splitlines(keepends=True):
        total += len(line)
        starts.append(total)
    return starts


def _loader_call(tree: ast.AST, line: int) -> ast.Call | None:
    """The innermost ``...DataLoader(...)`` call whose lines span ``line``."""
    best = None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or node.end_lineno is None:
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        spans = "DataLoader" in name and node.lineno <= line <= node.end_lineno
        if spans and (best is None or node.end_lineno - node.lineno < best.end_lineno - best.lineno):  # type: ignore[operator]
            best = node
    return best


def _call_edits(call: ast.Call, args: dict, switch_to: str, at: list[int]) -> list[tuple[int, int, str]]:
    """(start, end, text) edits that set ``args`` in ``call`` and rename it for ``switch_to``."""

    def pos(lineno: int | None, col: int | None) -> int:
        return at[(lineno or 1) - 1] + (col or 0)

    edits: list[tuple[int, int, str]] = []
    rest = dict(args)
    for kw in call.keywords:
        if kw.arg in rest:
            v = kw.value
            edits.append(
                (pos(v.lineno, v.col_offset), pos(v.end_lineno, v.end_col_offset), _value(rest.pop(kw.arg)))
            )
    for i, v in enumerate(call.args):
        name = _POSITIONAL[i] if i < len(_POSITIONAL) else None
        if name in rest:
            edits.append(
                (pos(v.lineno, v.col_offset), pos(v.end_lineno, v.end_col_offset), _value(rest.pop(name)))
            )
    if rest:
        close = pos(call.end_lineno, call.end_col_offset) - 1
        added = ", ".join(f"{k}={_value(v)}" for k, v in rest.items())
        edits.append((close, close, (", " if call.args or call.keywords else "") + added))
    if switch_to:
        f = call.func
        edits.append((pos(f.lineno, f.col_offset), pos(f.end_lineno, f.end_col_offset), switch_to))
    return edits


def _imports(tree: ast.Module, name: str) -> bool:
    return any(isinstance(n, ast.Import) and any(a.name == name for a in n.names) for n in tree.body)


def _line_after_import(tree: ast.Module, name: str | None) -> int:
    """The line after ``import name`` (None, or not imported: after the last top-level import)."""
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    for n in imports:
        if name and isinstance(n, ast.Import) and any(a.name == name for a in n.names):
            return n.end_lineno or n.lineno
    return (imports[-1].end_lineno or imports[-1].lineno) if imports else 0


def script_patch(
    site: dict | None, loader_args: dict, switch_to: str = "", torch_threads: int | None = None
) -> str | None:
    """A unified diff of the script at ``site`` with the change applied; None when the call cannot be found."""
    if not site or not os.path.isfile(str(site.get("file"))):
        return None
    path = Path(site["file"])
    try:
        source = path.read_text()
        tree = ast.parse(source)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    at = _offsets(source)
    edits: list[tuple[int, int, str]] = []
    if loader_args or switch_to:
        call = _loader_call(tree, int(site["line"]))
        if call is None:
            return None
        edits += _call_edits(call, loader_args, switch_to, at)
    inserts: list[tuple[int, str]] = []  # (after line, text)
    if switch_to.startswith("coordl.") and not _imports(tree, "coordl"):
        inserts.append((_line_after_import(tree, None), "import coordl\n"))
    if "memcache." in str(loader_args.get("sample_cache", "")) and not _imports(tree, "memcache"):
        inserts.append((_line_after_import(tree, None), "import memcache\n"))
    if torch_threads is not None:
        inserts.append((_line_after_import(tree, "torch"), f"torch.set_num_threads({torch_threads})\n"))
    for start, end, text in sorted(edits, reverse=True):
        source = source[:start] + text + source[end:]
    lines = source.splitlines(keepends=True)
    for after, text in sorted(inserts, key=lambda x: x[0], reverse=True):
        lines.insert(after, text)
    old = path.read_text().splitlines(keepends=True)
    rel = os.path.relpath(path)
    # under this directory: a/ and b/ paths (`git apply`, `patch -p1` from here); elsewhere the path itself (`patch -p0`)
    old_name, new_name = (str(path), str(path)) if rel.startswith("..") else (f"a/{rel}", f"b/{rel}")
    diff = difflib.unified_diff(old, lines, fromfile=old_name, tofile=new_name)
    return "".join(diff)


def lines_to_add(loader_args: dict, switch_to: str = "", torch_threads: int | None = None) -> list[str]:
    """The change in words, for a script dsanalyzer cannot patch: the line and the loader's arguments."""
    out = []
    if torch_threads is not None:
        out.append(f"after `import torch`: torch.set_num_threads({torch_threads})")
    if loader_args or switch_to:
        args = ", ".join(f"{k}={_value(v)}" for k, v in loader_args.items())
        out.append(f"the loader call: {switch_to or 'DataLoader'}(..., {args})")
    return out
