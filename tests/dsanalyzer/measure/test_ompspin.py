"""The host's OpenMP spin after a parallel region, measured in a child process (dsanalyzer.measure.ompspin)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dsanalyzer.measure import ompspin

pytest.importorskip("torch")
two_cpus = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="GNU OpenMP spins only briefly with more threads than CPUs"
)


@two_cpus
def test_the_spin_is_a_positive_time_shorter_than_the_pause():
    out = ompspin.measure_omp_spin(gap_s=0.06, regions=5)
    assert out["why"] == ""
    assert 0 < out["spin_s"] < 0.06 and out["threads"] == 2 and len(out["cpus"]) == 2


@two_cpus
@pytest.mark.exclusive  # times a spinning thread's CPU: beside CI's parallel phase it gets a fraction of a core
def test_a_tenth_of_the_spin_count_spins_for_a_fraction_of_the_time(monkeypatch):
    monkeypatch.setenv("GOMP_SPINCOUNT", "300000")
    long_ = ompspin.measure_omp_spin(gap_s=0.06, regions=5)["spin_s"]
    monkeypatch.setenv("GOMP_SPINCOUNT", "30000")
    short = ompspin.measure_omp_spin(gap_s=0.06, regions=5)["spin_s"]
    assert (
        short < long_ / 2
    )  # the count is iterations of a pause loop: ten times fewer, about ten times shorter


@two_cpus
@pytest.mark.exclusive  # (CI's parallel phase gave the spinning helper 13.6 ms of CPU in a 30 ms pause)
def test_an_active_wait_policy_spins_through_the_pause(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    out = ompspin.measure_omp_spin(gap_s=0.03, regions=3)
    assert out["spin_s"] is None and out["spins_through"] is True and "active" in out["why"]


@two_cpus
def test_a_profile_pinned_to_one_core_still_measures_the_hosts_spin():
    code = "import json; from dsanalyzer.measure.ompspin import measure_omp_spin as m; print(json.dumps(m(0.05, 3)))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert '"spin_s": null' not in proc.stdout


def test_a_probe_that_fails_leaves_the_spin_unknown_and_says_why(monkeypatch):
    monkeypatch.setattr(ompspin, "PROBE", "import sys; sys.stderr.write('no torch here'); sys.exit(3)")
    out = ompspin.measure_omp_spin()
    assert out["spin_s"] is None and "no torch here" in out["why"]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="gap_s"):
        ompspin.measure_omp_spin(gap_s=0)


def test_the_hosts_spin_is_measured_once_and_kept_per_openmp_environment(tmp_path, monkeypatch):
    calls = []

    def fake(**_):
        calls.append(os.environ.get("GOMP_SPINCOUNT"))
        return {"spin_s": 1e-3 * len(calls), "why": ""}

    monkeypatch.setattr(ompspin, "measure_omp_spin", fake)
    monkeypatch.delenv("DSANALYZER_OMP_SPIN", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    first = ompspin.host_omp_spin(tmp_path)
    again = ompspin.host_omp_spin(tmp_path)
    assert first["spin_s"] == again["spin_s"] == 1e-3 and len(calls) == 1 and again["kept"]
    monkeypatch.setenv("GOMP_SPINCOUNT", "30000")  # another spin: measured anew
    assert ompspin.host_omp_spin(tmp_path)["spin_s"] == 2e-3 and len(calls) == 2
    monkeypatch.setenv("DSANALYZER_OMP_SPIN", "measure")  # asked to measure: never the kept one
    assert ompspin.host_omp_spin(tmp_path)["spin_s"] == 3e-3


def test_an_unknown_spin_is_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(ompspin, "measure_omp_spin", lambda **_: {"spin_s": None, "why": "one CPU"})
    assert ompspin.host_omp_spin(tmp_path)["spin_s"] is None
    assert not list(tmp_path.rglob("omp-spin-*.json"))
