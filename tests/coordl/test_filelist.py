"""coordl.datasets.filelist: the file list held flat, and the list views ImageFolder/FileListDataset hand out
(``items``, ``samples``, ``imgs``, ``targets``, ``paths``) read as the lists they used to be."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from coordl.datasets import synth
from coordl.datasets.filelist import FileList, Targets
from coordl.datasets.files import FileListDataset, ImageFolder
from shmem.strings import StringArray


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return synth.make_dataset(
        tmp_path_factory.mktemp("fl") / "data", n=9, classes=3, width=32, height=24, workers=1
    )


def _old_items(root) -> list[tuple[str, int]]:
    """What ImageFolder.items was: sorted relative paths with their class index."""
    rels = sorted(f"{p.parent.name}/{p.name}" for p in root.glob("class_*/*.jpg"))
    return [(r, int(r.split("/")[0][-1])) for r in rels]


def test_imagefolder_attributes_read_as_the_old_lists(root) -> None:
    ds = ImageFolder(root)
    want = _old_items(root)
    assert ds.items == want and want == ds.items and list(ds.items) == want
    assert ds.items[-1] == want[-1] and ds.items[2:5] == want[2:5] and isinstance(ds.items[2:5], list)
    assert all(type(p) is str and type(t) is int for p, t in ds.items)
    assert ds.targets == [t for _, t in want] and type(ds.targets[0]) is int
    assert np.asarray(ds.targets).tolist() == [t for _, t in want]
    samples = [(str(root / r), t) for r, t in want]
    assert ds.samples == samples and ds.imgs == samples and ds.samples[-1] == samples[-1]
    assert len(ds.samples) == len(ds.targets) == len(ds.items) == len(ds) == 9
    assert want[3] in ds.items and ds.items.index(want[3]) == 3
    with pytest.raises(IndexError):
        ds.items[9]
    assert "ItemView([('class_000/000000.jpg', 0)" in repr(ds.items)


def test_imagefolder_items_can_be_replaced_and_the_dataset_pickles_flat(root) -> None:
    ds = ImageFolder(root)
    identity = ds.dataset_identity()
    ds.items = ds.items[:4]  # a subset, as users (and gradcomp's train/eval split) do
    assert len(ds) == 4 and ds.fetch(3) == (root / ds.items[3][0]).read_bytes()
    assert ds.dataset_identity() != identity
    back = pickle.loads(pickle.dumps(ds))
    assert back.items == ds.items and back.targets == ds.targets and back.fetch(2) == ds.fetch(2)
    assert isinstance(back._file_list.names, StringArray) and back._file_list.targets.array is not None


def test_digest_is_the_one_the_list_of_pairs_had(root) -> None:
    """The dataset's identity keys caches: holding the list flat must not make every cache miss."""
    import hashlib

    want = _old_items(root)
    h = hashlib.sha256()
    for name, target in want:
        h.update(f"{name}\t{target}\n".encode())
    assert ImageFolder(root).dataset_identity() == f"imagefolder:{root}:{h.hexdigest()[:16]}"


def test_filelist_dataset_targets_of_any_type(root) -> None:
    paths = [str(root / r) for r, _ in _old_items(root)][:3]
    for targets, flat in (
        ([0, 1, 2], True),
        ([0.5, 1.5, 2.5], True),
        (["a", (1,), None], False),
        (None, False),
    ):
        ds = FileListDataset(paths, targets)
        assert ds.paths == paths and list(ds.paths) == paths and type(ds.paths[0]) is str
        want = list(targets) if targets is not None else [None] * 3
        assert ds.items == list(zip(paths, want, strict=True)) and ds.targets == want
        assert [type(t) for t in ds.targets] == [type(t) for t in want]
        assert (ds.targets.array is not None) == flat
        assert pickle.loads(pickle.dumps(ds)).items == ds.items
    labels = np.array([3, 1, 2], dtype=np.int16)  # a NumPy array: its scalars read back, as before
    ds = FileListDataset(paths, labels)
    assert ds.targets == [3, 1, 2] and type(ds.targets[0]) is np.int16 and ds.targets.array is not None
    assert type(pickle.loads(pickle.dumps(ds)).targets[2]) is np.int16
    big = [2**70, 1, 2]  # past int64: kept as Python ints
    assert FileListDataset(paths, big).targets == big


def test_filelist_checks_lengths_and_bools_stay_bools() -> None:
    with pytest.raises(ValueError, match="2 names but 1 targets"):
        FileList(["a", "b"], [0])
    t = Targets([True, False], 2)
    assert t == [True, False] and type(t[0]) is bool and t.array is None
    assert FileList.from_pairs([("a", 1), ("b", 2)]).view() == [("a", 1), ("b", 2)]
