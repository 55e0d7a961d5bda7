"""The shared-cores stage: the job's CPU per sample and the cores torch's spinning intra-op threads hold."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from dsanalyzer.model import cores
from dsanalyzer.model.whatif import Model
from tests.dsanalyzer.model.test_whatif import one_cpu_prep_bound_report


def test_threads_follow_the_cores_unless_the_script_fixed_them():
    assert cores.intra_op_threads(8, 1, follow_cores=True) == 8
    assert cores.intra_op_threads(8, 1, follow_cores=False) == 1
    assert cores.intra_op_threads(8, None, follow_cores=False) == 1


def test_spinning_helpers_take_a_fair_share_of_the_cores_at_most_one_each():
    # 2 cores, 2 busy workers, 2 intra-op threads: 3 runnable threads share 2 cores
    assert cores.spin_cores(2, 1.0, 2, 2) == pytest.approx(2 / 3)
    # 1 worker: the helper gets a core of its own (at most one)
    assert cores.spin_cores(2, 1.0, 1, 2) == pytest.approx(1.0)
    assert cores.spin_cores(2, 0.5, 1, 2) == pytest.approx(0.5)  # other processes hold half the cores
    # nothing spins with one thread, with no workers to share with, or with the step on a GPU
    assert cores.spin_cores(2, 1.0, 2, 1) == 0
    assert cores.spin_cores(2, 1.0, 0, 2) == 0
    assert cores.spin_cores(2, 1.0, 2, 2, step_on_cpu=False) == 0


def test_cpu_rate_is_the_cores_left_over_the_cpu_per_sample():
    assert cores.cpu_rate(2, 1.0, 1e-3) == pytest.approx(2000)
    assert cores.cpu_rate(2, 1.0, 1e-3, spin=2 / 3) == pytest.approx(4000 / 3)
    assert cores.cpu_rate(2, 1.0, None) == math.inf  # not measured: no limit
    assert cores.cpu_rate(1, 0.5, 1e-3, spin=1.0) == 0  # never negative


def test_model_prefers_the_real_runs_cpu_per_sample_and_charges_the_spin_on_more_cores():
    rep = one_cpu_prep_bound_report()
    rep["main_process"].update(job_cpu_s_per_sample=1.25e-3, torch_threads=1, threads_follow_cores=True)
    m = Model.from_report(rep)
    assert m.cpu_per_sample() == pytest.approx(1.25e-3)  # not the loader alone's + the step's
    one = m.predict(2e9, 1, 1e9, policy="pagecache", workers=1)
    assert one.samples_per_s == pytest.approx(800)  # 1 core / 1.25 ms: one thread on one core spins nothing
    two = m.predict(2e9, 2, 1e9, policy="pagecache", workers=2)
    assert two.samples_per_s == pytest.approx((2 - 2 / 3) / 1.25e-3)
    fixed = replace(m, threads_follow_cores=False).predict(2e9, 2, 1e9, policy="pagecache", workers=2)
    assert fixed.samples_per_s == pytest.approx(min(2 / 1.25e-3, m.prep.rate(2)))
    assert two.samples_per_s < fixed.samples_per_s and two.bound == fixed.bound == "prep"
    # profiled with 2 threads spinning: its real run's CPU carries that spin, so the spin-free sum is used
    spun = replace(m, torch_threads=2)
    assert spun.cpu_per_sample() == pytest.approx(m.prep_cpu_s + m.step_cpu_s / m.batch_size)


def test_one_thread_predicted_from_a_two_thread_profile_leaves_out_the_spin_it_measured():
    """A remedy's what-if replaces ``torch_threads`` (one intra-op thread): the real run's CPU was measured with
    two, its helper's spin in it, so it is no 1-thread job's CPU (bench_fix's prep job: capped at 911 samples/s
    with 2 workers where they measured 1,630)."""
    rep = one_cpu_prep_bound_report()
    rep["main_process"].update(job_cpu_s_per_sample=1.25e-3, torch_threads=2, threads_follow_cores=True)
    m = Model.from_report(rep)
    assert m.cpu_threads == 2
    one = replace(m, torch_threads=1, threads_follow_cores=False)
    assert one.cpu_per_sample() == pytest.approx(m.prep_cpu_s + m.step_cpu_s / m.batch_size)
    assert one.cpu_per_sample() < 1.25e-3
    measured_alone = replace(one, cpu_threads=1)  # a profile that ran one thread: its real run's CPU stands
    assert measured_alone.cpu_per_sample() == pytest.approx(1.25e-3)


def test_an_old_report_without_thread_facts_charges_no_spin():
    m = Model.from_report(one_cpu_prep_bound_report())
    assert m.spin_cores(16) == 0 and m.job_cpu_s is None


def test_with_a_minio_cache_or_a_bucket_the_in_memory_runs_cpu_is_charged():
    # a miss's request (an HTTP GET, a read through coordl's cache) costs CPU a hit does not: the
    # real run read every item cold, so its CPU per sample would overcharge a partly cached what-if
    rep = one_cpu_prep_bound_report()
    rep["main_process"].update(
        job_cpu_s_per_sample=3e-3, in_memory_job_cpu_s_per_sample=1.25e-3, torch_threads=1
    )
    assert Model.from_report(rep).cpu_per_sample() == pytest.approx(3e-3)  # the page cache: every read costs
    rep["cache_policy"] = "minio"
    assert Model.from_report(rep).cpu_per_sample() == pytest.approx(1.25e-3)


def test_a_page_cache_profile_charges_a_minio_what_ifs_reads_to_its_misses_only():
    # the demo's case: a slow page-cache run (its CPU per sample inflated by what the processes spend per
    # second, shared by few samples) and a MinIO fix that hits every item: the hits cost the in-memory run's CPU
    rep = one_cpu_prep_bound_report()
    rep["main_process"].update(
        job_cpu_s_per_sample=3e-3, in_memory_job_cpu_s_per_sample=1.25e-3, torch_threads=1
    )
    m = Model.from_report(rep)
    assert m.cpu_per_sample(policy="minio", hit_ratio=1.0) == pytest.approx(1.25e-3)
    assert m.cpu_per_sample(policy="minio", hit_ratio=0.0) == pytest.approx(3e-3)
    assert m.cpu_per_sample(policy="minio", hit_ratio=0.5) == pytest.approx(2.125e-3)
    assert m.cpu_per_sample(policy="pagecache", hit_ratio=1.0) == pytest.approx(
        3e-3
    )  # every read still costs
    everything = m.predict(m.dataset_items * m.avg_item_bytes * 2, 1, 1e12, policy="minio", workers=1)
    nothing = m.predict(0, 1, 1e12, policy="minio", workers=1)
    assert (
        everything.samples_per_s > nothing.samples_per_s
    )  # fast storage either way: only the reads' CPU differs


def test_the_cpu_rate_and_the_spin_it_leaves_agree():
    # a helper runnable r = 7 ms per batch (step 4 ms + (1 + 5 preemptions) x 0.5 ms of spin)
    # no runnable time measured: the full share, as before the host's spin was measured
    assert cores.solve_cpu_rate(2.0, 1e-3, 2 / 3, None, 32) == (pytest.approx(4000 / 3), 2 / 3)
    rate, spin = cores.solve_cpu_rate(2.0, 1e-3, 2 / 3, 7e-3, 32)
    assert rate * 1e-3 + spin == pytest.approx(2.0)  # every core is spent on samples or on the spin
    assert spin == pytest.approx(2 / 3 * min(1.0, 7e-3 * rate / 32))
    assert 4000 / 3 < rate < 2000
    # runnable long enough that even at the full-spin rate it never sleeps: the full share
    assert cores.solve_cpu_rate(2.0, 1e-3, 2 / 3, 40e-3, 32) == (pytest.approx(4000 / 3), 2 / 3)
    assert cores.solve_cpu_rate(2.0, None, 2 / 3, 7e-3, 32)[0] == math.inf


def test_a_host_that_spins_briefly_leaves_more_of_the_cores_to_the_workers():
    rep = one_cpu_prep_bound_report()
    rep["main_process"].update(
        job_cpu_s_per_sample=1.25e-3,
        torch_threads=1,
        threads_follow_cores=True,
        job_main_preempts_per_batch=5,
    )
    unknown = Model.from_report(rep)
    rep["machine"]["omp_spin_s"] = 0.7e-3  # GOMP_SPINCOUNT=30000 on the Intel VM
    brief = Model.from_report(rep)
    rep["machine"]["omp_spin_s"] = 20e-3  # a pause loop of 20 ms: runnable throughout
    long_ = Model.from_report(rep)
    assert brief.omp_spin_s == pytest.approx(0.7e-3) and brief.main_preempts_per_batch == 5
    assert brief.spin_cores(2, 2) < unknown.spin_cores(2, 2) == pytest.approx(2 / 3)
    assert long_.spin_cores(2, 2) == pytest.approx(2 / 3)
    assert brief.cpu_rate(2, 2) > long_.cpu_rate(2, 2) == pytest.approx(unknown.cpu_rate(2, 2))
    # one thread: nothing spins whatever the host
    assert brief.spin_cores(1, 1) == 0


def _cold_profile(items: int, real_iters: int, warm: float | None = 0.04e-3) -> Model:
    """The README job's shape: 1.30 ms a sample in a real run that began with the dataset evicted, 1.10
    ms with items in memory, a cached read measured at ``warm`` (None: an older report without it)."""
    rep = one_cpu_prep_bound_report()
    rep["main_process"].update(
        job_cpu_s_per_sample=1.3e-3, in_memory_job_cpu_s_per_sample=1.1e-3, torch_threads=1
    )
    rep["dataset"]["items"] = items
    rep["runs"]["real"]["iters"], rep["warmup_iters"] = real_iters, 5
    rep["real_cold"] = {"files": items, "evicted": items, "resident_fraction_after": 0.0}
    if warm is not None:
        rep["fetch"]["warm_read_cpu_s"] = warm
    return Model.from_report(rep)


def test_a_page_cache_what_if_charges_cached_reads_a_cached_reads_cpu():
    # the real run read 1,440 of 2,000 items, every one cold: its 0.2 ms of reads a sample are cold reads;
    # at 2 cores the dataset is cached, and each read costs the probe's 0.04 ms
    m = _cold_profile(items=2000, real_iters=45)
    assert m.real_read_hit_ratio == 0.0
    assert m.cpu_per_sample(policy="pagecache", hit_ratio=1.0) == pytest.approx(1.14e-3)
    assert m.cpu_per_sample(policy="pagecache", hit_ratio=0.0) == pytest.approx(1.3e-3)
    # the measured configuration is judged as it ran: cold
    measured, cached = (
        m.predict_measured(),
        m.predict(m.cache_bytes, 1, m.storage_bytes_per_s, policy="pagecache", workers=1),
    )
    assert measured.stage_rates["cpu"] < cached.stage_rates["cpu"]
    # an older report (no cached read measured) charges every read the real run's
    old = _cold_profile(items=2000, real_iters=45, warm=None)
    assert old.cpu_per_sample(policy="pagecache", hit_ratio=1.0) == pytest.approx(1.3e-3)


def test_a_real_run_past_one_epoch_read_part_of_its_items_cached():
    # 1,000 items, samples 160..3,200 measured: the 2,200 past the first epoch found their item cached
    m = _cold_profile(items=1000, real_iters=100)
    assert m.real_read_hit_ratio == pytest.approx(2200 / 3040)
    # the cold reads' cost follows from what the run measured: at its own mix the CPU is as measured
    assert m.cpu_per_sample(policy="pagecache", hit_ratio=m.real_read_hit_ratio) == pytest.approx(1.3e-3)
    assert m.cpu_per_sample(policy="pagecache", hit_ratio=1.0) == pytest.approx(1.14e-3)
    assert m.cpu_per_sample(policy="pagecache", hit_ratio=0.0) > 1.3e-3
