"""The verdict's ranked remedies: every provider's remedy, those that remove the stall cheapest first."""

from __future__ import annotations

import pytest

from dsanalyzer.judge import remedies as R
from dsanalyzer.judge.verdict import verdict
from dsanalyzer.model.remedy import Remedy, rank
from dsanalyzer.model.whatif import Model
from tests.dsanalyzer.judge.test_verdict import FAST_STORAGE, at_model_rate, base


def _beyond_this_machine() -> dict:
    """Prep-bound past this machine's 2 cores: no local fix."""
    return at_model_rate(base(fetch=FAST_STORAGE, cache_bytes=1e9))


@pytest.fixture
def providers(monkeypatch):
    mine: list = []
    monkeypatch.setattr(R, "PROVIDERS", mine)
    return mine


def test_a_prep_bound_job_gets_a_ranked_list_and_the_cheapest_fix_first(providers):
    rep = _beyond_this_machine()
    compute = Model.from_report(rep).compute_rate()
    providers.append(lambda m, r: [Remedy("nodes", compute, "compute", {"nodes": 4}, {"partitioned": True})])
    providers.append(
        lambda m, r: [
            Remedy(
                "sample_cache",
                compute,
                "compute",
                {"memory_bytes": 2e9},
                {"sample_cache": "memcache.Local(...)"},
            ),
            Remedy("gpu_prep", None, why_unknown="no GPU on this machine"),
            Remedy(
                "coordinate", compute * 0.5, "prep", {"jobs": 2}, {"coordinate": "coordl.Coordinate(...)"}
            ),
        ]
    )
    v = verdict(rep)
    names = [r["name"] for r in v["remedies"]]
    assert names == ["sample_cache", "nodes", "coordinate", "gpu_prep"]
    text = v["sentence"]
    assert (
        "remedies, best first: 1. sample_cache (coordl.DataLoader(..., sample_cache=memcache.Local(...)))"
        in text
    )
    # the sentence's fix is the top of the list
    assert v["fix"]["name"] == "sample_cache" and "fix: coordl.DataLoader(..., sample_cache=" in text
    assert (
        "(removes the stall), costs 2.0 GB memory" in text
        and "4. gpu_prep: unknown (no GPU on this machine)" in text
    )


def test_no_remedy_beyond_the_local_fix_keeps_the_sentence_as_it_was(providers):
    rep = _beyond_this_machine()
    assert verdict(rep)["remedies"] == [] and "remedies, best first" not in verdict(rep)["sentence"]


def test_rank_puts_the_faster_first_among_those_that_do_not_fix():
    slow, fast = Remedy("coordinate", 50.0), Remedy("remote_prep", 80.0)
    assert [r.name for r in rank([slow, fast], 100.0)] == ["remote_prep", "coordinate"]
    # among fixes, the cheaper kind first, then the one holding less memory
    a = Remedy("cache", 100.0, cost={"memory_bytes": 5e9})
    b = Remedy("cache", 100.0, cost={"memory_bytes": 1e9})
    c = Remedy("workers", 100.0)
    assert rank([a, b, c], 100.0) == [c, b, a]
