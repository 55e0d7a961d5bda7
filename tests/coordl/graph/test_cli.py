"""``coordl graph`` commands: synth writes a loadable graph; bad input is one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from coordl.graph.graph import Graph

ROOT = Path(__file__).resolve().parents[3]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "coordl.graph.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )


def test_synth_then_info(tmp_path):
    out = _run("synth", str(tmp_path / "g"), "--nodes", "500", "--edges", "4000", "--feature-dim", "4")
    assert out.returncode == 0, out.stderr
    g = Graph.load(tmp_path / "g")
    assert g.num_nodes == 500 and g.features.shape == (500, 4) and 0 < g.num_edges <= 4000
    info = _run("info", str(tmp_path / "g"))
    assert info.returncode == 0 and "num_nodes=500" in info.stdout


def test_synth_is_deterministic_by_seed(tmp_path):
    for name in ("a", "b"):
        assert (
            _run("synth", str(tmp_path / name), "--nodes", "300", "--edges", "2000", "--seed", "5").returncode
            == 0
        )
    for f in ("indices.bin", "features.bin", "labels.bin"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()


def test_bad_argument_is_one_line(tmp_path):
    out = _run("synth", str(tmp_path / "g"), "--nodes", "1")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "--nodes" in out.stderr and "Traceback" not in out.stderr


def test_bad_graph_is_one_line(tmp_path):
    (tmp_path / "g").mkdir()
    out = _run("info", str(tmp_path / "g"))
    assert out.returncode == 2 and "graph.json" in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0
