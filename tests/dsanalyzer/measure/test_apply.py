"""A fix's change applied inside an unmodified script: the loader built at the recorded line gets the
arguments (or is built as coordl.DataLoader), another loader keeps its own, torch's threads are set.

Each case runs in a fresh interpreter: the hook patches torch's DataLoader class for the whole process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dsanalyzer.measure.apply import ENV_APPLY, Change

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from dsanalyzer.measure import apply, callsite
    apply.install(apply.Change.from_env())
    import torch
    apply.on_torch(torch)
    import torch.utils.data.dataloader as tdl
    apply.patch_construction(tdl.DataLoader, True)
    import coordl.dataloader as cdl
    apply.patch_construction(cdl.DataLoader, False)
    data = list(range(64))
    train = torch.utils.data.DataLoader(data, 8, True)  # line 12
    val = torch.utils.data.DataLoader(data, batch_size=8)
    torch.set_num_threads(3)  # the script's own call, after the fix set its count
    out = {
        name: {"class": type(dl).__name__, "module": type(dl).__module__, "workers": dl.num_workers,
               "prefetch": dl.prefetch_factor, "cache": getattr(dl, "cache_bytes", None),
               "site": callsite.site_of(dl), "batches": sum(1 for _ in dl)}
        for name, dl in (("train", train), ("val", val))
    }
    out["threads"] = torch.get_num_threads()
    out["applied"] = apply.applied()
    print(json.dumps(out))
    """
)


def _run(tmp_path: Path, change: Change | None) -> dict:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(ENV_APPLY, None)
    if change is not None:
        env.update(change.to_env())
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_a_change_each_loader_records_the_line_that_built_it(tmp_path):
    out = _run(tmp_path, None)
    assert out["train"]["site"] == {"file": str(tmp_path / "job.py"), "line": 12}
    assert out["val"]["site"]["line"] == 13 and out["train"]["workers"] == 0 and out["applied"] == []


def test_the_loader_at_the_recorded_line_gets_the_arguments_and_the_other_keeps_its_own(tmp_path):
    site = {"file": str(tmp_path / "job.py"), "line": 12}
    out = _run(
        tmp_path, Change(torch_threads=1, loader_args={"num_workers": 2, "prefetch_factor": 3}, site=site)
    )
    assert out["train"]["workers"] == 2 and out["train"]["prefetch"] == 3 and out["train"]["batches"] == 8
    assert out["val"]["workers"] == 0 and out["val"]["prefetch"] is None
    assert out["threads"] == 1  # set when torch was imported; the script's own call later is ignored
    assert {"what": "ignored set_num_threads", "asked": 3} in out["applied"]


def test_a_torch_loader_is_built_as_coordl_dataloader_with_its_arguments(tmp_path):
    site = {"file": str(tmp_path / "job.py"), "line": 12}
    out = _run(
        tmp_path, Change(loader_args={"cache_bytes": 1 << 20}, switch_to="coordl.DataLoader", site=site)
    )
    assert out["train"]["module"] == "coordl.dataloader" and out["train"]["cache"] == 1 << 20
    assert (
        out["train"]["batches"] == 8 and out["train"]["site"] == site
    )  # built once, recorded at the script's line
    assert out["val"]["module"] == "torch.utils.data.dataloader"


def test_a_change_from_elsewhere_is_refused_with_the_variable_named():
    with pytest.raises(ValueError, match=ENV_APPLY):
        Change.from_env({ENV_APPLY: json.dumps({"switch_to": "os.system"})})
    with pytest.raises(ValueError, match=ENV_APPLY):
        Change.from_env({ENV_APPLY: "{not json"})


SAMPLE_CACHE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from dsanalyzer.measure import apply
    apply.install(apply.Change.from_env())
    import coordl.dataloader as cdl
    apply.patch_construction(cdl.DataLoader, False)
    import coordl
    from tests.dsanalyzer.remedy_job import SplitSource, write_data
    source = SplitSource(write_data(sys.argv[1], 16, 64), 0.0, 0.0, 4)
    loader = coordl.DataLoader(source, batch_size=4)  # line 10
    batches = [sum(1 for _ in loader) for _epoch in range(2)]
    stats = loader.stats()
    print(json.dumps({"store": type(loader.sample_cache).__name__, "batches": batches,
                      "hits": {k: v for k, v in stats.items() if "sample_cache" in k}}))
    """
)


def test_the_sample_cache_is_given_as_a_new_store_of_the_size_asked(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SAMPLE_CACHE_SCRIPT)
    change = Change(loader_args={"sample_cache": "memcache.LocalStore(4000000)"},
                    site={"file": str(script), "line": 10})  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), **change.to_env()}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "data")], env=env, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["store"] == "LocalStore" and out["batches"] == [4, 4], out
    with pytest.raises(ValueError, match="sample_cache must be memcache.LocalStore"):
        from dsanalyzer.measure.apply import _values

        _values({"sample_cache": "os.system('x')"})
