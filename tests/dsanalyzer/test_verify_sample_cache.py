"""``whatif --sample-cache-gb G`` against the same job run for real with ``sample_cache=`` (a LocalStore of G)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dsanalyzer.model import sample_cache
from dsanalyzer.model.whatif import Model
from tests.dsanalyzer import remedy_verify as rv


@pytest.mark.skipif(
    os.environ.get("COORDL_VERIFY_REMEDIES") != "1",
    reason="a remedy applied for real, minutes alone on the machine: make verify-remedies (CI's 20 minutes)",
)
@pytest.mark.slow
@pytest.mark.exclusive  # measures against a target: runs alone (scripts/test.sh)
def test_the_sample_cache_runs_at_the_predicted_rate(tmp_path, capsys):
    """A prep-bound job (2 workers; prep a 3 ms deterministic prefix and a 1.5 ms random tail of CPU) with
    a store that holds about 60% of its samples: those skip the prefix, the rest run it all."""
    data = rv.make_data(tmp_path / "data")

    def attempt(tmp: Path) -> dict:
        rep = rv.profile(tmp / "run", rv.job_command(data, "--workers", "2"))
        probe = rep["remedy_probes"]["sample_cache"]
        assert probe["det_cpu_s_per_sample"] > 0 and probe["cached_sample_bytes"] > 0, probe
        cache_bytes = int(0.6 * 512 * probe["cached_sample_bytes"])
        predicted = rv.whatif(tmp / "run" / "report.json", "--sample-cache-gb", f"{cache_bytes / 1e9:.9f}",
                           capsys=capsys)  # fmt: skip
        model = Model.from_report(rep)
        sc = sample_cache.sample_cached(model, cache_bytes)
        assert 0.55 <= sc.hit_ratio <= 0.6 and predicted == pytest.approx(
            sc.prediction.samples_per_s, rel=1e-4
        )
        assert predicted > 1.2 * model.predict_measured().samples_per_s  # the cache pays here
        args = ["--workers", "2", "--sample-cache-bytes", str(cache_bytes), "--measure", "96"]
        (measured,), other = rv.run_jobs([rv.job_command(data, *args)])
        return {"predicted": predicted, "measured": measured, "profile_other": rv.profile_other_cores(rep),
                "run_other": other, "cache_bytes": cache_bytes, "hit_ratio": sc.hit_ratio,
                "bound": sc.prediction.bound, "cpu_share": model.cpu_share,
                "plain": model.predict_measured().samples_per_s}  # fmt: skip

    row = rv.verified("sample_cache", attempt, tmp_path)
    with capsys.disabled():
        print(f"\nsample cache 60%: predicted {row['predicted']:.1f}, measured {row['measured']:.1f} "
              f"({row['error']:+.1%})")  # fmt: skip
