"""``whatif --jobs 2`` against two coordinated jobs run for real (each its own process, ``coordinate=``)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from dsanalyzer.model import coordinate
from dsanalyzer.model.whatif import Model
from tests.dsanalyzer import remedy_verify as rv


@pytest.mark.skipif(
    os.environ.get("COORDL_VERIFY_REMEDIES") != "1",
    reason="a remedy applied for real, minutes alone on the machine: make verify-remedies (CI's 20 minutes; "
    "the share torch's pipeline left idle made it +6.2% to +12.2%; the producers' free share: -0.9%)",
)
@pytest.mark.slow
@pytest.mark.exclusive  # measures against a target: runs alone (scripts/test.sh)
def test_two_coordinated_jobs_run_at_the_predicted_rate(tmp_path, capsys):
    """A prep-bound job (1 worker, prep 4.5 ms of CPU a sample, a 5 ms step) profiled alone; two of them
    sharing prep get two producers: the prediction per job is the prep rate at 2 workers."""
    data = rv.make_data(tmp_path / "data")

    def attempt(tmp: Path) -> dict:
        rep = rv.profile(tmp / "run", rv.job_command(data, "--workers", "1"))
        assert rep["remedy_probes"]["coordinate"]["batch_bytes"] > 0
        predicted = rv.whatif(tmp / "run" / "report.json", "--jobs", "2", capsys=capsys)
        model = Model.from_report(rep)
        co = coordinate.coordinated(model, 2)
        assert predicted == pytest.approx(co.per_job.samples_per_s, rel=1e-5)
        assert co.per_job.samples_per_s > 1.3 * co.uncoordinated.samples_per_s  # sharing prep pays here
        sync = tmp / "sync"
        sync.mkdir()
        args = ["--workers", "1", "--coordinate", f"coordwt-{uuid.uuid4().hex[:8]}", "--jobs", "2",
                "--sync-dir", str(sync), "--warmup", "10", "--measure", "64"]  # fmt: skip
        rates, other = rv.run_jobs([rv.job_command(data, *args)] * 2, sync_dir=sync)
        return {"predicted": predicted, "measured": sum(rates) / len(rates), "per_job": rates,
                "profile_other": rv.profile_other_cores(rep), "run_other": other, "bound": co.per_job.bound,
                "cpu_share": model.cpu_share, "uncoordinated": co.uncoordinated.samples_per_s}  # fmt: skip

    row = rv.verified("coordinate", attempt, tmp_path)
    with capsys.disabled():
        print(f"\ncoordinate K=2: predicted {row['predicted']:.1f}, measured {row['measured']:.1f} per job "
              f"({row['error']:+.1%})")  # fmt: skip
