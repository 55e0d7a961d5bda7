"""Progress: a bar on a terminal, plain lines (no carriage returns) anywhere else."""

from __future__ import annotations

import io

from nfs_cache import progress as progress_mod
from nfs_cache.progress import Progress


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_plain_lines_every_interval_off_a_terminal(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(progress_mod.time, "monotonic", clock)
    out = io.StringIO()  # not a terminal
    bar = Progress(100, "synthesising 100 images", unit="images", file=out, interval_s=5.0)
    for _ in range(10):
        clock.t += 1.0
        bar.update(10)
    bar.close()
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    # t=5 and t=10 (interval), then the closing line
    assert lines[0] == "synthesising 100 images: 50/100 images (50%), 5 s, 10 images/s"
    assert lines[-1].startswith("synthesising 100 images: 100/100 images (100%), 10 s")
    assert len(lines) == 3


def test_quick_work_prints_nothing_and_disabled_prints_nothing():
    out = io.StringIO()
    with Progress(3, "x", file=out) as bar:
        bar.update(3)
    with Progress(3, "y", file=out, enabled=False, terminal=True) as bar:
        bar.update(3)
    assert out.getvalue() == ""


def test_bytes_are_scaled(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(progress_mod.time, "monotonic", clock)
    out = io.StringIO()
    bar = Progress(4_000_000, "staging 2 files", unit="B", unit_scale=True, file=out, interval_s=1.0)
    clock.t += 2.0
    bar.set(2_000_000, files=1)
    assert out.getvalue() == "staging 2 files: 2.0M/4.0M B (50%), 2 s, 1.0M B/s, files 1\n"


def test_terminal_gets_a_bar():
    out = io.StringIO()
    with Progress(10, "demo", file=out, terminal=True) as bar:
        bar.update(10)
    assert "\r" in out.getvalue() and "10/10" in out.getvalue()
