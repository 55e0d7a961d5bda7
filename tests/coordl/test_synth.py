"""coordl.synth: deterministic, idempotent, realistic in size, learnable, and the CLI."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import simplejpeg

from coordl.cli import main as cli_main
from coordl.datasets import synth


def _digest(root) -> str:
    h = hashlib.sha256()
    for p in sorted(root.glob("class_*/*.jpg")):
        h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


def test_layout_determinism_and_idempotence(tmp_path):
    a = synth.make_dataset(tmp_path / "a", n=12, classes=3, width=64, height=48, seed=5, workers=2)
    b = synth.make_dataset(tmp_path / "b", n=12, classes=3, width=64, height=48, seed=5, workers=1)
    c = synth.make_dataset(tmp_path / "c", n=12, classes=3, width=64, height=48, seed=6, workers=1)
    files = sorted(p.relative_to(a).as_posix() for p in a.glob("class_*/*.jpg"))
    assert len(files) == 12 and files[0] == "class_000/000000.jpg" and "class_002/000011.jpg" in files
    assert _digest(a) == _digest(b) != _digest(c)
    assert json.loads((a / synth.MARKER).read_text())["seed"] == 5
    mtime = (a / "class_000/000000.jpg").stat().st_mtime_ns
    synth.make_dataset(a, n=12, classes=3, width=64, height=48, seed=5)  # same parameters: nothing rewritten
    assert (a / "class_000/000000.jpg").stat().st_mtime_ns == mtime


def test_refuses_other_parameters_or_foreign_directory(tmp_path):
    synth.make_dataset(tmp_path / "a", n=4, classes=2, width=32, height=32, workers=1)
    with pytest.raises(FileExistsError, match="other parameters"):
        synth.make_dataset(tmp_path / "a", n=5, classes=2, width=32, height=32, workers=1)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a coordl synthetic dataset"):
        synth.make_dataset(tmp_path / "b", n=4, classes=2, workers=1)
    with pytest.raises(ValueError, match="positive"):
        synth.make_dataset(tmp_path / "c", n=0, classes=2)


def test_jpeg_size_is_realistic():
    sizes = [
        len(simplejpeg.encode_jpeg(synth.make_image(i, 10), quality=90, colorsubsampling="420"))
        for i in range(4)
    ]
    assert all(75_000 <= s <= 115_000 for s in sizes), sizes


def test_classes_are_learnable_by_nearest_centroid():
    """A trivial classifier on 8x8 thumbnails beats chance by far: the images carry class signal."""
    classes, per_class = 5, 6

    def features(i: int) -> np.ndarray:
        img = synth.make_image(i, classes, width=96, height=72, seed=1).astype(np.float32)
        return img.reshape(8, 9, 12, 8, 3).mean(axis=(1, 3)).ravel()  # 8x8 colour thumbnail

    train = {
        c: np.mean([features(c + classes * k) for k in range(per_class)], axis=0) for c in range(classes)
    }
    test_ids = range(classes * per_class, classes * (per_class + 4))
    correct = sum(
        min(train, key=lambda c, f=features(i): np.linalg.norm(f - train[c])) == i % classes for i in test_ids
    )
    assert correct / len(test_ids) >= 0.6  # chance is 0.2


def test_cli(tmp_path, capsys):
    rc = cli_main(
        ["synth", str(tmp_path / "d"), "--n", "6", "--classes", "2", "--size", "40x30", "--seed", "1"]
    )
    assert rc == 0
    assert "6 images in 2 classes" in capsys.readouterr().out
    assert len(list((tmp_path / "d").glob("class_*/*.jpg"))) == 6
    with pytest.raises(SystemExit):
        cli_main(["synth", str(tmp_path / "e"), "--size", "big"])


def test_demo_runs_on_a_synthetic_dataset(tmp_path, capsys, monkeypatch):
    """`coordl demo` end to end on a tiny dataset: both loaders, coordl's cache at 50% from epoch 2, progress."""
    from coordl import demo
    from nfs_cache.progress import Progress

    monkeypatch.setitem(Progress.__init__.__kwdefaults__, "interval_s", 0.0)  # a line per batch
    results = demo.run_demo(
        tmp_path / "demo", n=24, storage_mb_s=500.0, workers=0, batch_size=8, epochs=2, progress=True
    )
    err = capsys.readouterr().err
    assert "\r" not in err
    for name in ("torch.utils.data.DataLoader", "coordl.DataLoader, cache 50%"):
        for epoch in (1, 2):
            assert f"{name}, epoch {epoch}/2: 24/24 samples (100%)" in err, err
    meta = results.pop("_meta")
    assert meta["n"] == 24
    coordl_run = results["coordl, cache 50%"]
    assert [round(e["hit_ratio"], 1) for e in coordl_run["epochs"]] == [0.0, 0.5]
    assert coordl_run["epochs"][1]["storage_bytes_read"] < meta["dataset_bytes"] * 0.6
    assert all(r > 0 for res in results.values() for r in res["rates"])


def test_cli_progress_is_plain_lines_off_a_terminal(tmp_path, capsys, monkeypatch):
    """Off a terminal (as under pytest), progress is lines a log can hold: no carriage-return bars."""
    from nfs_cache.progress import Progress

    monkeypatch.setitem(Progress.__init__.__kwdefaults__, "interval_s", 0.0)  # a line per update
    assert cli_main(["synth", str(tmp_path / "d"), "--n", "8", "--classes", "2", "--size", "32x24",
                     "--workers", "1"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert "\r" not in captured.err
    lines = [line for line in captured.err.splitlines() if line.startswith("synthesising 8 images in ")]
    assert lines and lines[-1].split(": ")[1].startswith("8/8 images (100%)")
    assert "8 images in 2 classes" in captured.out
