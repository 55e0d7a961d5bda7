"""The tuner's rate model: pure functions over one epoch's measures."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coordl.tune.model import (
    EpochMeasure,
    Knobs,
    contended,
    data_bound,
    merged,
    oversubscribed,
    predict_rate,
    prep_rate,
)


def _m(*, wait_s: float, workers_cpu_s: float, main_cpu_s: float = 0.5, knobs: Knobs | None = None,
       cores: int = 4) -> EpochMeasure:  # fmt: skip
    return EpochMeasure(1000, 1.0, wait_s, main_cpu_s, workers_cpu_s, knobs or Knobs(1, 2, 1), cores)


def test_a_prep_bound_epoch_gains_with_workers_up_to_the_cores() -> None:
    m = _m(wait_s=0.8, workers_cpu_s=1.0)  # 1 worker busy all the time, the loop waits 80%
    assert data_bound(m)
    two, four, eight = (predict_rate(m, Knobs(w, 2, 1)) for w in (2, 4, 8))
    assert two == pytest.approx(2 * m.rate, rel=0.01)
    assert four < 5 * m.rate  # the trainer's own 0.2 ms per item caps it at 5,000/s
    assert four == pytest.approx(eight)  # no more than the cores the main process leaves (3.5)


def test_a_compute_bound_epoch_gains_nothing_from_the_loader() -> None:
    m = _m(wait_s=0.01, workers_cpu_s=0.3)
    assert not data_bound(m)
    assert predict_rate(m, Knobs(4, 4, 1)) == m.rate


def test_a_storage_bound_epoch_gains_with_reads_in_flight_one_per_worker() -> None:
    m = _m(wait_s=0.8, workers_cpu_s=0.1, knobs=Knobs(2, 2, 1))  # workers on their CPU 5% of the time
    assert predict_rate(m, Knobs(4, 2, 1)) == pytest.approx(2 * m.rate, rel=0.01)
    # a worker makes one batch at a time: a deeper queue adds no read in flight (measured on the quiet
    # 2-core VM, 4 workers reading at 5 ms: prefetch_factor 2, 4, 8 within 1% of each other)
    assert predict_rate(m, Knobs(2, 4, 1)) == pytest.approx(m.rate, rel=0.01)


def test_a_deeper_queue_promises_at_most_what_the_pipeline_lost_to_bursts() -> None:
    m = _m(wait_s=0.8, workers_cpu_s=0.7)  # 1 worker busy 70%: the model says 1,429/s; 1,000 measured
    assert predict_rate(m, Knobs(1, 4, 1)) == pytest.approx(m.rate / 0.7, rel=0.01)
    m = _m(wait_s=0.8, workers_cpu_s=0.9)  # within 10% of the model: no burst for a queue to absorb
    assert predict_rate(m, Knobs(1, 4, 1)) == pytest.approx(m.rate, rel=0.01)


def test_one_intra_op_thread_gives_the_workers_the_cores_the_trainer_took() -> None:
    # 2 cores; the main process spins on 1.6 of them; 1 worker preps 1 ms per item
    m = EpochMeasure(400, 1.0, 0.8, 1.6, 0.4, Knobs(2, 2, 2), 2)
    assert prep_rate(m, Knobs(2, 2, 1)) > prep_rate(m, m.knobs)
    assert predict_rate(m, Knobs(2, 2, 1)) > m.rate * 1.5


def test_a_prediction_never_exceeds_the_model_scaled_down_by_what_it_missed() -> None:
    m = _m(wait_s=0.8, workers_cpu_s=0.5)  # the model says 2,000/s at these knobs; measured 1,000
    assert predict_rate(m, Knobs(2, 2, 1)) == pytest.approx(2 * m.rate, rel=0.01)


def test_threads_and_workers_that_outnumber_the_cores_are_oversubscribed() -> None:
    assert oversubscribed(2, 1, 2) and oversubscribed(4, 1, 4)  # the README job on 2 cores; torch's default
    assert not oversubscribed(1, 4, 2)  # one intra-op thread never spins for a core
    assert not oversubscribed(2, 2, 4)


def test_two_windows_at_the_same_knobs_merge_into_one_rate() -> None:
    a, b = _m(wait_s=0.8, workers_cpu_s=1.0), EpochMeasure(3000, 2.0, 0.4, 1.0, 2.0, Knobs(1, 2, 1), 4)
    both = merged(a, b)
    assert both.rate == pytest.approx(4000 / 3.0) and both.stall_share == pytest.approx(1.2 / 3.0)
    with pytest.raises(ValueError, match="merge"):
        merged(a, _m(wait_s=0.8, workers_cpu_s=1.0, knobs=Knobs(2, 2, 1)))


def test_contention_needs_a_step_on_this_cpu_or_a_loop_that_waits() -> None:
    knobs = Knobs(1, 2, 2)  # 2 threads + 1 worker on 2 cores
    assert contended(EpochMeasure(400, 1.0, 0.03, 0.25, 0.12, knobs, 2))  # the step computes, threads wait
    assert contended(EpochMeasure(400, 1.0, 0.5, 0.01, 0.9, knobs, 2))  # the loop waits on the loader
    assert not contended(EpochMeasure(400, 1.0, 0.01, 0.02, 0.1, knobs, 2))  # a step on an accelerator
    assert not contended(EpochMeasure(400, 1.0, 0.5, 0.6, 0.9, knobs, 4))  # the cores hold them all
    # the loop waits, but the host left 1.5 of its 2 cores idle: no thread waited for one
    assert not contended(EpochMeasure(400, 1.0, 0.5, 0.3, 0.1, knobs, 2, idle_cores=1.5))
    assert contended(EpochMeasure(400, 1.0, 0.5, 0.3, 0.1, knobs, 2, idle_cores=0.2))


def test_receiving_a_ready_batch_is_neither_a_stall_nor_the_steps_cpu() -> None:
    knobs = Knobs(1, 2, 2)
    # a sleeping step: the loop's 10% inside next() was its own CPU, receiving batches that were ready
    m = EpochMeasure(288, 3.0, 0.3, 0.32, 0.15, knobs, 2, receive_cpu_s=0.29)
    assert not data_bound(m) and m.stall_share < 0.01 and m.step_cpu_share < 0.02
    assert not contended(m) and predict_rate(m, Knobs(2, 4, 1)) == pytest.approx(m.rate, rel=0.01)
    # the same window counted as waiting (no receive CPU known) is data-bound and worth a threads trial
    assert data_bound(replace(m, receive_cpu_s=0.0)) and contended(replace(m, receive_cpu_s=0.0))
    # waiting idle stays a stall: the loop's thread used no CPU inside next()
    assert data_bound(EpochMeasure(288, 3.0, 0.3, 0.05, 0.15, knobs, 2, receive_cpu_s=0.0))
    both = merged(m, m)
    assert both.receive_cpu_s == 0.58 and both.stall_share == m.stall_share
