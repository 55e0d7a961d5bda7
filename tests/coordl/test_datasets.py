"""coordl.datasets.files: ImageFolder / FileListDataset protocol, the split, errors, and as_item_source."""

from __future__ import annotations

import pickle
import sys
import types

import numpy as np
import pytest
import torch
from PIL import Image

from coordl.datasets import synth
from coordl.datasets.adapt import OpaqueSource, TorchvisionStyleSource, as_item_source
from coordl.datasets.files import FileListDataset, ImageFolder
from coordl.datasets.source import has_split_prep, is_item_source
from coordl.errors import CorruptItemError
from coordl.prep import transforms as T


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return synth.make_dataset(
        tmp_path_factory.mktemp("ds") / "data", n=9, classes=3, width=96, height=72, workers=1
    )


def test_imagefolder_layout_and_fetch(root):
    ds = ImageFolder(root)
    assert len(ds) == 9 and ds.classes == ["class_000", "class_001", "class_002"]
    assert ds.class_to_idx["class_002"] == 2
    path, target = ds.samples[4]
    assert path == str(root / "class_001" / "000004.jpg") and target == 1
    assert ds.fetch(4) == (root / "class_001" / "000004.jpg").read_bytes()
    assert ds.describe(4) == path
    arr, t = ds.prep(ds.fetch(4), 4)  # default transform: decode only
    assert arr.shape == (72, 96, 3) and arr.dtype == np.uint8 and t == 1
    assert is_item_source(ds) and ds.stats() == {}


def test_split_prep_with_train_transform(root):
    ds = ImageFolder(root, transform=T.train_transform(32, recipe="resize_first"))
    assert has_split_prep(ds)
    raw = ds.fetch(0)
    det = ds.prep_deterministic(raw, 0)
    assert isinstance(det, np.ndarray) and det.dtype == np.uint8 and min(det.shape[:2]) == 37
    torch.manual_seed(0)
    a, ta = ds.prep_random(det, 0)
    torch.manual_seed(0)
    b, tb = ds.prep(raw, 0)
    assert torch.equal(a, b) and a.shape == (3, 32, 32) and ta == tb == 0
    assert "ResizeShorter(size=37)" in ds.prep_identity()
    assert ds.dataset_identity().startswith(f"imagefolder:{root}:")


def test_no_split_for_opaque_transform(root):
    ds = ImageFolder(root, transform=lambda raw: len(raw))
    assert is_item_source(ds) and not has_split_prep(ds)
    assert ds.prep(ds.fetch(0), 0)[0] == len(ds.fetch(0))
    with pytest.raises(AttributeError, match="no deterministic prefix"):
        ds.prep_deterministic  # noqa: B018


def test_dataset_identity_follows_file_list(root, tmp_path):
    other = synth.make_dataset(tmp_path / "other", n=8, classes=3, width=96, height=72, workers=1)
    assert ImageFolder(root).dataset_identity() == ImageFolder(root).dataset_identity()
    assert (
        ImageFolder(root).dataset_identity().split(":")[-1]
        != ImageFolder(other).dataset_identity().split(":")[-1]
    )


def test_corrupt_file_names_path_and_index(root, tmp_path):
    bad = tmp_path / "bad" / "cls"
    bad.mkdir(parents=True)
    (bad / "broken.jpg").write_bytes((root / "class_000" / "000000.jpg").read_bytes()[:200])
    ds = ImageFolder(tmp_path / "bad", transform=T.train_transform(16))
    for call in (lambda: ds.prep(ds.fetch(0), 0), lambda: ds.prep_deterministic(ds.fetch(0), 0)):
        with pytest.raises(CorruptItemError) as info:
            call()
        assert info.value.path == str(bad / "broken.jpg") and info.value.index == 0
        assert "broken.jpg" in str(info.value)
        again = pickle.loads(pickle.dumps(info.value))
        assert again.path == info.value.path and again.index == 0


def test_empty_or_missing_root(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        ImageFolder(tmp_path / "nope")
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no files"):
        ImageFolder(tmp_path / "empty")


def test_file_list_dataset(root):
    paths = sorted(root.glob("class_*/*.jpg"))[:3]
    ds = FileListDataset(paths, targets=[7, 8, 9], transform=T.eval_transform(16))
    sample, target = ds[1]
    assert sample.shape == (3, 16, 16) and target == 8 and has_split_prep(ds)
    unlabelled = FileListDataset(paths, transform=T.eval_transform(16))
    assert unlabelled.prep(unlabelled.fetch(0), 0).shape == (3, 16, 16)
    assert unlabelled.prep_random(unlabelled.prep_deterministic(unlabelled.fetch(0), 0), 0).shape == (
        3,
        16,
        16,
    )
    assert ds.dataset_identity() != FileListDataset(paths[:2], targets=[7, 8]).dataset_identity()
    with pytest.raises(ValueError, match="3 paths but 2 targets"):
        FileListDataset(paths, targets=[1, 2])


def test_torch_dataloader_with_workers(root):
    ds = ImageFolder(root, transform=T.train_transform(32))
    loader = torch.utils.data.DataLoader(pickle.loads(pickle.dumps(ds)), batch_size=4, num_workers=2)
    batches = list(loader)
    assert sum(len(b[1]) for b in batches) == 9 and batches[0][0].shape == (4, 3, 32, 32)


# --- as_item_source ---------------------------------------------------------------------------


def _torchvision_like(root, loader, transform=None):
    class FakeTorchvisionFolder:
        def __init__(self):
            self.samples = [(str(p), int(p.parent.name[-1])) for p in sorted(root.glob("class_*/*.jpg"))]
            self.loader = loader
            self.transform = transform
            self.target_transform = lambda t: t + 100

        def __len__(self):
            return len(self.samples)

        def __getitem__(self, i):
            raise AssertionError("the adapter must not call __getitem__")

    return FakeTorchvisionFolder()


def test_as_item_source_passes_protocol_objects_through(root):
    ds = ImageFolder(root)
    assert as_item_source(ds) is ds


def test_torchvision_default_loader_uses_fast_decode(root):
    def pil_loader(path):
        raise AssertionError("the fast path must not call the user's loader")

    pil_loader.__module__ = "torchvision.datasets.folder"
    src = as_item_source(_torchvision_like(root, pil_loader, transform=lambda img: np.asarray(img).shape))
    assert isinstance(src, TorchvisionStyleSource)
    assert src.prep(src.fetch(3), 3) == ((72, 96, 3), 101)


def test_custom_loaders_get_bytes_without_rereading(root, monkeypatch):
    seen = []

    def image_open_loader(path):  # Image.open accepts a file object
        seen.append(type(path).__name__)
        return Image.open(path).convert("L")

    src = as_item_source(_torchvision_like(root, image_open_loader, transform=lambda img: img.size))
    assert src.prep(src.fetch(0), 0) == ((96, 72), 100) and seen == ["BytesIO"]

    def builtin_open_loader(path):  # needs a real path: falls back to a temp file
        with open(path, "rb") as f:
            return f.read()

    src = as_item_source(_torchvision_like(root, builtin_open_loader))
    raw = src.fetch(1)
    assert src.prep(raw, 1) == (raw, 100)
    assert src.prep(raw, 1) == (raw, 100)  # the chosen mode sticks


def test_custom_loader_corrupt_bytes(root):
    src = as_item_source(_torchvision_like(root, lambda p: Image.open(p).convert("RGB")))
    with pytest.raises(CorruptItemError) as info:
        src.prep(b"garbage", 3)
    assert info.value.index == 3 and info.value.path.endswith(".jpg")


def test_opaque_map_style_dataset_warns():
    class Squares:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i * i

    with pytest.warns(UserWarning, match="cache_bytes has no effect"):
        src = as_item_source(Squares())
    assert isinstance(src, OpaqueSource) and src.opaque is True
    assert src.fetch(3) == b"" and src.prep(src.fetch(3), 3) == 9 and len(src) == 4


def test_iterable_dataset_is_refused():
    with pytest.raises(TypeError, match="needs __len__"):
        as_item_source(iter([1, 2, 3]))


def test_staged_root_reads_through_staged_source(root, tmp_path, monkeypatch):
    """The nfs_cache branch: listing and reads go through StagedSource, stats() reports its counters."""
    calls = []

    class FakeStaged:
        def __init__(self, src, stage_dir, *, budget_bytes=None, prefetch=False, counters=None):
            calls.append((src, stage_dir, budget_bytes, prefetch))

        def list_files(self):
            return sorted(p.relative_to(root).as_posix() for p in root.glob("class_*/*.jpg"))

        def read(self, relpath):
            return (root / relpath).read_bytes()

        def describe(self, relpath):
            return f"nfs://server/export/{relpath}"

        def stats(self):
            return {"staged_items": 1, "staged_bytes": 2, "remote_bytes_read": 3}

    fake = types.ModuleType("nfs_cache")
    fake.StagedSource = FakeStaged
    monkeypatch.setitem(sys.modules, "nfs_cache", fake)
    ds = ImageFolder(
        "nfs://server/export", stage_dir=tmp_path / "stage", stage_budget_bytes=10, prefetch=True
    )
    assert calls == [("nfs://server/export", str(tmp_path / "stage"), 10, True)]
    assert len(ds) == 9 and ds.classes == ["class_000", "class_001", "class_002"]
    assert ds.fetch(0) == (root / "class_000" / "000000.jpg").read_bytes()
    assert ds.describe(0) == "nfs://server/export/class_000/000000.jpg"
    assert ds.stats()["remote_bytes_read"] == 3
    with pytest.raises(ValueError, match="needs stage_dir"):
        ImageFolder("nfs://server/export")


@pytest.mark.parametrize("num_workers", [0, 1])
def test_corrupt_item_message_names_its_file_once(tmp_path, num_workers):
    """One readable line: the path once, no '<_io.BytesIO object at 0x...>', path and index kept."""
    import coordl

    bad = tmp_path / "c0" / "bad.jpg"
    bad.parent.mkdir()
    bad.write_bytes(b"this is not an image at all")
    ds = coordl.ImageFolder(tmp_path, transform=coordl.transforms.eval_transform(16, resize=18))
    with pytest.raises(coordl.CorruptItemError) as err:
        for _ in coordl.DataLoader(ds, batch_size=1, num_workers=num_workers):
            pass
    message = str(err.value)
    assert message.count(str(bad)) == 1, message
    assert "BytesIO" not in message and "Traceback" not in message and "\n" not in message
    assert "first bytes 74 68 69 73" in message  # b"this"
    assert err.value.path == str(bad)
    if num_workers:
        assert message.endswith("(in DataLoader worker process 0)")
        assert "Traceback" in err.value.worker_traceback  # still there for a bug report


class _ReportsInput(T.Decode):
    """Decode that also reports what it was given: a view of a cache row, or bytes."""

    def __call__(self, raw):
        return np.array([isinstance(raw, memoryview), isinstance(raw, bytes)])


def _given(loader) -> set[tuple[bool, bool]]:
    return {tuple(map(bool, row)) for images, _labels in loader for row in images}


@pytest.mark.parametrize("persistent", [False, True])
def test_cached_items_reach_a_decode_first_transform_as_views_and_any_other_as_bytes(root, persistent):
    """coordl's Decode reads any buffer, so a cache hit is prepped from its row without a copy into
    bytes; a transform that does not say so (a user's function) keeps getting bytes."""
    import coordl

    kw = dict(batch_size=3, num_workers=2, cache_bytes=1 << 22, persistent_workers=persistent)
    with coordl.DataLoader(ImageFolder(root, T.Compose([_ReportsInput()])), **kw) as dl:
        assert _given(dl) == {(False, True)}  # epoch 1: read from storage, bytes
        assert _given(dl) == {(True, False)}  # epoch 2: every item a cache hit, its row's view
        assert dl.stats()["cache_hits"] == 9
    user = T.Compose([lambda raw: np.array([isinstance(raw, memoryview), isinstance(raw, bytes)])])
    assert not user.reads_buffers and not T.Compose([]).reads_buffers
    with coordl.DataLoader(ImageFolder(root, user), **kw) as dl:
        assert _given(dl) == {(False, True)} and _given(dl) == {(False, True)}


def test_a_view_and_bytes_of_an_image_prep_to_the_same_sample(root):
    ds = ImageFolder(root, T.train_transform(32))
    raw = ds.fetch(4)
    assert ds.prep_reads_buffers and T.train_transform(32, recipe="resize_first").reads_buffers
    torch.manual_seed(3)
    a, ta = ds.prep(memoryview(raw).toreadonly(), 4)
    torch.manual_seed(3)
    b, tb = ds.prep(raw, 4)
    assert torch.equal(a, b) and ta == tb == 1
