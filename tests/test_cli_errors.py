"""Every CLI, every sub-command, given bad arguments: one error line naming the argument, non-zero exit, no traceback.

Each case checks stderr: a line ``PROG SUBCMD: error: ...`` that names the argument at fault and no traceback.
Argparse's own usage lines may come before that line (exit 2); a failure found while running exits 1. Cases run the
CLI's ``main(argv)`` in this process (an exception escaping it is the traceback a user would see), and a few run the
real command in a subprocess (``python -m PACKAGE.cli ...``) as a user's shell would; the CLIs of dsanalyzer and
gradcomp always run in a subprocess, so that a bad argument they do not catch cannot start a training run here.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# (id, module, argv with {file} {nonempty} {missing} {tmp} placeholders, prog+subcommand, text naming the culprit)
CASES = [
    ("synth-root-is-file", "coordl.cli", ["synth", "{file}", "--n", "3"], "coordl synth", "argument root"),
    ("synth-root-not-empty", "coordl.cli", ["synth", "{nonempty}", "--n", "3"], "coordl synth", "argument root"),
    ("synth-negative-n", "coordl.cli", ["synth", "{missing}", "--n", "-5"], "coordl synth", "argument --n"),
    ("synth-bad-size", "coordl.cli", ["synth", "{missing}", "--size", "3"], "coordl synth", "argument --size"),
    ("synth-quality", "coordl.cli", ["synth", "{missing}", "--quality", "0"], "coordl synth", "argument --quality"),
    ("synth-workers", "coordl.cli", ["synth", "{missing}", "--workers", "0"], "coordl synth", "argument --workers"),
    ("synth-no-root", "coordl.cli", ["synth"], "coordl synth", "root"),
    ("demo-negative-n", "coordl.cli", ["demo", "--n", "-3"], "coordl demo", "argument --n"),
    ("demo-bandwidth", "coordl.cli", ["demo", "--storage-mb-s", "0"], "coordl demo", "argument --storage-mb-s"),
    ("demo-batch", "coordl.cli", ["demo", "--batch-size", "x"], "coordl demo", "argument --batch-size"),
    ("demo-epochs", "coordl.cli", ["demo", "--epochs", "0"], "coordl demo", "argument --epochs"),
    ("demo-workers", "coordl.cli", ["demo", "--workers", "-1"], "coordl demo", "argument --workers"),
    ("demo-root-not-empty", "coordl.cli", ["demo", "--root", "{nonempty}", "--n", "4"], "coordl demo",
     "argument --root"),
    ("stage-missing-src", "coordl.cli", ["stage", "{missing}", "{tmp}/dst"], "coordl stage", "argument src"),
    ("stage-bad-url", "coordl.cli", ["stage", "nfs://", "{tmp}/dst"], "coordl stage", "argument src"),
    ("stage-dst-in-src", "coordl.cli", ["stage", "{tmp}", "{tmp}/dst"], "coordl stage", "argument dst"),
    ("stage-dst-file", "coordl.cli", ["stage", "{nonempty}", "{file}"], "coordl stage", "argument dst"),
    ("stage-dst-foreign", "coordl.cli", ["stage", "{nonempty}", "{tmp}"], "coordl stage", "argument dst"),
    ("stage-workers", "coordl.cli", ["stage", "{nonempty}", "{tmp}/d", "--workers", "0"], "coordl stage",
     "argument --workers"),
    ("stage-budget", "coordl.cli", ["stage", "{nonempty}", "{tmp}/d", "--budget", "lots"], "coordl stage",
     "argument --budget"),
    ("nfs_cache-missing-src", "nfs_cache.cli", ["{missing}", "{tmp}/dst"], "coordl stage", "argument src"),
    ("coordl-unknown", "coordl.cli", ["frobnicate"], "coordl", "argument command"),
    ("serve-maxmemory", "memcache.cli", ["serve", "--maxmemory", "lots"], "memcache serve", "argument --maxmemory"),
    ("serve-port", "memcache.cli", ["serve", "--port", "99999"], "memcache serve", "argument --port"),
    # 10.9.9.9 is on no interface here: binding fails at once, no packet is sent.
    ("serve-bind", "memcache.cli", ["serve", "--bind", "10.9.9.9", "--maxmemory", "8M"], "memcache serve",
     "argument --bind"),
    ("stop-nothing", "memcache.cli", ["stop"], "memcache stop", "--port"),
    ("stop-no-server", "memcache.cli", ["stop", "--dir", "{missing}"], "memcache stop", "argument --dir"),
    ("stop-port", "memcache.cli", ["stop", "--port", "-1"], "memcache stop", "argument --port"),
    ("memcache-unknown", "memcache.cli", ["frobnicate"], "memcache", "argument command"),
    ("profile-iters", "dsanalyzer.cli", ["profile", "--iters", "0", "--", "true"], "dsanalyzer profile",
     "argument --iters"),
    ("profile-warmup", "dsanalyzer.cli", ["profile", "--warmup", "-1", "--", "true"], "dsanalyzer profile",
     "argument --warmup"),
    ("profile-timeout", "dsanalyzer.cli", ["profile", "--timeout", "-5", "--", "true"], "dsanalyzer profile",
     "argument --timeout"),
    ("whatif-missing-report", "dsanalyzer.cli", ["whatif", "{missing}"], "dsanalyzer whatif", "{missing}"),
    ("dsanalyzer-demo-items", "dsanalyzer.cli", ["demo", "--items", "0"], "dsanalyzer demo", "argument --items"),
    ("gradcomp-ratio", "gradcomp.cli", ["train", "--ratio", "2"], "gradcomp train", "argument --ratio"),
    ("gradcomp-iters", "gradcomp.cli", ["train", "--iters", "-1"], "gradcomp train", "argument --iters"),
    ("gradcomp-compressor", "gradcomp.cli", ["train", "--compressor", "zip"], "gradcomp train",
     "argument --compressor"),
]  # fmt: skip


def _params():
    for case in CASES:
        yield pytest.param(*case, id=case[0])


@pytest.fixture
def places(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "a_file").write_text("not a directory")
    (tmp_path / "nonempty" / "sub").mkdir(parents=True)
    (tmp_path / "nonempty" / "notes.txt").write_text("mine")
    return {
        "file": str(tmp_path / "a_file"),
        "nonempty": str(tmp_path / "nonempty"),
        "missing": str(tmp_path / "missing"),
        "tmp": str(tmp_path),
    }


# Run as a real command too: one case per CLI (and the three from the issue).
_SUBPROCESS = {"synth-root-is-file", "synth-root-not-empty", "synth-negative-n", "stage-missing-src",
               "nfs_cache-missing-src", "serve-port"}  # fmt: skip
_IN_PROCESS_MODULES = {"coordl.cli", "memcache.cli", "nfs_cache.cli"}


def _run_in_process(module: str, args: list[str], capsys) -> tuple[int, str]:
    main = importlib.import_module(module).main
    try:
        rc = main(args)
    except SystemExit as e:  # argparse
        rc = e.code if isinstance(e.code, int) else 1
    return rc, capsys.readouterr().err


def _run_subprocess(module: str, args: list[str], cwd: str) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("COORDL_DEBUG", None)
    env.pop("MEMCACHE_PASSWORD", None)
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )
    return proc.returncode, proc.stderr


@pytest.mark.parametrize(("case_id", "module", "argv", "prog", "culprit"), list(_params()))
def test_bad_arguments_give_one_error_line(case_id, module, argv, prog, culprit, places, capsys, monkeypatch):
    args = [a.format(**places) for a in argv]
    culprit = culprit.format(**places)
    monkeypatch.chdir(places["tmp"])
    monkeypatch.delenv("COORDL_DEBUG", raising=False)
    monkeypatch.delenv("MEMCACHE_PASSWORD", raising=False)
    if module in _IN_PROCESS_MODULES and case_id not in _SUBPROCESS:
        rc, stderr = _run_in_process(module, args, capsys)
    else:
        rc, stderr = _run_subprocess(module, args, places["tmp"])
    assert rc != 0, stderr
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if re.match(rf"{re.escape(prog)}: error: ", line)]
    assert len(errors) == 1, f"want one '{prog}: error:' line, got stderr:\n{stderr}"
    assert culprit in errors[0], errors[0]
