"""report.json: validation, loading (old versions, bad files), writing, and the terminal summary."""

from __future__ import annotations

import json
import os

import pytest

from dsanalyzer.report.schema import (
    SCHEMA_VERSION,
    ReportError,
    load_report,
    validate_report,
    write_report,
)
from dsanalyzer.report.text import summary_text


def minimal_report() -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "command": ["python", "train.py"],
        "machine": {
            "cpus": 2,
            "memory_bytes": 1 << 34,
            "storage_device": {},
            "mem_bandwidth_bytes_per_s": 8e9,
        },
        "dataset": {"items": 1000, "bytes": 100_000_000, "avg_item_bytes": 100_000.0, "path": "/data"},
        "batch_size": 32,
        "workers": 2,
        "cache_bytes": 0,
        "cache_policy": "pagecache",
        "rates_per_s": {"compute": 640.0, "prep": 400.0, "fetch": 300.0, "observed": 290.0},
        "prep_scaling": {"workers": [1, 2], "samples_per_s": [210.0, 400.0]},
        "fetch": {"bytes_per_s": 3e7, "items_per_s": 300.0},
        "per_iter_s": {"compute": 0.05, "prep_stall": 0.03, "fetch_stall": 0.03},
        "per_iter_spread_s": {k: {"p10": 0.0, "p90": 0.1} for k in ("compute", "prep_stall", "fetch_stall")},
        "per_epoch_s": {"compute": 1.6, "prep_stall": 0.9, "fetch_stall": 0.9, "total": 3.4, "iters": 32},
        "bound": "fetch",
        "advice": "fetch-bound",
        "runs": {"real": {"iters": 3, "wait_s": [0.1, 0.05, 0.04], "step_s": [0.05, 0.05, 0.05]}},
        "sysmon": {
            "t_s": [0, 0.5],
            "cpu_percent_per_core": [[10, 20], [90, 80]],
            "disk_read_bytes": [0, 100],
            "page_cache_bytes": [5, 6],
        },
        "model": {},
        "whatif": {"grid": [], "to_compute_bound": {}},
    }


def test_a_complete_report_validates():
    assert validate_report(minimal_report()) is not None


def test_an_older_schema_version_names_the_file_and_both_versions(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps({**minimal_report(), "schema_version": 0}))
    with pytest.raises(
        ReportError,
        match=r"report\.json.*schema_version is 0, this dsanalyzer reads versions 1, 2 \(an older dsanalyzer",
    ):
        load_report(path)


def test_a_report_without_a_version_is_refused(tmp_path):
    report = minimal_report()
    del report["schema_version"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    with pytest.raises(ReportError, match="schema_version is None"):
        load_report(path)


def test_missing_fields_are_listed(tmp_path):
    report = minimal_report()
    del report["rates_per_s"]["fetch"]
    del report["bound"]
    with pytest.raises(ReportError, match=r"rates_per_s\.fetch.*|bound"):
        validate_report(report, "x.json")


def test_unreadable_and_invalid_files_name_the_path(tmp_path):
    with pytest.raises(ReportError, match="nope.json: cannot read"):
        load_report(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ReportError, match="bad.json: not valid JSON"):
        load_report(bad)


def test_write_then_load_round_trips_and_writes_html(tmp_path):
    json_path, html_path = write_report(minimal_report(), tmp_path / "out")
    assert load_report(json_path)["per_iter_s"]["compute"] == 0.05
    assert load_report(tmp_path / "out")["bound"] == "fetch"  # a run directory works too
    assert html_path.read_text().lstrip().lower().startswith("<!doctype html")


def test_write_refuses_an_invalid_report(tmp_path):
    report = minimal_report()
    report["bound"] = "disk"
    with pytest.raises(ReportError, match="bound is 'disk'"):
        write_report(report, tmp_path)


def test_summary_says_what_binds_and_the_stalls():
    text = summary_text(minimal_report())
    assert "compute 50.0 ms" in text and "prep stall 30.0 ms" in text and "fetch stall 30.0 ms" in text
    assert "fetch-bound" in text
    assert "observed 290" in text
    assert "emulated" not in text


def test_summary_labels_emulated_storage_and_step():
    report = minimal_report()
    report["machine"].update(storage_note="emulated: 1.5 MB/s", compute_note="emulated accelerator: 30 ms")
    lines = summary_text(report).splitlines()
    assert "storage: emulated: 1.5 MB/s" in lines and "step: emulated accelerator: 30 ms" in lines


def test_a_newer_schema_version_says_to_upgrade(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps({**minimal_report(), "schema_version": 99}))
    with pytest.raises(ReportError, match=r"report\.json: schema_version is 99.*newer dsanalyzer"):
        load_report(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "binary content"),
        (b"[1, 2, 3]", "a report is a JSON object, got list"),
        (b'"text"', "a report is a JSON object, got str"),
        (b"{not json", "not valid JSON"),
    ],
)
def test_an_unreadable_report_names_the_file(tmp_path, content, message):
    path = tmp_path / "weird.json"
    path.write_bytes(content)
    with pytest.raises(ReportError, match=rf"weird\.json.*{message}"):
        load_report(path)


def test_report_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        json_path, html_path = write_report(minimal_report(), tmp_path)
    finally:
        os.umask(old)
    assert json_path.stat().st_mode & 0o777 == 0o644
    assert html_path.stat().st_mode & 0o777 == 0o644
