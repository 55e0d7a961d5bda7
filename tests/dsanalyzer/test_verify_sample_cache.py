"""``whatif --sample-cache-gb G`` against the same job run for real with ``sample_cache=`` (a LocalStore of G)."""

from __future__ import annotations

import pytest

from dsanalyzer.model import sample_cache
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
def test_the_sample_cache_runs_at_the_predicted_rate(tmp_path, capsys):
    """A prep-bound job (2 workers; prep a 3 ms deterministic prefix and a 1.5 ms random tail of CPU) with
    a store that holds about 60% of its samples: those skip the prefix, the rest run it all."""
    data = make_data(tmp_path / "data")
    rep = profile(tmp_path / "run", job_command(data, "--workers", "2"))
    probe = rep["remedy_probes"]["sample_cache"]
    assert probe["det_cpu_s_per_sample"] > 0 and probe["cached_sample_bytes"] > 0, probe
    cache_bytes = int(0.6 * 512 * probe["cached_sample_bytes"])
    predicted = whatif(tmp_path / "run" / "report.json", "--sample-cache-gb", f"{cache_bytes / 1e9:.9f}",
                       capsys=capsys)  # fmt: skip
    model = Model.from_report(rep)
    sc = sample_cache.sample_cached(model, cache_bytes)
    assert 0.55 <= sc.hit_ratio <= 0.6 and predicted == pytest.approx(sc.prediction.samples_per_s, rel=1e-4)
    assert predicted > 1.2 * model.predict_measured().samples_per_s  # the cache pays here
    args = ["--workers", "2", "--sample-cache-bytes", str(cache_bytes), "--measure", "96"]
    (measured,) = run_jobs([job_command(data, *args)])
    error = record("sample_cache", predicted, measured, cache_bytes=cache_bytes, hit_ratio=sc.hit_ratio,
                   bound=sc.prediction.bound, cpu_share=model.cpu_share,
                   plain=model.predict_measured().samples_per_s)  # fmt: skip
    with capsys.disabled():
        print(
            f"\nsample cache {sc.hit_ratio:.0%}: predicted {predicted:.1f}, measured {measured:.1f} ({error:+.1%})"
        )
    assert abs(error) <= TOLERANCE, f"predicted {predicted:.1f}, measured {measured:.1f} samples/s"
