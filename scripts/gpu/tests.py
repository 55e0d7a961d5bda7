"""Every ``gpu``-marked test (``pytest -m gpu``), with each test's outcome in the report.

Only the test files that use the marker are collected: collecting the whole suite imports modules that
need what the accelerator machine lacks (libnfs, redis-server) and would fail before any GPU test ran.
On the CPU (``--dry-run``) the same tests are collected and skipped by tests/conftest.py ("needs a CUDA
device"), which proves the marker, the file list and the JUnit parsing.
"""

from __future__ import annotations

import os
import re
import sys
import xml.etree.ElementTree as ET

from gpu.common import Context, SectionError

TITLE = "gpu-marked tests (pytest -m gpu)"
BUDGET_S = 120
_MARK = re.compile(r"pytest\.mark\.gpu\b")


def gpu_test_files(root) -> list[str]:
    """Test files that carry the ``gpu`` marker (on a test, a class or the module), sorted."""
    found = [p for p in (root / "tests").rglob("test_*.py") if _MARK.search(p.read_text(errors="replace"))]
    return sorted(str(p.relative_to(root)) for p in found)


def _outcomes(xml_path) -> list[tuple[str, str, str]]:
    """(test id, outcome, detail) for each test case of a JUnit XML file."""
    rows = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        cls, test = case.get("classname", ""), case.get("name", "")
        name = f"{cls}::{test}" if cls else f"{test} (the whole file)"
        outcome, detail = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "FAILED", "error": "ERROR", "skipped": "skipped"}[tag]
                detail = el.get("message") or ""
                if (
                    detail.startswith("collection") and el.text
                ):  # the reason is in the text: (file, line, reason)
                    detail = el.text.strip().rsplit(", ", 1)[-1].strip("')\"")
                detail = detail.splitlines()[0][:160] if detail else ""
                break
        rows.append((name, outcome, f"{float(case.get('time', 0)):.2f}", detail))
    return rows


def run(ctx: Context) -> None:
    # GPU_CHECK_TESTS=tests/coordl/dali,tests/dsanalyzer/jobs/test_dali_iterator.py: only the files under those
    # paths (a short call that measures one claim)
    prefixes = tuple(p for p in os.environ.get("GPU_CHECK_TESTS", "").split(",") if p) or ("",)
    files = [f for f in gpu_test_files(ctx.root) if f.startswith(prefixes)]
    if not files:
        raise SectionError("no test file under tests/ uses the gpu marker")
    xml = ctx.work / "junit.xml"
    # a file that fails to import is one ERROR row; the other files still run
    argv = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", "-rA", "--continue-on-collection-errors",
            f"--junitxml={xml}", "-o", "junit_family=xunit1", *files]  # fmt: skip
    try:
        ctx.run(argv, timeout=ctx.remaining(), check=False)
    finally:
        rows = _outcomes(xml) if xml.exists() else []
        if rows:
            counts = {k: sum(r[1] == k for r in rows) for k in ("passed", "FAILED", "ERROR", "skipped")}
            summary = ", ".join(f"{v} {k.lower()}" for k, v in counts.items() if v)
            ctx.table(f"{len(rows)} results of the gpu-marked tests in {len(files)} files: {summary}",
                      ["test", "outcome", "s", "detail"], [list(r) for r in rows])  # fmt: skip
    if not rows:
        raise SectionError(
            "pytest wrote no results:\n" + "\n".join(ctx.last_output.strip().splitlines()[-15:])
        )
    bad = [r[0] for r in rows if r[1] in ("FAILED", "ERROR")]
    if bad:
        raise SectionError(f"{len(bad)} gpu test(s) failed: " + ", ".join(bad))
    if ctx.device == "cuda" and any(r[1] == "skipped" for r in rows):
        ctx.note("Skipped on a CUDA machine: see each test's detail (a missing package names itself).")
