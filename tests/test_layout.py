"""The floor plan holds: dependencies point one way, no import cycles, no importlib for our own modules,
and no module, class or function grows past its size limit without saying why at its top.

Order, lowest first: ``shmem`` -> (``memcache``, ``nfs_cache``) -> ``coordl`` -> ``dsanalyzer`` ->
``gradcomp``. A package may import only packages at or below its level (``memcache`` and ``nfs_cache``
do not import each other).

Inside ``dsanalyzer``, folders by role, lowest first: ``model`` (imports nothing else of dsanalyzer)
-> ``measure`` -> (``jobs``, ``judge``) -> ``report`` -> the command line and the orchestrators at the
top (``dsanalyzer/*.py``). A module imports its own folder or a lower floor, never a folder beside or
above it.

Inside ``coordl``, rooms (a folder, or a module directly under ``coordl/``) by floor, lowest first
(:data:`COORDL_FLOOR`): the shared error and argument types; the rooms that need nothing else of coordl
(the batch ring, file reading, the object store, the partitioned and coordinated caches, graphs, the
epoch); prep (decode, transforms); datasets (the item protocol, image-file datasets); packed formats and
resumable state; the packer and the fetch path; starting workers, DALI, the options and remote prep; the DataLoader;
the demo; the command line. A module imports its own room or a lower floor, never a room beside or
above it; no folder of coordl holds over ~2,000 lines of Python without a reason in its ``__init__``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEVEL = {"shmem": 0, "memcache": 1, "nfs_cache": 1, "coordl": 2, "dsanalyzer": 3, "gradcomp": 4}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 250
MAX_DSANALYZER_CLASS_LINES = 150  # the tighter limit of dsanalyzer/ (the profiler: one role per class)
MODULE_REASON = "Why this module is long:"
CLASS_REASON = "Why this class is long:"
FUNCTION_REASON = "Why this function is long:"


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in LEVEL:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _imports(path: Path, name: str) -> list[tuple[str, int]]:
    """Project modules that ``name`` imports (any scope), with line numbers."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_pkg else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            if t.split(".")[0] in LEVEL:
                # the longest prefix that is a module of ours
                parts = t.split(".")
                while parts and ".".join(parts) not in MODULES:
                    parts.pop()
                if parts:
                    found.append((".".join(parts), node.lineno))
    return found


def test_dependencies_point_one_way() -> None:
    wrong = []
    for name, path in MODULES.items():
        mine = LEVEL[name.split(".")[0]]
        for target, line in _imports(path, name):
            pkg = target.split(".")[0]
            if pkg != name.split(".")[0] and LEVEL[pkg] >= mine:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not wrong, "imports from a package at the same or a higher level:\n" + "\n".join(wrong)


DSANALYZER_FLOOR = {"model": 0, "measure": 1, "jobs": 2, "judge": 2, "report": 3}
TOP_FLOOR = 4  # dsanalyzer/*.py (cli, profiler, verify, demo, whatif_cli, intercept) and dsanalyzer/_hook


def _dsanalyzer_room(name: str) -> tuple[str, int]:
    """(folder, floor) of a dsanalyzer module: its role folder, or the top."""
    parts = name.split(".")
    if len(parts) > 1 and parts[1] in DSANALYZER_FLOOR:
        return parts[1], DSANALYZER_FLOOR[parts[1]]
    return "", TOP_FLOOR


def test_dsanalyzer_rooms_point_down() -> None:
    """measure and model never import the report or the command line; model imports nothing else of ours."""
    assert set(DSANALYZER_FLOOR) <= {p.name for p in (ROOT / "dsanalyzer").iterdir() if p.is_dir()}
    wrong = []
    for name, path in MODULES.items():
        if not name.startswith("dsanalyzer."):
            continue
        room, floor = _dsanalyzer_room(name)
        for target, line in _imports(path, name):
            if target == "dsanalyzer" and room:  # the package's lazy exports reach the top
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports dsanalyzer (the top floor)")
            if not target.startswith("dsanalyzer."):
                continue
            to_room, to_floor = _dsanalyzer_room(target)
            if room and to_room != room and to_floor >= floor:
                wrong.append(
                    f"{path.relative_to(ROOT)}:{line} imports {target} ({to_room or 'top'} is not below {room})"
                )
    assert not wrong, "dsanalyzer imports that do not point down:\n" + "\n".join(wrong)


COORDL_FLOOR = {
    "errors": 0, "argtypes": 0, "sharding": 0, "_version": 0, "shutdown": 0,
    "ring": 1, "fileread": 1, "objectstore": 1, "partitioned": 1, "coordinated": 1, "graph": 1, "epoch": 1,
    "prep": 2,
    "datasets": 3,
    "packed": 4, "resume": 4,
    "packing": 5, "fetch": 5,
    "workers": 6, "dali": 6, "options": 6, "remote": 6, "tune": 6,
    "dataloader": 7,
    "demo": 8,
    "cli": 9,
}  # fmt: skip
# ``import coordl`` hands on every public name, up to coordl.DataLoader: the face stands on its floor.
COORDL_FACE_FLOOR = COORDL_FLOOR["dataloader"]
MAX_FOLDER_LINES = 2000
FOLDER_REASON = "Why this folder is large:"


def _coordl_room(name: str) -> str:
    """The room of a coordl module: its folder or module directly under ``coordl/`` ("" for the package's face)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_coordl_rooms_point_down() -> None:
    """Every room of coordl has a floor, and imports only its own room or a lower floor."""
    rooms = {
        p.stem for p in (ROOT / "coordl").iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()
    }
    assert rooms - {"__init__"} == set(COORDL_FLOOR), "place each room of coordl/ on a floor in COORDL_FLOOR"
    wrong = []
    for name, path in MODULES.items():
        room = _coordl_room(name)
        if not name.startswith("coordl.") or not room:
            continue
        found = _imports(path, name)
        submodule_lines = {line for target, line in found if target.startswith("coordl.")}
        for target, line in found:
            if target == "coordl" and line not in submodule_lines:  # the face: its lazy exports
                to_room, to_floor = "coordl (the package's face)", COORDL_FACE_FLOOR
            elif target.startswith("coordl."):
                to_room = _coordl_room(target)
                to_floor = COORDL_FLOOR[to_room]
            else:
                continue
            if to_room != room and to_floor >= COORDL_FLOOR[room]:
                wrong.append(
                    f"{path.relative_to(ROOT)}:{line} imports {target} ({to_room} is not below {room})"
                )
    assert not wrong, "coordl imports that do not point down:\n" + "\n".join(dict.fromkeys(wrong))


def test_coordl_folders_hold_at_most_2000_lines_or_a_reason() -> None:
    big = []
    for folder in sorted(p for p in (ROOT / "coordl").iterdir() if (p / "__init__.py").is_file()):
        lines = sum(len(f.read_text().splitlines()) for f in folder.rglob("*.py"))
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        if lines > MAX_FOLDER_LINES and FOLDER_REASON not in doc:
            big.append(f"{folder.relative_to(ROOT)}/: {lines} lines")
    assert not big, (
        f"folders over {MAX_FOLDER_LINES} lines of Python without '{FOLDER_REASON}' in their __init__:\n"
        + "\n".join(big)
    )


def test_no_import_cycles() -> None:
    graph = {name: {t for t, _ in _imports(path, name) if t != name} for name, path in MODULES.items()}
    # a package's __init__ is imported with any of its modules: not an edge that makes a cycle by itself
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_importlib_for_our_own_modules() -> None:
    """``importlib`` is for optional third-party packages; ``shmem.lazy`` is the one exception (lazy exports)."""
    wrong = []
    for name, path in MODULES.items():
        if name == "shmem.lazy":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
                arg = node.args[0] if node.args else None
                if not isinstance(arg, ast.Constant) or str(arg.value).split(".")[0] in LEVEL:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not wrong, "importlib.import_module of a project module (or of a computed name):\n" + "\n".join(
        wrong
    )


def test_sizes_or_a_reason() -> None:
    long_modules, long_functions = [], []
    for path in MODULES.values():
        text = path.read_text()
        tree = ast.parse(text)
        rel = path.relative_to(ROOT)
        doc = ast.get_docstring(tree) or ""
        if len(text.splitlines()) > MAX_MODULE_LINES and MODULE_REASON not in doc:
            long_modules.append(f"{rel}: {len(text.splitlines())} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and FUNCTION_REASON not in (ast.get_docstring(node) or ""):
                    long_functions.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    assert not long_modules, (
        f"modules over {MAX_MODULE_LINES} lines without '{MODULE_REASON}' in their docstring:\n"
        + "\n".join(long_modules)
    )
    assert not long_functions, (
        f"functions over {MAX_FUNCTION_LINES} lines without '{FUNCTION_REASON}' in their docstring:\n"
        + "\n".join(long_functions)
    )


def test_classes_within_size_or_a_reason() -> None:
    """A class over its limit holds more than one responsibility: split it, or say at its top why not."""
    long_classes = []
    for name, path in MODULES.items():
        limit = MAX_DSANALYZER_CLASS_LINES if name.split(".")[0] == "dsanalyzer" else MAX_CLASS_LINES
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                n = node.end_lineno - node.lineno + 1
                if n > limit and CLASS_REASON not in (ast.get_docstring(node) or ""):
                    long_classes.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines (limit {limit})"
                    )
    assert not long_classes, (
        f"classes over their limit without '{CLASS_REASON}' in their docstring:\n" + "\n".join(long_classes)
    )
