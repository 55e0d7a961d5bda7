"""dsanalyzer's Python API profiles a DALILoader: its differential runs reach DALI's worker processes."""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("nvidia.dali", reason="coordl.dali needs NVIDIA DALI: pip install -e .[dali]")

import coordl  # noqa: E402
from coordl.dali import DALILoader, train_pipeline  # noqa: E402


class _LoggedFolder(coordl.ImageFolder):
    """An ImageFolder that logs "<tag> <pid>" for every file read, from whichever process reads."""

    def __init__(self, root: str, tag: int, log: str) -> None:
        super().__init__(root)
        self.tag, self.log = tag, log

    def _read(self, index: int) -> bytes:
        with open(self.log, "a") as f:
            f.write(f"{self.tag} {os.getpid()}\n")
        return super()._read(index)


@pytest.mark.slow
def test_dsanalyzer_profiles_a_dali_loader(jpeg_folder, tmp_path):
    from dsanalyzer.measure.plan import MODES
    from dsanalyzer.profiler import profile

    log = str(tmp_path / "reads.log")
    made = []

    def make():
        ds = _LoggedFolder(jpeg_folder, len(made), log)
        made.append(DALILoader(ds, batch_size=8, shuffle=True, transform=train_pipeline(32), num_threads=2))
        return made[-1]

    report = profile(make, lambda batch: time.sleep(0.002), iters=6, warmup=1, workers_list=[1, 2])
    for loader in made:
        loader.close()
    assert report["dataset"]["items"] == 40
    assert report["prep_scaling"]["workers"] == [1, 2]  # DALI restarted with 1, then 2 threads
    assert all(rate > 0 for rate in report["prep_scaling"]["samples_per_s"])
    assert all(report["rates_per_s"][k] > 0 for k in ("compute", "prep", "observed"))
    with open(log) as f:
        reads = [tuple(map(int, line.split())) for line in f]
    by_workers = {tag for tag, pid in reads if pid != os.getpid()}  # reads by DALI's worker processes
    # "prep" serves raw items from memory (dsanalyzer swaps the source's fetch before iterating): the
    # DALI workers restarted with that fetch and read no file; "real" reads from storage in the workers.
    assert MODES.index("prep") not in by_workers
    assert MODES.index("real") in by_workers
