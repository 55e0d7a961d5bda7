"""``whatif --jobs 2`` against two coordinated jobs run for real (each its own process, ``coordinate=``)."""

from __future__ import annotations

import uuid

import pytest

from dsanalyzer.model import coordinate
from dsanalyzer.model.whatif import Model
from tests.dsanalyzer.remedy_verify import (
    TOLERANCE,
    job_command,
    make_data,
    profile,
    record,
    run_jobs,
    whatif,
)


@pytest.mark.slow
def test_two_coordinated_jobs_run_at_the_predicted_rate(tmp_path, capsys):
    """A prep-bound job (1 worker, prep 4.5 ms of CPU a sample, a 5 ms step) profiled alone; two of them
    sharing prep get two producers: the prediction per job is the prep rate at 2 workers."""
    data = make_data(tmp_path / "data")
    rep = profile(tmp_path / "run", job_command(data, "--workers", "1"))
    assert rep["remedy_probes"]["coordinate"]["batch_bytes"] > 0
    predicted = whatif(tmp_path / "run" / "report.json", "--jobs", "2", capsys=capsys)
    model = Model.from_report(rep)
    co = coordinate.coordinated(model, 2)
    assert predicted == pytest.approx(co.per_job.samples_per_s, rel=1e-5)
    assert co.per_job.samples_per_s > 1.3 * co.uncoordinated.samples_per_s  # sharing prep pays here
    sync = tmp_path / "sync"
    sync.mkdir()
    group = f"coordwt-{uuid.uuid4().hex[:8]}"
    args = ["--workers", "1", "--coordinate", group, "--jobs", "2", "--sync-dir", str(sync)]
    rates = run_jobs([job_command(data, *args, "--warmup", "10", "--measure", "64")] * 2, sync_dir=sync)
    measured = sum(rates) / len(rates)
    error = record("coordinate", predicted, measured, jobs=2, per_job=rates, bound=co.per_job.bound,
                   cpu_share=model.cpu_share, uncoordinated=co.uncoordinated.samples_per_s)  # fmt: skip
    with capsys.disabled():
        print(f"\ncoordinate K=2: predicted {predicted:.1f}, measured {measured:.1f} per job ({error:+.1%})")
    assert abs(error) <= TOLERANCE, f"predicted {predicted:.1f}, measured {measured:.1f} samples/s per job"
