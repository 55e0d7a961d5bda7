"""The compact path's pieces without a cluster: the tail split, and finishing a head's output."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import coordl
from coordl.datasets.synth import make_dataset
from coordl.prep import transforms as T
from coordl.remote.compact import Compact, compact_source, finish, finish_all, wire_bytes


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("jpegs"), n=6, classes=2, width=120, height=90, seed=3)


def _names(compose: T.Compose) -> list[str]:
    return [type(s).__name__ for s in compose]


def test_the_tail_is_the_deterministic_tensor_stages():
    head, tail = T.train_transform(64).split_tail()
    assert _names(head) == ["Decode", "RandomResizedCrop", "RandomHorizontalFlip"]
    assert _names(tail) == ["ToTensor", "Normalize"]
    head, tail = T.eval_transform(64).split_tail()
    assert _names(tail) == ["ToTensor", "Normalize"] and "CenterCrop" in _names(head)
    # a user's callable at the end stops the tail: nothing after it is moved
    head, tail = T.Compose([T.Decode(), T.ToTensor(), lambda t: t * 2]).split_tail()
    assert len(tail) == 0 and len(head) == 3


@pytest.mark.parametrize("seed", range(8))
def test_finished_sample_is_bit_identical_to_the_whole_transform(folder, seed):
    ds = coordl.ImageFolder(folder, transform=T.train_transform(48))
    remote, tail = compact_source(ds)
    assert remote is not ds and ds.transform is not remote.transform  # the user's dataset is untouched
    raw = ds.fetch(seed % len(ds))
    torch.manual_seed(seed)
    whole = ds.prep(raw, seed % len(ds))
    torch.manual_seed(seed)
    sample = pickle.loads(pickle.dumps(remote.prep(raw, seed % len(ds))))  # as it crosses the network
    assert isinstance(sample[0], Compact) and sample[0].array.dtype == np.uint8
    assert wire_bytes(sample) == 48 * 48 * 3
    done = finish(sample, tail)
    assert torch.equal(done[0], whole[0]) and done[1] == whole[1]


def test_read_only_arrays_are_finished_without_a_warning(folder, recwarn):
    ds = coordl.ImageFolder(folder, transform=T.Compose([T.Decode(), T.CenterCrop(32), T.ToTensor()]))
    remote, tail = compact_source(ds)
    sample = remote.prep(ds.fetch(0), 0)
    sample[0].array.setflags(write=False)  # what Ray hands back
    (done,) = finish_all([sample], tail)
    assert done[0].dtype == torch.float32 and done[0].shape == (3, 32, 32)
    assert not [w for w in recwarn if "writable" in str(w.message)]


def test_sources_without_a_coordl_tail_are_sent_as_they_are(folder):
    assert compact_source(coordl.ImageFolder(folder, transform=lambda raw: raw)) is None
    assert compact_source(coordl.ImageFolder(folder, transform=T.Compose([T.ToTensor()]))) is None
    assert compact_source(coordl.ImageFolder(folder)) is None  # decode only: already the compact array
    assert compact_source(object()) is None


def _compact_batch(folder, transform, n=5):
    ds = coordl.ImageFolder(folder, transform=transform)
    remote, tail = compact_source(ds)
    torch.manual_seed(0)
    return [remote.prep(ds.fetch(i), i) for i in range(n)], tail


def test_default_collate_gets_rows_written_in_place(folder, monkeypatch):
    from torch.utils.data import default_collate

    from coordl.remote import compact

    samples, tail = _compact_batch(folder, T.train_transform(40))
    expected = default_collate(finish_all(samples, tail))
    copies = []
    monkeypatch.setattr(
        torch.Tensor, "copy_", lambda self, src, *a, **k: copies.append(1) or self, raising=True
    )
    batch = compact.collate_finished(samples, tail, default_collate)
    monkeypatch.undo()
    assert (
        isinstance(batch, list) and torch.equal(batch[0], expected[0]) and torch.equal(batch[1], expected[1])
    )
    assert not copies  # every row was written by the tail itself, none copied in


def test_a_dict_sample_and_a_user_collate(folder):
    from torch.utils.data import default_collate

    from coordl.remote import compact

    samples, tail = _compact_batch(folder, T.eval_transform(32))
    as_dicts = [{"image": s[0], "label": s[1]} for s in samples]
    batch = compact.collate_finished(as_dicts, tail, default_collate)
    assert batch["image"].shape == (5, 3, 32, 32) and batch["label"].tolist() == [s[1] for s in samples]
    mine = compact.collate_finished(samples, tail, lambda items: [x for x, _ in items])
    assert len(mine) == 5 and all(torch.equal(m, b) for m, b in zip(mine, batch["image"], strict=True))
