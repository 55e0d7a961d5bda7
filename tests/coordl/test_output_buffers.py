"""Transforms writing samples straight into their batch row: same batches as torch, whatever they return."""

from __future__ import annotations

import pytest
import torch

import coordl
from coordl.prep.transforms import train_transform
from coordl.ring import output_buffers
from coordl.ring.output_buffers import lend, new_output
from tests.coordl.ldr_sources import MemorySource
from tests.coordl.ldr_sources import TorchReference as Reference


def test_new_output_is_a_fresh_tensor_outside_a_batch() -> None:
    a, b = new_output((2, 3)), new_output((2, 3), torch.int16)
    assert a.shape == (2, 3) and a.dtype == torch.float32 and b.dtype == torch.int16
    assert a.data_ptr() != b.data_ptr()


def test_lend_asks_first_and_restores_the_outer_lender() -> None:
    row = torch.zeros(4)
    with lend(lambda shape, dtype: row if shape == (4,) else None):
        assert new_output((4,)) is row
        assert new_output((5,)) is not row  # the lender declines: a new tensor
        with lend(None):
            assert new_output((4,)) is not row
        assert new_output((4,)) is row
    assert new_output((4,)) is not row
    assert getattr(output_buffers._local, "take", None) is None


class OutputSource(MemorySource):
    """Samples made through ``new_output`` and then returned in the way ``how`` says."""

    def __init__(self, n: int, how: str) -> None:
        super().__init__(n)
        self.how = how

    def prep(self, raw: bytes, index: int):
        a = new_output((3, 3))
        torch.mul(torch.arange(9.0).reshape(3, 3), 1.0, out=a).add_(index)
        if self.how == "as is":
            return a, index
        if self.how == "kept going":  # a stage after the lent one makes a new tensor
            return a * 2, index
        if self.how == "transposed":  # same shape, other strides: a view of the lent row
            return a.t(), index
        b = new_output((3, 3))
        torch.mul(a, -1.0, out=b)
        if self.how == "swapped":  # two leaves of one shape, each returned where the other's row is
            return b, a, index
        if self.how == "key order mid-batch":  # item 6's dict no longer fits: plain samples from there
            return {"b": b, "a": a} if index == 6 else {"a": a, "b": b}
        raise ValueError(self.how)


def _leaves(batch) -> list[torch.Tensor]:
    """The batch's tensors, cloned (a dict's in key order)."""
    items = batch.values() if isinstance(batch, dict) else batch
    return [t.clone() for t in items]


@pytest.mark.parametrize("how", ["as is", "kept going", "transposed", "swapped", "key order mid-batch"])
def test_samples_returned_any_way_give_torchs_batches(how: str) -> None:
    src = OutputSource(24, how)
    kw = dict(batch_size=4, num_workers=2, persistent_workers=True)
    theirs = [_leaves(b) for b in torch.utils.data.DataLoader(Reference(src), **kw)]
    with coordl.DataLoader(src, **kw) as ours:
        for _ in range(2):
            got = [_leaves(b) for b in ours]  # each batch checked after later ones reused slots
            assert len(got) == len(theirs)
            for a, b in zip(got, theirs, strict=True):
                assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        s = ours.stats()
    assert s["ring_stacked"] > 0
    # Each batch's first sample lays out the slot; only later ones can be made in place.
    made_in_place = how in ("as is", "key order mid-batch")  # the odd batch is not stacked at all
    assert s["ring_in_place"] == (s["ring_stacked"] * 3 if made_in_place else 0)


def test_imagefolder_batches_are_made_in_place_and_match_torch(tmp_path) -> None:
    from coordl.datasets import synth

    root = synth.make_dataset(tmp_path / "ds", n=40, classes=2, width=64, height=48)
    tf = train_transform(32, 40)
    ds = coordl.ImageFolder(str(root), tf)
    kw = dict(batch_size=8, num_workers=2, persistent_workers=True)
    torch.manual_seed(3)
    theirs = [(x.clone(), y.clone()) for x, y in torch.utils.data.DataLoader(ds, **kw)]
    torch.manual_seed(3)
    with coordl.DataLoader(ds, **kw) as ours:
        got = list(ours)
        s = ours.stats()
    for (x, y), (u, v) in zip(got, theirs, strict=True):
        assert torch.equal(x, u) and torch.equal(y, v)
    assert s["ring_in_place"] == s["ring_stacked"] * 7 > 0
