"""What the profile records about torch's intra-op threads: the count, whether the script fixed it, the device."""

from __future__ import annotations

import os
import sys
import types

from dsanalyzer.measure import threads


def _fake_torch(n: int) -> types.SimpleNamespace:
    state = {"n": n}
    fake = types.SimpleNamespace(
        get_num_threads=lambda: state["n"],
        cuda=types.SimpleNamespace(is_initialized=lambda: False),
    )
    fake.set_num_threads = lambda k: state.update(n=k)
    return fake


def test_default_threads_follow_the_cores(monkeypatch):
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(threads, "_CALLED", {})
    fake = _fake_torch(len(os.sched_getaffinity(0)))
    monkeypatch.setitem(sys.modules, "torch", fake)
    threads.watch(fake)
    got = threads.facts()
    assert got["threads_follow_cores"] and got["threads_fixed_by"] is None and got["step_device"] == "cpu"


def test_a_script_that_sets_its_threads_is_told_apart_even_at_the_same_count(monkeypatch):
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(threads, "_CALLED", {})
    cores = len(os.sched_getaffinity(0))
    fake = _fake_torch(cores)
    monkeypatch.setitem(sys.modules, "torch", fake)
    threads.watch(fake)
    threads.watch(fake)  # idempotent: one wrapper
    fake.set_num_threads(cores)  # the default count, but asked for: it stays fixed on more cores
    got = threads.facts()
    assert got["torch_threads"] == cores and not got["threads_follow_cores"]
    assert got["threads_fixed_by"] == "torch.set_num_threads"


def test_omp_num_threads_fixes_the_count(monkeypatch):
    monkeypatch.setattr(threads, "_CALLED", {})
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(len(os.sched_getaffinity(0))))
    got = threads.facts()
    assert not got["threads_follow_cores"] and got["threads_fixed_by"] == "OMP_NUM_THREADS"


def test_no_torch_no_facts(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    assert threads.facts() == {}
