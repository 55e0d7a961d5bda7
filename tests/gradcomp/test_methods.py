"""The method table: every public name builds its (compressor, communicator) pair, and a new method is one class.

Runs as a gloo world of one inside the test process (an in-process store, no port); the group is destroyed after.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

import gradcomp
from gradcomp.communicators import AllGather, AllReduce, GTopK, HierarchicalTopK
from gradcomp.compressors import QSGD, Compressor, Context, TopK
from gradcomp.memory import NoMemory, ResidualMemory
from gradcomp.methods import METHODS, NAMES, Method, build_communicator


@pytest.fixture
def world_of_one() -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_public_names_are_kept() -> None:
    documented = [
        "none",
        "fp16",
        "bf16",
        "topk",
        "mstopk",
        "randomk",
        "qsgd",
        "terngrad",
        "signsgd",
        "powersgd",
        "gtopk",
        "hitopk",
    ]
    assert list(NAMES) == documented


@pytest.mark.parametrize("name", NAMES)
def test_every_name_builds_its_pair(name: str, world_of_one: None) -> None:
    comm = build_communicator(name, 0.1, error_feedback=True, options={"local_size": 1})
    assert type(comm) is METHODS[name].communicator
    assert type(comm.compressor) is METHODS[name].compressor
    assert isinstance(comm.memory, ResidualMemory)
    assert isinstance(
        build_communicator(name, 0.1, error_feedback=False, options={"local_size": 1}).memory, NoMemory
    )


def test_unknown_name_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="choose one of none, fp16"):
        build_communicator("zip")


def test_communicators_refuse_compressors_they_cannot_carry(world_of_one: None) -> None:
    with pytest.raises(TypeError, match="all-reduce"):
        AllReduce(QSGD(), NoMemory())
    with pytest.raises(TypeError, match="sparsifier"):
        GTopK(QSGD(), NoMemory())


class Int8Scaled(Compressor):
    """The example of docs/gradcomp.md: max|x| scale and int8 entries."""

    name = "int8"
    biased = True

    def compress(self, x: torch.Tensor, key: object = None) -> tuple[list[torch.Tensor], Context]:
        flat = x.reshape(-1).float()
        scale = flat.abs().max().clamp_min(1e-30) / 127
        return [scale.reshape(1), (flat / scale).round().to(torch.int8)], Context(
            x.numel(), x.dtype, x.device
        )

    def decompress(self, payload: list[torch.Tensor], ctx: Context) -> torch.Tensor:
        scale, q = payload
        return (q.float() * scale).to(ctx.dtype)


def test_a_new_method_is_one_class_and_one_table_line(
    world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(METHODS, "int8", Method(Int8Scaled, AllGather))
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(50, 4))
    state = gradcomp.register(model, compressor="int8", plan="always")
    assert isinstance(state.compressor, Int8Scaled) and state.hooked
    x = torch.randn(16, 50, generator=torch.Generator().manual_seed(1))
    model(x).square().sum().backward()
    dense = torch.nn.Linear(50, 4)
    dense.load_state_dict(model.module.state_dict())
    dense(x).square().sum().backward()
    # int8 scaled by the bucket's max|g|: each entry off by at most half a step; what was lost is the residual.
    step = max(float(q.grad.abs().max()) for q in dense.parameters()) / 127
    for p, q in zip(model.parameters(), dense.parameters(), strict=True):
        assert (p.grad - q.grad).abs().max() <= step / 2 + 1e-6
    residual = state.memory.residual((0, 0))  # AllGather keys part i of bucket b as (b, i)
    assert residual is not None and 0 < float(residual.abs().max()) <= step / 2 + 1e-6


def test_one_compressor_pairs_with_several_communicators() -> None:
    assert {m.communicator for m in METHODS.values() if m.compressor is TopK} == {
        AllGather,
        GTopK,
        HierarchicalTopK,
    }
