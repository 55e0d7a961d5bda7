"""report.html: self-contained, and its plots really render in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from dsanalyzer.report.html import render_html, write_html
from tests.dsanalyzer.model.test_whatif import synthetic_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium(tmp_path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    cmd = [CHROMIUM, *_FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_page_is_self_contained_and_has_every_plot():
    page = render_html(synthetic_report(advice="prep-bound: 5 CPU cores make it compute-bound."))
    images = re.findall(r'<img id="([\w-]+)" alt="[\w-]+" src="data:image/png;base64,', page)
    assert images == ["stalls", "timeline", "whatif-cache", "whatif-cores", "sysmon"]
    assert "http://" not in page and "https://" not in page  # nothing fetched from the network
    assert "prep-bound: 5 CPU cores" in page


def test_page_survives_a_report_the_model_cannot_use(tmp_path):
    report = synthetic_report()
    del report["fetch"]
    path = write_html(report, tmp_path / "r" / "report.html")
    page = path.read_text()
    assert "No what-if curves" in page and "fetch.bytes_per_s" in page
    assert 'id="stalls"' in page


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_plots_render_in_headless_chromium(tmp_path):
    path = write_html(synthetic_report(), tmp_path / "report.html")
    url = path.resolve().as_uri()
    dom = _chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-plots-ok="5/5"' in dom.stdout, "the page's own check did not see 5 decoded images"

    shot = tmp_path / "shot.png"
    res = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,2400", "--hide-scrollbars", url)
    assert shot.exists(), res.stderr[-2000:]
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=float)
    assert pixels.shape[0] >= 2000 and pixels.shape[1] >= 1000
    # the plots' colours are on screen: the stacked-bar blue (#4c78a8) and the stall red (#e45756)
    for rgb in ((0x4C, 0x78, 0xA8), (0xE4, 0x57, 0x56)):
        close = np.all(np.abs(pixels - np.array(rgb)) < 12, axis=2)
        assert close.sum() > 500, f"colour {rgb} is missing from the screenshot: a plot did not render"
    assert pixels.std() > 20  # not a blank page
