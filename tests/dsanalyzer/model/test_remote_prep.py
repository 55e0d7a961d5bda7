"""The remote-prep what-if (dsanalyzer/model/remote_prep.py): remote CPUs add, the trainer pays to receive."""

from __future__ import annotations

import dataclasses
import math

import pytest

from dsanalyzer.model.cores import worker_cpu_s
from dsanalyzer.model.remote_prep import (
    RAY_NODE_CORES,
    RECEIVE_S_PER_BYTE,
    SEND_S_PER_BYTE,
    RemoteSetup,
    epoch_drain_s,
    receive_cpu_s,
    remote_rate,
    with_remote,
)
from dsanalyzer.model.whatif import Model
from tests.dsanalyzer.judge.test_verdict import FAST_STORAGE, base

CROP = 150_528.0  # a 224 px uint8 crop


@pytest.fixture
def model() -> Model:
    m = Model.from_report(base(fetch=FAST_STORAGE, cache_bytes=1e9))
    # a prep-bound job whose cores are busy: the CPU per sample is its prep's on its cores
    return dataclasses.replace(m, job_cpu_s=m.cpus / m.prep.rate(m.cpus), mem_bandwidth_bytes_per_s=8e9)


def _point(model: Model, setup: RemoteSetup):
    local = model.predict_measured()
    return local, with_remote(model, local, setup, model.cpus, model.compute_rate())


def test_remote_cpus_add_their_prep_less_what_receiving_costs_the_trainer(model):
    model = dataclasses.replace(model, dataset_items=10**12, epoch_items=None)  # no epoch's end to speak of
    local, p = _point(model, RemoteSetup(2, CROP))
    x_r = 2 / (worker_cpu_s(model) + SEND_S_PER_BYTE * CROP)  # each CPU's prep and send
    assert x_r < 2 / worker_cpu_s(model)
    assert remote_rate(model, RemoteSetup(2, CROP)) == pytest.approx(x_r)
    u_r = receive_cpu_s(model, RemoteSetup(2, CROP))
    assert u_r == pytest.approx(RECEIVE_S_PER_BYTE * CROP)  # 0.465 ms a 224 px crop
    spare = max(
        0.0, model.cpu_share * model.cpus - local.steady * model.job_cpu_s
    )  # what the job leaves idle
    lost = max(0.0, x_r * u_r + RAY_NODE_CORES - spare) / model.job_cpu_s  # Ray's daemons too
    assert lost > 0
    assert p.samples_per_s == pytest.approx(min(model.compute_rate(), local.steady - lost + x_r), rel=1e-3)
    assert local.steady < p.samples_per_s


def test_a_slow_link_caps_the_remote_side_and_shipping_costs_more(model):
    fast = remote_rate(model, RemoteSetup(4, CROP))
    slow = remote_rate(model, RemoteSetup(4, CROP, link_bytes_per_s=10e6))
    assert slow == pytest.approx(10e6 / (CROP + 16)) and slow < fast
    shipped = remote_rate(model, RemoteSetup(4, CROP, link_bytes_per_s=10e6, ship=True))
    assert shipped < slow
    assert receive_cpu_s(model, RemoteSetup(4, CROP, ship=True)) > receive_cpu_s(model, RemoteSetup(4, CROP))


def test_no_remote_cpu_is_the_local_prediction_and_compute_caps_it(model):
    # torch's workers draw 2 * depth batches ahead per remote CPU: a long epoch, or they hold all of it
    model = dataclasses.replace(model, dataset_items=10**9, epoch_items=None)
    local, p = _point(model, RemoteSetup(0, CROP))
    assert p is local
    _, many = _point(model, RemoteSetup(1000, CROP))
    assert many.samples_per_s == pytest.approx(model.compute_rate()) and many.bound == "compute"
    assert math.isfinite(many.epoch_s)


def test_remote_cpus_do_not_lift_a_fetch_bound_job_past_its_storage():
    model = Model.from_report(base(prep_scaling={"workers": [1, 2], "samples_per_s": [5000.0, 9000.0]}))
    local = model.predict_measured()
    assert local.bound == "fetch"
    p = with_remote(model, local, RemoteSetup(8, CROP), model.cpus, model.compute_rate())
    assert p.samples_per_s <= local.stage_rates["fetch"] * (1 + 1e-9) and p.bound == "fetch"


def test_the_epoch_end_idles_the_remote_cpus_while_the_workers_drain_their_queue(model):
    model = dataclasses.replace(model, dataset_items=1000, epoch_items=None, workers=1, batch_size=32)
    local = model.predict_measured()
    setup = RemoteSetup(1, CROP)
    # the worker's last batch, at the local-only rate
    drain = epoch_drain_s(model, setup, local.steady)
    assert drain == pytest.approx(32 / local.steady)
    assert epoch_drain_s(dataclasses.replace(model, workers=4), setup, local.steady) == pytest.approx(
        4 * drain
    )
    assert epoch_drain_s(dataclasses.replace(model, workers=0), setup, local.steady) == 0
    p = with_remote(model, local, setup, model.cpus, model.compute_rate())
    # the rate is the fixed point: the remote side works the epoch's share that is not the drain
    busy = 1 - drain * p.samples_per_s / 1000
    assert p.stage_rates["remote"] == pytest.approx(remote_rate(model, setup) * busy, rel=1e-6)
    long = with_remote(
        dataclasses.replace(model, dataset_items=10**9), local, setup, model.cpus, model.compute_rate()
    )
    assert local.steady < p.samples_per_s < long.samples_per_s


def test_a_remote_cpu_costs_the_workers_own_cpu_not_its_rate_on_a_shared_core(model):
    # the profile's worker shared its core with the main process: P(1) is below 1 / its own CPU
    measured = dataclasses.replace(model, prep_cpu_s=1.1e-3, batch_overhead_s=1.6e-3, batch_size=32)
    assert worker_cpu_s(measured) == pytest.approx(1.1e-3 - 0.05e-3)
    assert remote_rate(measured, RemoteSetup(1, CROP)) == pytest.approx(
        1 / (1.05e-3 + SEND_S_PER_BYTE * CROP)
    )
    # not measured (an older report): the prep curve's one worker
    older = dataclasses.replace(model, prep_cpu_s=None)
    assert worker_cpu_s(older) == pytest.approx(1 / model.prep.rate(1))
    # a receive that would leave nothing (a hand-written report): at least 5% of the data path's
    assert worker_cpu_s(dataclasses.replace(measured, batch_overhead_s=1.0)) == pytest.approx(1.1e-3 * 0.05)
