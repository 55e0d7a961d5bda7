"""dsanalyzer profiles a user's own DALI pipeline (a plain ``DALIGenericIterator``), through the Python
API and through the import hook; a ``coordl.dali.DALILoader`` (a DALI iterator inside) is timed once.

The pipeline reads its files in order (no shuffle), so what it reads during a run is known: DALI reads
a few batches ahead, and the rest of the epoch while the job runs. Storage reads are counted from
``/proc/self/io`` (``read_bytes``: bytes this process caused to be fetched from storage, all threads).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("nvidia.dali", reason="needs NVIDIA DALI: pip install -e .[dali]")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from nvidia.dali import fn, types  # noqa: E402
from nvidia.dali.pipeline import Pipeline  # noqa: E402
from nvidia.dali.plugin import pytorch as dali_torch  # noqa: E402
from nvidia.dali.plugin.pytorch import DALIClassificationIterator, DALIGenericIterator, LastBatchPolicy  # noqa: E402

from coordl.datasets.synth import make_dataset  # noqa: E402
from dsanalyzer import intercept  # noqa: E402
from dsanalyzer.cli import main as cli_main  # noqa: E402
from dsanalyzer.intercept import ProbeState  # noqa: E402
from dsanalyzer.measure.hookconfig import HookConfig  # noqa: E402
from dsanalyzer.measure.launch import run_child  # noqa: E402
from dsanalyzer.measure.machine import storage_device  # noqa: E402
from dsanalyzer.measure.plan import MODES  # noqa: E402
from dsanalyzer.profiler import profile  # noqa: E402

ITEMS, BATCH = 160, 8  # 20 batches per epoch


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """160 synthetic 64x48 JPEGs in 4 class folders."""
    root = make_dataset(tmp_path_factory.mktemp("dali-iter"), n=ITEMS, classes=4, width=64, height=48, seed=0)
    return str(root)


def _jpegs(root: str) -> list[str]:
    return sorted(str(p) for p in Path(root).rglob("*.jpg"))


def _pipeline(root: str, device: str = "cpu", runs: list[int] | None = None) -> Pipeline:
    """The user's pipeline: file reader, decode, random-resized crop, normalize (CHW float).

    ``runs`` counts the batches the pipeline hands out (each ``share_outputs`` call).
    """
    gpu = device == "gpu"
    pipe = Pipeline(batch_size=BATCH, num_threads=2, device_id=0 if gpu else None, seed=1)
    with pipe:
        jpegs, labels = fn.readers.file(file_root=root, name="Reader")
        images = fn.decoders.image(jpegs, device="mixed" if gpu else "cpu")
        images = fn.random_resized_crop(images, size=32)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW")
        pipe.set_outputs(images, labels.gpu() if gpu else labels)
    if runs is not None:
        share = pipe.share_outputs

        def counted():
            runs[0] += 1
            return share()

        pipe.share_outputs = counted
    return pipe


def _read_bytes() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


@pytest.fixture
def storage(folder) -> str:
    """The folder, on storage whose page cache dsanalyzer can drop (not tmpfs) and whose reads are counted."""
    if not os.path.exists("/proc/self/io"):
        pytest.skip("no /proc/self/io (kernel without task I/O accounting): storage reads cannot be counted")
    if storage_device(folder)["fstype"] in ("tmpfs", "ramfs"):
        pytest.skip(f"{folder} is in memory (tmpfs): there is no cold cache to measure")
    return folder


def test_python_api_profiles_a_plain_dali_iterator(storage):
    made, runs, reads, seen = [], [], {}, {}

    def make():
        runs.append([0])
        made.append(DALIGenericIterator([_pipeline(storage, runs=runs[-1])], ["data", "label"],
                                        reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL))  # fmt: skip
        return made[-1]

    def step(batch):
        mode = MODES[len(made) - 1]  # make() is called once per run, in MODES order
        reads.setdefault(mode, []).append(_read_bytes())
        seen.setdefault(mode, set()).add(id(batch))
        assert batch[0]["data"].shape == (BATCH, 3, 32, 32)

    report = profile(make, step, iters=12, warmup=2, workers_list=[1, 2])
    dataset = report["dataset"]
    assert (dataset["items"], dataset["files"]) == (ITEMS, ITEMS)  # from the reader's file_root
    assert dataset["bytes"] == sum(os.path.getsize(p) for p in _jpegs(storage))
    assert dataset["files_from"] == "the pipeline's readers" and dataset["path"] == os.path.abspath(storage)
    assert report["batch_size"] == BATCH and report["workers"] == 2  # the pipeline's num_threads
    assert report["loader"]["class"] == "nvidia.dali.plugin.pytorch.DALIGenericIterator"
    assert report["loader"]["prep_device"] == "cpu"
    scaling = report["prep_scaling"]
    assert scaling["workers"] == [2] and list(scaling["skipped"]) == ["1"] and scaling["samples_per_s"][0] > 0
    assert all(report["rates_per_s"][k] > 0 for k in ("compute", "prep", "fetch", "observed"))
    assert report["fetch"]["threads"] == 1  # one reader, one reading thread
    # compute: the one batch DALI had prepared, replayed; the pipeline never ran again
    assert runs[MODES.index("compute")] == [1] and len(seen["compute"]) == 1
    # prep: every file resident before the run, and nothing read from storage while it ran
    assert report["prep_memory"]["resident_fraction"] == 1.0
    assert reads["prep"][-1] == reads["prep"][0]
    # real: the files evicted first, then DALI read the rest of the epoch from storage as the job ran
    assert report["real_cold"]["evicted"] == ITEMS
    assert reads["real"][-1] > reads["real"][0]


def test_a_pipeline_without_readers_uses_data_or_names_the_flag(folder):
    files = _jpegs(folder)

    def make():
        batches = iter(range(10**6))

        def source():  # the user's own reading code: DALI cannot see which files it opens
            i = next(batches) * BATCH
            return [np.fromfile(files[(i + k) % len(files)], dtype=np.uint8) for k in range(BATCH)]

        pipe = Pipeline(batch_size=BATCH, num_threads=1, device_id=None, seed=1)
        with pipe:
            pipe.set_outputs(
                fn.resize(fn.decoders.image(fn.external_source(source=source, batch=True)), size=16)
            )
        return DALIGenericIterator([pipe], ["data"])

    blind = profile(make, lambda batch: None, iters=4, warmup=1, workers_list=[1])
    assert blind["dataset"]["files"] == 0 and "--data DIR" in blind["dataset"]["size_note"]
    assert "--data DIR" in blind["model"]["error"]  # no what-if model without item sizes, and why
    assert blind["rates_per_s"]["observed"] > 0  # the runs themselves are still measured
    one_class = os.path.join(folder, "class_000")
    told = profile(make, lambda batch: None, iters=4, warmup=1, workers_list=[1], data_path=one_class)
    assert told["dataset"]["files_from"] == "--data"
    assert told["dataset"]["items"] == len(os.listdir(one_class)) and told["fetch"]["bytes_per_s"] > 0


# -- the import hook, in this process ----------------------------------------------------------------


@pytest.fixture
def hook(tmp_path, monkeypatch):
    """The hook's patches on DALI's iterator and coordl's DALILoader (undone after the test)."""
    from coordl.dali import loader as dali_loader

    for cls, names in (
        (DALIGenericIterator, ("__init__", "__next__")),
        (dali_loader.DALILoader, ("__iter__",)),
    ):
        for name in names:
            monkeypatch.setattr(cls, name, cls.__dict__[name])  # restores the original at teardown
    intercept._patch_module(dali_torch)
    intercept._patch_module(dali_loader)

    def make(mode: str, iters: int, warmup: int = 1) -> ProbeState:
        state = ProbeState(HookConfig(mode, result_dir=str(tmp_path), iters=iters, warmup=warmup))
        monkeypatch.setattr(intercept, "_STATE", state)
        return state

    return make


def _result(tmp_path: Path) -> dict:
    (path,) = tmp_path.glob("result-*.json")
    return json.loads(path.read_text())


def test_hook_times_a_dali_iterator_across_epochs(hook, folder, tmp_path):
    state = hook("real", iters=24, warmup=1)
    it = DALIGenericIterator([_pipeline(folder)], ["data", "label"], reader_name="Reader")
    assert state.loader is None  # DALI prepared its first batch inside __init__: not a batch the job took
    taken = 0
    with pytest.raises(SystemExit):
        for _epoch in range(5):
            for _batch in it:
                taken += 1
            it.reset()
    assert taken == 25  # the timed run went on into the second epoch, as a training loop does
    result = _result(tmp_path)
    assert result["status"] == "stopped" and result["batch_items"] == [BATCH] * 25
    assert result["loader"]["class"] == "nvidia.dali.plugin.pytorch.DALIGenericIterator"
    assert result["cold"]["files"] == ITEMS and result["cold"]["evicted"] == ITEMS
    assert result["epoch_starts"] == [0, ITEMS // BATCH]  # the first __next__ after reset() starts epoch 2


def test_hook_compute_run_replays_one_batch_without_running_the_pipeline(hook, folder):
    hook("compute", iters=30, warmup=0)
    runs = [0]
    it = DALIClassificationIterator(_pipeline(folder, runs=runs), reader_name="Reader")  # a subclass
    batches = []
    with pytest.raises(SystemExit):
        for batch in it:
            batches.append(batch)
    assert len(batches) == 30 and all(b is batches[0] for b in batches)  # more than an epoch: no end
    assert runs == [1]


def test_a_dali_loader_is_timed_once_as_the_outermost_loader(hook, folder, tmp_path):
    import coordl
    from coordl.dali import DALILoader, train_pipeline

    state = hook("real", iters=5, warmup=1)
    loader = DALILoader(
        coordl.ImageFolder(folder), batch_size=BATCH, transform=train_pipeline(32), num_threads=1
    )
    try:
        with pytest.raises(SystemExit):
            for _images, _labels in loader:
                pass
    finally:
        loader.close()
    assert state.loader is loader  # not the DALIGenericIterator it pulls from
    result = _result(tmp_path)
    assert result["loader"]["class"] == "coordl.dali.loader.DALILoader"
    assert result["batch_items"] == [BATCH] * 6  # one record per batch: not timed twice


def test_an_unmodified_dali_loader_script_is_intercepted(folder, tmp_path):
    # Both coordl.dali.loader and nvidia.dali.plugin.pytorch are patched as the script imports them.
    script = tmp_path / "train_dali_loader.py"
    script.write_text(
        "import sys, coordl\n"
        "from coordl.dali import DALILoader, train_pipeline\n"
        "loader = DALILoader(coordl.ImageFolder(sys.argv[1]), batch_size=8, transform=train_pipeline(32),\n"
        "                    num_threads=1)\n"
        "for epoch in range(100):\n"
        "    for images, labels in loader:\n"
        "        images.mean().item()\n"
    )
    cfg = HookConfig("real", result_dir=str(tmp_path / "res"), iters=4, warmup=1)
    result = run_child([sys.executable, str(script), folder], cfg, tmp_path / "log.txt", timeout_s=120)
    assert result["status"] == "stopped" and result["loader"]["class"] == "coordl.dali.loader.DALILoader"
    assert result["batch_items"] == [BATCH] * 5


SCRIPT = """
import sys
import torch
from nvidia.dali import fn, types, pipeline_def
from nvidia.dali.plugin.pytorch import DALIClassificationIterator, LastBatchPolicy

@pipeline_def(batch_size=8, num_threads=2, device_id=None, seed=1)
def train_pipe(root):
    jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")
    images = fn.decoders.image(jpegs, device="cpu")
    images = fn.random_resized_crop(images, size=32)
    return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW"), labels

torch.manual_seed(0)
loader = DALIClassificationIterator(train_pipe(sys.argv[1]), reader_name="Reader", auto_reset=True,
                                    last_batch_policy=LastBatchPolicy.PARTIAL)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(1000):
    for batch in loader:
        images, labels = batch[0]["data"], batch[0]["label"].view(-1).long()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        opt.zero_grad(); loss.backward(); opt.step()
"""


@pytest.mark.slow
def test_cli_profiles_an_unmodified_dali_script(folder, tmp_path, capsys):
    script = tmp_path / "train_dali.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    argv = ["profile", "--quiet", "--iters", "10", "--warmup", "2", "--out", str(out), "--"]
    assert cli_main([*argv, sys.executable, str(script), folder]) == 0, capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    for key in ("schema_version", "machine", "dataset", "rates_per_s", "prep_scaling", "fetch", "per_iter_s",
                "per_iter_spread_s", "per_epoch_s", "bound", "advice", "runs", "sysmon", "model", "whatif",
                "verdict", "prep_memory", "real_cold"):  # fmt: skip
        assert key in report, key
    assert report["dataset"]["items"] == ITEMS and report["dataset"]["files"] == ITEMS
    assert report["loader"]["class"] == "nvidia.dali.plugin.pytorch.DALIClassificationIterator"
    assert report["batch_size"] == BATCH and report["prep_scaling"]["workers"] == [2]
    assert all(report["runs"][mode]["iters"] == 12 for mode in ("compute", "prep", "real"))
    assert all(report["rates_per_s"][k] > 0 for k in ("compute", "prep", "fetch", "observed"))
    assert report["prep_memory"]["resident_fraction"] == 1.0 and report["real_cold"]["evicted"] == ITEMS
    assert report["model"].get("dataset_items") == ITEMS  # the what-if model was built
    assert (out / "report.html").stat().st_size > 0


@pytest.mark.gpu
def test_gpu_decode_is_prep_stall_and_the_compute_run_replays_cuda_tensors(folder):
    torch.manual_seed(0)
    model = torch.nn.Conv2d(3, 8, 3).cuda()
    made, compute_batches = [], []

    def make():
        made.append(
            DALIGenericIterator([_pipeline(folder, device="gpu")], ["data", "label"], reader_name="Reader")
        )
        return made[-1]

    def step(batch):
        if MODES[len(made) - 1] == "compute":
            compute_batches.append(batch)
        model(batch[0]["data"]).sum().item()

    report = profile(make, step, iters=20, warmup=3, workers_list=[2])
    assert len(compute_batches) == 23 and all(b is compute_batches[0] for b in compute_batches)
    assert (
        compute_batches[0][0]["data"].is_cuda and compute_batches[0][0]["label"].is_cuda
    )  # replayed on the GPU
    assert report["loader"]["prep_device"] == "gpu" and report["dataset"]["items"] == ITEMS
    # the compute run decodes nothing; nvJPEG's share of the GPU in the other runs is prep stall
    assert report["per_iter_s"]["prep_stall"] > 0
