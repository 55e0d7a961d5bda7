"""Interception of an unmodified script: the patched ``__iter__``, the import hook, bad scripts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsanalyzer import intercept
from dsanalyzer.cli import main as cli_main
from dsanalyzer.intercept import ProbeState, patch_loader_class
from dsanalyzer.measure.hookconfig import HookConfig
from dsanalyzer.measure.launch import ProfileError, run_child
from tests.dsanalyzer.workloads import write_files, write_script

PY = sys.executable
HOOK = str(Path(intercept.__file__).parent / "_hook")
ROOT = str(Path(intercept.__file__).resolve().parent.parent)


class ListLoader:
    """A minimal loader: iterating yields its batches (lists of 4 items)."""

    batch_size = 4
    num_workers = 0

    def __init__(self, batches: int = 30) -> None:
        self.batches = batches

    def __iter__(self):
        return iter([[i] * 4 for i in range(self.batches)])


class WrappingLoader:
    """A loader that wraps another (as coordl.DataLoader wraps torch's)."""

    batch_size = 4
    num_workers = 0

    def __init__(self) -> None:
        self.inner = ListLoader()

    def __iter__(self):
        return iter(self.inner)


@pytest.fixture
def probe(tmp_path, monkeypatch):
    def make(mode: str = "real", iters: int = 5, warmup: int = 1, min_seconds: float = 0.0) -> ProbeState:
        state = ProbeState(
            HookConfig(mode, result_dir=str(tmp_path), iters=iters, warmup=warmup, min_seconds=min_seconds)
        )
        monkeypatch.setattr(intercept, "_STATE", state)
        return state

    for cls in (ListLoader, WrappingLoader):
        monkeypatch.setattr(cls, "__iter__", cls.__dict__["__iter__"])
        patch_loader_class(cls)
    return make


def _result(tmp_path: Path) -> dict:
    (path,) = tmp_path.glob("result-*.json")
    return json.loads(path.read_text())


def test_patched_loader_is_timed_and_stopped_after_warmup_plus_iters(probe, tmp_path):
    probe(iters=5, warmup=1)
    seen = 0
    with pytest.raises(SystemExit) as exit_info:
        for _batch in ListLoader():
            seen += 1
    assert exit_info.value.code == 0
    assert seen == 6
    result = _result(tmp_path)
    assert result["status"] == "stopped" and result["mode"] == "real"
    assert len(result["wait_s"]) == 6 and len(result["step_s"]) == 6
    assert result["batch_items"] == [4] * 6


def test_min_seconds_keeps_measuring_past_iters(probe, tmp_path):
    """iters=3 after 2 warm-up batches, but at least 0.6 s measured: with 50 ms steps about 12 batches (a busy
    machine stretches the steps: 4 or more measured ones still show it measured past ``iters``)."""
    import time

    probe(iters=3, warmup=2, min_seconds=0.6)
    start, loader = None, ListLoader(batches=4)
    with pytest.raises(SystemExit):
        for _epoch in range(100):
            for i, _batch in enumerate(loader):
                if start is None and i == 2:
                    start = time.monotonic()  # the first measured batch
                time.sleep(0.05)
    result = _result(tmp_path)
    assert len(result["wait_s"]) >= 2 + 4  # 3 would have stopped at 0.15 s
    assert time.monotonic() - start >= 0.6
    assert (
        HookConfig.from_env(HookConfig("real", result_dir="d", min_seconds=2.5).to_env()).min_seconds == 2.5
    )


def _epochs(loader, n: int = 10) -> None:
    """Run ``n`` epochs of ``loader`` as a training loop does, until the probe stops the script."""
    with pytest.raises(SystemExit):
        for _epoch in range(n):
            for _batch in loader:
                pass


def test_epochs_continue_the_same_timeline(probe, tmp_path):
    probe(iters=7, warmup=0)
    _epochs(ListLoader(batches=3))
    assert len(_result(tmp_path)["wait_s"]) == 7


def test_each_epochs_first_batch_is_marked_and_waits_for_iter(probe, tmp_path, monkeypatch):
    """torch starts a non-persistent loader's workers inside ``iter()``: that is the loader's time."""
    import time

    inner = ListLoader.__dict__["__iter__"]

    def slow_iter(self):
        time.sleep(0.1)
        return inner(self)

    monkeypatch.setattr(ListLoader, "__iter__", slow_iter)
    patch_loader_class(ListLoader)
    probe(iters=7, warmup=0)
    _epochs(ListLoader(batches=3))
    result = _result(tmp_path)
    assert result["epoch_starts"] == [0, 3, 6]
    waits = result["wait_s"]
    assert min(waits[i] for i in (0, 3, 6)) >= 0.1 > max(waits[i] for i in (1, 2, 4, 5))


class AutoResetIterator:
    """A DALI-style iterator (its own iterator): StopIteration after ``per_epoch`` batches, then it rewinds
    itself (DALI's ``auto_reset=True``); ``reset_s`` of work happens in the first ``__next__`` after."""

    batch_size = 4

    def __init__(self, per_epoch: int = 3, reset_s: float = 0.0) -> None:
        self.per_epoch, self.reset_s, self.pos, self.rewound = per_epoch, reset_s, 0, False

    def __iter__(self):
        return self

    def __next__(self):
        import time

        if self.rewound:
            self.rewound = False
            time.sleep(self.reset_s)
        if self.pos == self.per_epoch:
            self.pos, self.rewound = 0, True
            raise StopIteration
        self.pos += 1
        return [self.pos] * 4


def test_a_dali_style_iterator_marks_the_first_batch_after_each_stop_iteration(tmp_path, monkeypatch):
    """Its epochs have no ``__iter__`` call to mark: the batch after a StopIteration starts the next one."""
    monkeypatch.setattr(AutoResetIterator, "__next__", AutoResetIterator.__dict__["__next__"])
    monkeypatch.setattr(AutoResetIterator, "__init__", AutoResetIterator.__dict__["__init__"])
    intercept.patch_dali_iterator_class(AutoResetIterator)
    state = ProbeState(HookConfig("real", result_dir=str(tmp_path), iters=7, warmup=0, min_seconds=0.0))
    monkeypatch.setattr(intercept, "_STATE", state)
    _epochs(AutoResetIterator(per_epoch=3, reset_s=0.1))
    result = _result(tmp_path)
    assert result["epoch_starts"] == [0, 3, 6]
    waits = result["wait_s"]
    assert min(waits[3], waits[6]) >= 0.1 > max(waits[i] for i in (1, 2, 4, 5))


def test_a_wrapping_loader_is_timed_once_not_twice(probe, tmp_path):
    state = probe(iters=3, warmup=0)
    it = iter(WrappingLoader())
    assert isinstance(it, intercept.TimedIterator)
    assert not isinstance(it._inner, intercept.TimedIterator)
    assert isinstance(state.loader, WrappingLoader)


def test_only_the_first_loader_is_profiled(probe, tmp_path):
    probe(iters=3, warmup=0)
    first, second = ListLoader(), ListLoader()
    iter(first)
    assert not isinstance(iter(second), intercept.TimedIterator)


def test_compute_mode_replays_one_batch(probe, tmp_path):
    probe(mode="compute", iters=4, warmup=0)
    batches = []
    with pytest.raises(SystemExit):
        for batch in ListLoader():
            batches.append(batch)
    assert len(batches) == 4 and all(b is batches[0] for b in batches)


def test_a_script_that_ends_early_still_reports(probe, tmp_path):
    state = probe(iters=100, warmup=0)
    for _batch in ListLoader(batches=3):
        pass
    state.finish("exit")
    result = _result(tmp_path)
    assert result["status"] == "exit" and len(result["wait_s"]) == 3


def test_sitecustomize_chains_to_the_one_it_shadows(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.CHAINED = True\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HOOK, ROOT, str(other)]), "DSANALYZER_MODE": ""}
    out = subprocess.run(
        [PY, "-c", "import builtins; print(getattr(builtins, 'CHAINED', False))"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "True", out.stderr


def test_unmodified_torch_script_is_intercepted(tmp_path):
    data = write_files(tmp_path / "data")
    script = write_script(tmp_path / "train.py", workers=1)
    cfg = HookConfig("real", result_dir=str(tmp_path / "res"), iters=6, warmup=1)
    result = run_child([PY, str(script), str(data)], cfg, tmp_path / "log.txt", timeout_s=120)
    assert result["status"] == "stopped"
    assert len(result["wait_s"]) == 7 and result["batch_items"][-1] == 4
    assert result["loader"]["class"] == "torch.utils.data.dataloader.DataLoader"
    assert result["cold"]["files"] == 32  # found through the dataset's .samples


def test_a_result_left_by_an_earlier_run_in_the_same_directory_is_not_read(tmp_path):
    """Profiling again into the same --out: run_child must wait for this run's result, not an old one."""
    data = write_files(tmp_path / "data")
    script = write_script(tmp_path / "train.py", workers=1)
    res = tmp_path / "res"
    res.mkdir()
    stale = {"format": "dsanalyzer-run/1", "pid": 1, "mode": "real", "status": "stopped", "wait_s": [9.0]}
    (res / "result-1.json").write_text(json.dumps(stale))
    (res / "progress-1.txt").write_text("7 7\n")
    cfg = HookConfig("real", result_dir=str(res), iters=6, warmup=1)
    result = run_child([PY, str(script), str(data)], cfg, tmp_path / "log.txt", timeout_s=120)
    assert result["pid"] != 1 and len(result["wait_s"]) == 7
    assert not (res / "result-1.json").exists()


def test_coordl_dataloader_is_intercepted(tmp_path):
    script = tmp_path / "train_coordl.py"
    script.write_text(
        "import sys, torch, coordl\n"
        "from tests.dsanalyzer.workloads import TimedSource\n"
        "src = TimedSource(64, 100, 0.0, 0.0)\n"
        "loader = coordl.DataLoader(src, batch_size=4, num_workers=1)\n"
        "for epoch in range(100):\n"
        "    for x in loader:\n"
        "        pass\n"
    )
    # the script imports the test helpers: run_child puts the repository root on PYTHONPATH
    cfg = HookConfig("prep", result_dir=str(tmp_path / "res"), iters=5, warmup=1)
    result = run_child([PY, str(script)], cfg, tmp_path / "log.txt", timeout_s=120)
    assert result["loader"]["class"] == "coordl.dataloader.DataLoader"
    assert len(result["wait_s"]) == 6
    assert result["memory"]["method"] == "coordl fetch tier from a dict"


def test_a_crashing_script_fails_with_its_output(tmp_path, capsys):
    script = tmp_path / "crash.py"
    script.write_text("raise RuntimeError('boom in the training script')\n")
    rc = cli_main(["profile", "--quiet", "--out", str(tmp_path / "out"), "--", PY, str(script)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "failed with exit code 1" in err and "boom in the training script" in err


def test_a_script_without_a_loader_is_a_clear_error(tmp_path):
    script = tmp_path / "noloader.py"
    script.write_text("print('no loader here')\n")
    with pytest.raises(ProfileError, match="never iterated a torch.utils.data.DataLoader"):
        run_child(
            [PY, str(script)], HookConfig("real", result_dir=str(tmp_path / "res")), tmp_path / "log", 60
        )


def test_a_loader_that_yields_nothing_is_a_clear_error(tmp_path):
    script = tmp_path / "empty.py"
    script.write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "for x in DataLoader([], batch_size=4):\n    pass\n"
    )
    with pytest.raises(ProfileError, match="yielded no batches"):
        run_child(
            [PY, str(script)], HookConfig("real", result_dir=str(tmp_path / "res")), tmp_path / "log", 60
        )


def test_a_missing_command_is_a_clear_error(tmp_path, capsys):
    rc = cli_main(["profile", "--quiet", "--out", str(tmp_path / "o"), "--", str(tmp_path / "nope")])
    assert rc == 1 and "cannot start" in capsys.readouterr().err


def test_progress_off_a_terminal_is_a_line_every_few_seconds(monkeypatch):
    import io

    from dsanalyzer.measure import launch

    clock = [100.0]
    monkeypatch.setattr(launch.time, "monotonic", lambda: clock[0])
    stream = io.StringIO()  # not a terminal
    bar = launch.ProgressBar("        real", True, interval_s=5.0, stream=stream)
    for done in range(1, 21):
        clock[0] += 1.0  # one iteration a second
        bar.update(done, 20)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert lines == [f"dsanalyzer: real run: {n}/20 iterations" for n in (5, 10, 15, 20)]


def test_progress_keeps_a_fixed_total_while_min_seconds_keeps_measuring(monkeypatch, tmp_path):
    from dsanalyzer.measure import recorder

    clock = [0.0]
    monkeypatch.setattr(recorder.time, "monotonic", lambda: clock[0])
    rec = recorder.RunRecorder(
        HookConfig("real", result_dir=str(tmp_path), iters=10, warmup=2, min_seconds=10.0)
    )

    def pull() -> list:
        clock[0] += 0.25
        return [0]

    seen = []
    for _ in range(42):  # one batch every 0.25 s: 10 measured iterations take 2.5 s of the 10
        rec.next_batch(pull, len)
        seen.append(rec.progress_counts())
    assert seen[:2] == [(1, 12), (2, 12)]  # warm-up: the target as asked
    # the total never moves (it once jumped from 157 to 411); progress follows the clock, never back
    assert {total for _, total in seen} == {12}
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[-1] == 12 and done[20] < 12
    assert seen[2 + 19] == (2 + 5, 12)  # 20 measured batches, 5 s of the 10: half the measured part


def test_loader_facts_record_the_epoch_verify_warms_up_over():
    import torch

    from dsanalyzer.jobs.torch_loader import loader_facts

    facts = loader_facts(torch.utils.data.DataLoader(list(range(100)), batch_size=32, drop_last=True))
    assert facts["drop_last"] is True and facts["batches_per_epoch"] == 3

    class Stream(torch.utils.data.IterableDataset):  # no __len__: the epoch is unknown, not an error
        def __iter__(self):
            return iter(range(10))

    facts = loader_facts(torch.utils.data.DataLoader(Stream(), batch_size=4))
    assert facts["drop_last"] is False and facts["batches_per_epoch"] is None


def test_sigterm_to_dsanalyzer_stops_the_profiled_job_too(tmp_path):
    """The job runs in its own session; a ``kill`` of dsanalyzer must not leave it (and its workers) running."""
    import signal
    import time

    import psutil

    pid_file = tmp_path / "job.pid"
    script = tmp_path / "slow.py"
    script.write_text(
        "import os, sys, time, torch.utils.data as tud\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "class Slow(tud.Dataset):\n"
        "    def __len__(self): return 10_000\n"
        "    def __getitem__(self, i): time.sleep(0.05); return i\n"
        "for _ in tud.DataLoader(Slow(), batch_size=4, num_workers=1): pass\n"
    )
    cmd = [
        PY,
        "-m",
        "dsanalyzer.cli",
        "profile",
        "--quiet",
        "--out",
        str(tmp_path / "out"),
        "--",
        PY,
        str(script),
    ]
    cli = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text():
            assert cli.poll() is None, cli.stdout.read().decode(errors="replace")
            assert time.monotonic() < deadline, "the profiled job never started"
            time.sleep(0.2)
        job = psutil.Process(int(pid_file.read_text()))
        family = [job, *job.children(recursive=True)]
        time.sleep(1.0)  # inside the wait loop, the loader's worker started
        family += [c for c in job.children(recursive=True) if c not in family]
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=60) == 128 + signal.SIGTERM
        _gone, alive = psutil.wait_procs(family, timeout=30)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"still running after dsanalyzer was stopped: {alive}"
    finally:
        if cli.poll() is None:
            cli.kill()


def test_recorder_counts_the_loaders_counters_over_the_measured_batches_only(tmp_path):
    import json

    from dsanalyzer.measure import recorder

    rec = recorder.RunRecorder(HookConfig("real", result_dir=str(tmp_path), iters=3, warmup=2))
    handed = {"remote_items": 0.0}
    rec.counters = lambda: dict(handed)
    with pytest.raises(recorder.RunComplete):
        for i in range(10):  # batches 0-1 warm up, 2-4 measured; every other one "remote"
            rec.next_batch(lambda i=i: handed.__setitem__("remote_items", handed["remote_items"] + 32 * (i % 2)) or [0] * 32, len)  # fmt: skip
    rec.write_result("stopped", {})
    result = json.loads(next(tmp_path.glob("result-*.json")).read_text())
    assert result["loader_counters"] == {"remote_items": 32.0}  # batch 3 of 2, 3, 4 (batch 1: warm-up)
    # a count that went back (the script reset the loader's stats): unknown, not negative
    rec2 = recorder.RunRecorder(HookConfig("real", result_dir=str(tmp_path / "b"), iters=1, warmup=0))
    counts = iter([5.0, 0.0])
    rec2.counters = lambda: {"remote_items": next(counts)}
    with pytest.raises(recorder.RunComplete):
        for _ in range(3):
            rec2.next_batch(lambda: [0], len)
    assert rec2._counters_section() is None
