"""The partitioned cache's what-if (dsanalyzer/model/partitioned.py): shares, the link, N = 1 as one node."""

from __future__ import annotations

import pytest

from dsanalyzer.model import partitioned
from dsanalyzer.model.partitioned import link_efficiency, nodes_remedy, predict_nodes, shares
from dsanalyzer.model.stages import Point
from dsanalyzer.model.whatif import Model
from tests.dsanalyzer.model.test_whatif import synthetic_report


def fetch_bound(**over) -> Model:
    """1 GB of 100 kB items on 50 MB/s storage, fast prep and step: fetch-bound, with an epoch start."""
    rep = synthetic_report(
        prep_scaling={"workers": [1, 2], "samples_per_s": [4000.0, 7800.0]},
        rates_per_s={"compute": 8000.0, "prep": 7800.0, "fetch": 500.0, "observed": 500.0},
        epoch_start={"s_per_epoch": 0.4},
        cache_policy="minio",
        **over,
    )
    return Model.from_report(rep)


def test_shares_split_a_nodes_reads_into_local_remote_and_storage():
    s = shares(1e9, 2e8, 3)  # 3 x 0.2 GB hold 60 % of the dataset
    assert (s.local, s.remote, s.storage) == pytest.approx((0.2, 0.4, 0.4))
    full = shares(1e9, 6e8, 2)  # 2 x 0.6 GB hold it all: no storage read
    assert (full.local, full.remote, full.storage) == pytest.approx((0.5, 0.5, 0.0))
    with pytest.raises(ValueError, match="nodes must be >= 1"):
        shares(1e9, 1e8, 0)


@pytest.mark.parametrize("cache", [0.0, 3e8, 2e9])
def test_one_node_is_the_single_node_prediction_with_a_minio_cache(cache):
    m = fetch_bound()
    point = Point(cache, 2, m.storage_bytes_per_s, workers=2)
    one = predict_nodes(m, 1, point, link_bytes_per_s=1.0)  # no remote hit: the link never matters
    plain = m.predict(cache, 2, m.storage_bytes_per_s, policy="minio", workers=2)
    assert one.samples_per_s == pytest.approx(plain.samples_per_s, rel=1e-12)
    assert one.bound == plain.bound and one.epoch_s == pytest.approx(plain.epoch_s)


def test_when_the_nodes_hold_the_dataset_storage_is_never_read():
    m = fetch_bound()
    point = Point(6e8, 2, m.storage_bytes_per_s, workers=2)  # 2 x 0.6 GB >= 1 GB
    fast = predict_nodes(m, 2, point, link_bytes_per_s=1.25e9)
    slow_storage = predict_nodes(m, 2, Point(6e8, 2, 1e3, workers=2), link_bytes_per_s=1.25e9)
    assert slow_storage.samples_per_s == pytest.approx(fast.samples_per_s)
    # and it beats one node with the same cache, which reads 40 % from storage
    assert fast.samples_per_s > 2 * m.predict(6e8, 2, m.storage_bytes_per_s, policy="minio").samples_per_s


def test_a_slower_link_lowers_the_rate_to_what_the_link_carries():
    m = fetch_bound()
    point = Point(6e8, 2, m.storage_bytes_per_s, workers=2)
    link = 12.5e6  # 100 Mbit/s: half of a node's reads, 100 kB each, over it
    slow = predict_nodes(m, 2, point, link_bytes_per_s=link)
    fast = predict_nodes(m, 2, point, link_bytes_per_s=100 * link)
    assert slow.samples_per_s < fast.samples_per_s
    assert slow.bound == "fetch"
    steady = link * link_efficiency(2) / (0.5 * 1e5)
    assert slow.steady == pytest.approx(steady)
    # three nodes: two thirds over the link, whose ends both serve several peers (a lower useful share)
    three = predict_nodes(m, 3, Point(4e8, 2, m.storage_bytes_per_s, workers=2), link_bytes_per_s=link)
    assert three.steady == pytest.approx(link * link_efficiency(3) / (2 / 3 * 1e5))
    assert link_efficiency(3) < link_efficiency(2)
    # the epoch start is charged once per epoch of this node's share (5000 samples, not 10000)
    assert slow.samples_per_s < slow.steady and slow.epoch_s > 5000 / slow.steady


def test_the_probed_remote_item_cost_slows_a_worker():
    point = Point(6e8, 2, 5e7, workers=1)
    free = predict_nodes(fetch_bound(), 2, point, link_bytes_per_s=1.25e9)
    costly = predict_nodes(
        fetch_bound(peer={"item_s": 2e-3, "batch_s": 1e-3}), 2, point, link_bytes_per_s=1.25e9
    )
    assert costly.samples_per_s < free.samples_per_s
    assert costly.stage_rates["worker_cycle"] < free.stage_rates["worker_cycle"]


def test_shared_storage_divides_its_bandwidth_among_the_nodes():
    m = fetch_bound()
    point = Point(2e8, 2, m.storage_bytes_per_s, workers=2)  # 3 x 0.2 GB: 40 % from storage
    own = predict_nodes(m, 3, point, link_bytes_per_s=1.25e9)
    shared = predict_nodes(m, 3, point, link_bytes_per_s=1.25e9, shared_storage=True)
    assert shared.samples_per_s < own.samples_per_s
    assert shared.stage_rates["fetch"] == pytest.approx(own.stage_rates["fetch"] / 3, rel=0.01)


def test_the_remedy_names_the_loader_arguments_and_costs():
    m = fetch_bound()
    r = nodes_remedy(m, 4, link_bytes_per_s=1.25e9)
    budget = partitioned.share_cache_bytes(m, 4)
    assert budget == pytest.approx(1e9 / 4 * 1.1, abs=1)
    assert r.name == "nodes" and r.loader_args == {"cache_bytes": budget, "partitioned": True}
    assert r.cost["nodes"] == 4 and r.cost["memory_bytes"] == budget
    point = Point(budget, m.cpus, m.storage_bytes_per_s, workers=m.workers)
    assert r.samples_per_s == pytest.approx(predict_nodes(m, 4, point, 1.25e9).samples_per_s)
    assert "aggregate" in r.note and r.as_json()["loader_args"]["partitioned"] is True


def test_a_bad_link_is_an_error():
    m = fetch_bound()
    with pytest.raises(ValueError, match="node link must be positive"):
        predict_nodes(m, 2, Point(1e8, 2, 5e7), link_bytes_per_s=0)


def _cli(tmp_path, capsys, report: dict, *argv: str) -> tuple[int, str, str]:
    import json

    from dsanalyzer.whatif_cli import main as whatif_main

    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    rc = whatif_main([str(path), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_nodes_prints_per_node_and_aggregate_and_ends_with_the_per_node_rate(tmp_path, capsys):
    rep = synthetic_report(
        prep_scaling={"workers": [1, 2], "samples_per_s": [4000.0, 7800.0]},
        rates_per_s={"compute": 8000.0, "prep": 7800.0, "fetch": 500.0, "observed": 500.0},
        cache_policy="minio",
    )
    rc, out, _ = _cli(tmp_path, capsys, rep, "--nodes", "3", "--cache-gb", "0.4", "--peer-gbps", "1")
    assert rc == 0
    m = Model.from_report(rep)
    expected = predict_nodes(m, 3, Point(4e8, 2, m.storage_bytes_per_s, workers=2), 1e9 / 8)
    last = out.strip().splitlines()[-1]
    assert last.startswith("predicted_samples_per_s=")
    assert float(last.split("=")[1]) == pytest.approx(expected.samples_per_s, rel=1e-5)
    assert "per node" in out and f"aggregate: {3 * expected.samples_per_s:.1f} samples/s" in out
    assert "33% from its own cache, 67% from the other nodes', 0% from storage" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nodes", "0"], "--nodes must be >= 1, got 0"),
        (["--nodes", "2", "--peer-gbps", "-1"], "--peer-gbps must be > 0"),
        (["--peer-gbps", "10"], "give --nodes too"),
        (["--nodes", "2", "--gpu-prep"], "one at a time"),
    ],
)
def test_cli_refuses_bad_remedy_options(tmp_path, capsys, argv, message):
    rc, _, err = _cli(tmp_path, capsys, synthetic_report(), *argv)
    assert rc == 2 and message in err


def test_cli_gpu_prep_without_a_gpu_measurement_prints_unknown_and_keeps_the_plain_prediction(
    tmp_path, capsys
):
    rep = synthetic_report(gpu_prep={"available": False, "why": "no CUDA device (probe)"})
    _, plain, _ = _cli(tmp_path, capsys, rep)
    rc, out, _ = _cli(tmp_path, capsys, rep, "--gpu-prep")
    assert rc == 0 and "gpu prep: unknown without a GPU: no CUDA device (probe)" in out
    assert out.strip().splitlines()[-1] == plain.strip().splitlines()[-1]
    rep["gpu_prep"] = {"available": True, "samples_per_s": 3200.0, "cpu_s_per_sample": 1e-4}
    rc, out, _ = _cli(tmp_path, capsys, rep, "--gpu-prep")
    assert rc == 0 and "shares its time with the step" in out
    assert float(out.strip().splitlines()[-1].split("=")[1]) != float(
        plain.strip().splitlines()[-1].split("=")[1]
    )
