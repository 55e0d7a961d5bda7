"""scripts/gpu_check.py (``make gpu-check``) on a machine without CUDA: its refusal, and its dry run.

The real run needs the accelerator machine (docs/gpu.md); here the dry run drives every section's code
on the CPU with tiny sizes: the same programs, arguments, result files and report writer, so a lent
GPU's short window is not spent finding a typo. Also: a section that fails or overruns its time is
reported and the others still run, and an overrun leaves no process of it behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
sys.path.insert(0, str(ROOT / "scripts"))

from gpu import SECTIONS  # noqa: E402
from gpu.report import markdown, report_path  # noqa: E402
from gpu.tests import gpu_test_files  # noqa: E402


def _run(args: list[str], tmp_path: Path, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "OUT"}  # $OUT only where a test sets it
    full_env.update(CUDA_VISIBLE_DEVICES="", **env)  # no GPU, even on a machine with one
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path, env=full_env, capture_output=True,
                          text=True, timeout=timeout, check=False)  # fmt: skip


def _sections(report: str) -> dict[str, str]:
    """section name -> status, from the report's summary table."""
    return dict(re.findall(r"^\| (\w+) \| (ok|skipped|FAILED|TIMEOUT|not run) \|", report, re.M))


def test_without_cuda_it_exits_2_with_one_line_naming_what_is_missing(tmp_path):
    before = sorted((ROOT / "reports" / "gpu").glob("*")) if (ROOT / "reports" / "gpu").exists() else []
    res = _run([], tmp_path, timeout=120)
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "--dry-run" in lines[0], res.stderr
    after = sorted((ROOT / "reports" / "gpu").glob("*")) if (ROOT / "reports" / "gpu").exists() else []
    assert after == before  # no report of a run that did not happen


def test_an_unknown_section_is_named_with_the_choices(tmp_path):
    res = _run(["--dry-run", "--only", "tests,nosuch"], tmp_path, timeout=120)
    assert res.returncode == 1
    assert "nosuch" in res.stderr and all(s in res.stderr for s in SECTIONS)


def test_the_gpu_marked_test_files_are_found():
    files = gpu_test_files(ROOT)
    assert "tests/gradcomp/test_cuda.py" in files and "tests/coordl/dali/test_gpu.py" in files
    for f in files:
        assert "pytest.mark." + "gpu" in (ROOT / f).read_text()
    assert "tests/scripts/test_gpu_check.py" not in files


def test_report_tables_escape_cells_and_a_second_run_gets_its_own_file(tmp_path):
    from datetime import datetime

    section = {"name": "pin", "title": "t", "status": "FAILED", "seconds": 3.0, "budget": 60, "reason": "boom",
               "notes": ["n1"], "commands": ["python3 x.py"],
               "tables": [{"title": "T", "header": ["a", "b"], "rows": [["1|2", "x\ny"]], "note": ""}]}  # fmt: skip
    text = markdown("GPU check", "python3 scripts/gpu_check.py", {"GPU": "H100"}, [section])
    assert "| 1\\|2 | x y |" in text and "| pin | FAILED | 3 | 60 |" in text and "boom" in text
    now = datetime(2026, 11, 25, 14, 5, 6)
    first = report_path(tmp_path, "NVIDIA H100 80GB HBM3", now)
    assert first.name == "2026-11-25-nvidia-h100-80gb-hbm3.md"
    first.write_text("x")
    assert (
        report_path(tmp_path, "NVIDIA H100 80GB HBM3", now).name
        == "2026-11-25-140506-nvidia-h100-80gb-hbm3.md"
    )


def test_a_failing_section_is_reported_and_the_next_one_still_runs(tmp_path):
    report = tmp_path / "r.md"
    res = _run(["--dry-run", "--only", "tests,pin", "--report", str(report), "--work", str(tmp_path / "w")],
               tmp_path, timeout=300, PYTEST_ADDOPTS="--no-such-pytest-option")  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    text = report.read_text()
    assert _sections(text) == {"tests": "FAILED", "pin": "ok"}, text
    assert "no-such-pytest-option" in text  # the failure's own words are in the report
    assert "coordl.DataLoader, batch ring on" in text


def _leftovers(mark: str) -> list[str]:
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid != os.getpid() and p.environ().get("GPU_CHECK_TEST_MARK") == mark:
                found.append(f"{p.pid} {' '.join(p.info['cmdline'] or [])[:200]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.mark.slow
def test_an_overrun_section_is_stopped_with_everything_it_started(tmp_path):
    mark = uuid.uuid4().hex
    report = tmp_path / "r.md"
    # the demo section runs for a minute or more; 20 s of budget leaves it 15 s
    res = _run(["--dry-run", "--only", "dsanalyzer", "--budget", "20", "--report", str(report)], tmp_path,
               timeout=300, GPU_CHECK_TEST_MARK=mark)  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    assert _sections(report.read_text()) == {"dsanalyzer": "TIMEOUT"}
    assert _leftovers(mark) == []


# The sections whose programs CI also tests elsewhere: the dsanalyzer section runs the demo and `dsanalyzer fix`
# (tests/dsanalyzer/test_demo.py, test_fix.py), whatif profiles and predicts (tests/dsanalyzer); together 60% of
# the dry run's time (75 + 56 of 211 s quiet). CI dry-runs the other six; `make test-long` all eight.
CI_SECTIONS = [s for s in SECTIONS if s not in ("dsanalyzer", "whatif")]
CI_TITLES = ("gpu-marked tests", "MSTopK vs torch.topk", "Compressors on cpu", "batch ring off", "Two jobs at once",
             "tight loops", "whatif --cpus N on a profile")  # fmt: skip


def _dry_run(tmp_path: Path, sections: list[str]) -> str:
    """The dry run of ``sections`` (all of them: no --only): every one ok or skipped, report and $OUT files."""
    out = tmp_path / "out"
    report = tmp_path / "report.md"
    only = [] if sections == list(SECTIONS) else ["--only", ",".join(sections)]
    res = _run(["--dry-run", *only, "--report", str(report), "--work", str(tmp_path / "w")], tmp_path,
               timeout=1400, OUT=str(out))  # fmt: skip
    assert report.exists(), res.stdout + res.stderr
    text = report.read_text()
    status = _sections(text)
    assert set(status) == set(sections)
    failed = {k: v for k, v in status.items() if v not in ("ok", "skipped")}
    assert not failed and res.returncode == 0, text
    assert sorted(p.name for p in out.iterdir()) == sorted([report.name, "gpu-check-results.json",
                                                            "gpu-check-logs.tar.gz"])  # fmt: skip
    assert [r["name"] for r in json.loads((out / "gpu-check-results.json").read_text())] == sections
    return text


@pytest.mark.slow
@pytest.mark.timeout(900)  # about 1.5 minutes on the 2-core VM, 3 under CI's parallel load
def test_the_dry_run_drives_six_sections_end_to_end(tmp_path):
    """`make gpu-check DRY=1` less the two sections CI tests elsewhere: each ok, its report and $OUT files."""
    text = _dry_run(tmp_path, CI_SECTIONS)
    for title in CI_TITLES:
        assert title in text, title


@pytest.mark.slow
@pytest.mark.long  # the full form of the test above: make test-long, or make gpu-check DRY=1 (docs/gpu.md)
@pytest.mark.timeout(1500)  # about 4 minutes on the 2-core VM, twice that when it is shared
def test_the_dry_run_drives_every_section_end_to_end(tmp_path):
    """`make gpu-check DRY=1`: every section ok (DALI's too where DALI is installed), report and $OUT files."""
    text = _dry_run(tmp_path, list(SECTIONS))
    for title in (*CI_TITLES, "whatif --gpu-speedup S"):
        assert title in text, title
    # the demo's fix verified, or (a tiny CPU demo under CI's parallel load: its cores bind) the note that the
    # verdict named none, which the dry run allows (scripts/gpu/dsanalyzer_fix.py)
    assert "the fix applied and verified" in text or "the verdict named no fix here" in text


def test_the_whatif_section_picks_a_compute_bound_and_a_prep_bound_lighter_job():
    from gpu.whatif import choose

    # step seconds by width for batch 64; the heavy job (512) preps 2,600 samples/s
    times = {512: 0.100, 384: 0.056, 256: 0.025, 192: 0.014, 128: 0.006, 64: 0.002}
    # medium: compute under 0.8x prep, nearest 0.6x (384: 1,143/s; 256's 2,560/s is too close to prep);
    # light: the widest whose compute is at least 2x prep (192: 4,571/s is not; 128: 10,667/s is)
    assert choose(times, 512, 64, 2600.0) == {"medium": 384, "light": 128}
    # no width is 2x prep: the narrowest one that is not the medium job
    assert choose({512: 0.1, 384: 0.056, 256: 0.03}, 512, 64, 2600.0) == {"medium": 384, "light": 256}
    # nothing narrower is enough faster: no lighter job to compare
    assert choose({512: 0.1, 384: 0.09}, 512, 64, 2600.0) == {}


def test_the_cores_section_plans_counts_epochs_and_linked_images(tmp_path):
    from gpu.common import Skip
    from gpu.cores import counts_here, measure_per_core

    # 16 cores: profile on 2, run on 4, 8, 16; 8 cores: the counts that exist; 2 cores (the dry run): 1 -> 2
    assert counts_here(2, (4, 8, 16), 16) == (2, [4, 8, 16])
    assert counts_here(2, (4, 8, 16), 8) == (2, [4, 8])
    assert counts_here(2, (4, 8, 16), 3) == (2, [3])
    assert counts_here(1, (2,), 2) == (1, [2])
    with pytest.raises(Skip, match="1 core"):
        counts_here(1, (2,), 1)
    # a run on the first count times one whole epoch (120 batches of 16), so 4x the cores time 4 epochs
    assert measure_per_core(1920, 16, 4) == 30
    assert measure_per_core(1921, 16, 4) == 30 and measure_per_core(8, 16, 4) == 1
    src = tmp_path / "src"
    for c, names in (("class_000", ["a.jpg", "b.jpg"]), ("class_001", ["c.jpg"])):
        (src / c).mkdir(parents=True)
        for n in names:
            (src / c / n).write_bytes(n.encode())
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from plainstore import link_copies

    dst = link_copies(src, 3)
    assert link_copies(src, 3) == dst  # again: the links stay
    links = sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*.jpg"))
    assert links == [f"class_000/{s}-r{k}.jpg" for s in "ab" for k in range(3)] + [
        f"class_001/c-r{k}.jpg" for k in range(3)
    ]
    assert (dst / "class_000" / "a-r2.jpg").stat().st_ino == (src / "class_000" / "a.jpg").stat().st_ino


def test_the_plain_whatif_benchmark_gives_each_core_count_its_workers():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from whatif_plain_jobs import at_cores

    case = ("pillow w2 b16", "pillow", 2, 16)
    assert at_cores(case, 16, None) == case  # the case's own worker count
    assert [at_cores(case, n, 1)[2] for n in (1, 2, 4, 8, 16)] == [1, 1, 3, 7, 15]


def test_the_limit_section_sizes_its_run_and_judges_coordl_against_the_limit_before_it():
    from gpu.limit import copies_for, rows, worker_counts

    assert worker_counts(16, dry=False) == ([15, 8], "")
    assert worker_counts(64, dry=False) == ([15, 8], "")
    counts, note = worker_counts(4, dry=False)  # a smaller host: scaled down, and said so
    assert counts == [3, 2] and "4 cores" in note
    assert worker_counts(2, dry=True) == ([2], "") and worker_counts(1, dry=True) == ([1], "")
    # 1.5 ms a sample, 15 workers: 10,000 samples/s, so a 1 s epoch of 1,500 images needs 7 copies
    assert copies_for(0.0015, 15, 1500, 1.0, 12) == 7
    assert copies_for(0.0015, 15, 1500, 1.0, 4) == 4 and copies_for(0.1, 1, 1500, 1.0, 12) == 1

    def loader(rate, limit_rate, main_cpu_s):
        return {"rate": rate, "limit_rate": limit_rate, "cpu_s": 0.002, "main_cpu_s": main_cpu_s}

    # limit rows: (rate, CPU s/sample, ...); each loader's ratio is to the limit measured right before it
    prep = {"limit": [(1000.0, 0.0015), (800.0, 0.0015)], "bound": [],
            "b": [loader(500.0, 1000.0, 1e-4), loader(420.0, 800.0, 1e-4)],
            "h": [loader(960.0, 1000.0, 5e-5), loader(780.0, 800.0, 5e-5)]}  # fmt: skip
    table = rows(prep, batch=16)
    assert [r[0] for r in table] == [
        "limit: N tight loops",
        "(b) torch DataLoader + simplejpeg",
        "(h) coordl.DataLoader, persistent_workers=True",
    ]  # no DALI row (not installed there)
    assert table[0][1:3] == ["900", "1.00"]
    assert table[1][2:4] == ["0.51", ""]  # a peer: ratio shown, not judged
    assert table[2][2:4] == ["0.97", "yes"]  # medians of 0.96 and 0.975, not 870 / 900
    assert table[2][6:] == ["0.80", "0.04"]  # main: 0.05 ms x 16 a batch; 870/s x 0.05 ms of a core
    prep["h"][1] = loader(700.0, 800.0, 5e-5)
    assert rows(prep, batch=16)[2][2:4] == ["0.92", "NO"]
    # the limit with a loader's working set: its ratio to the plain limit, and coordl's ratio to it in a note
    from gpu.limit import working_set_row

    row, note = working_set_row((750.0, 0.0019, 0.0, 2.0, 0.0), prep)
    assert row[1:3] == ["750", "0.83"] and row[4] == "1.90"
    assert "reaches 1.11" in note  # the median of 960 and 700 (830) over 750
