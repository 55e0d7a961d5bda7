"""Tracked Future callbacks (``gradcomp.futures``): counted until torch releases them, awaited at exit."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from gradcomp import futures


@pytest.fixture
def world_of_one() -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_callback_counts_as_live_until_torch_releases_it() -> None:
    assert futures.wait_for_callbacks(1.0)
    fut: torch.futures.Future = torch.futures.Future()
    child = futures.then(fut, lambda f: f.value() + 1)
    assert futures.live_callbacks() == 1
    fut.set_result(torch.ones(2))
    assert torch.equal(child.wait(), torch.full((2,), 2.0))
    assert futures.wait_for_callbacks(1.0) and futures.live_callbacks() == 0


def test_wait_for_callbacks_blocks_until_another_thread_completes_the_future() -> None:
    fut: torch.futures.Future = torch.futures.Future()
    child = futures.then(fut, lambda f: f.value() * 2)
    assert not futures.wait_for_callbacks(0.05)  # nothing completed it yet
    threading.Thread(target=fut.set_result, args=(torch.ones(1),)).start()
    assert futures.wait_for_callbacks(5.0)
    assert float(child.wait()) == 2.0


def test_collective_callbacks_are_released_after_the_collective(world_of_one: None) -> None:
    x = torch.arange(4.0)
    work = dist.all_reduce(x, async_op=True)
    out = futures.then(futures.collect_all([work.get_future()]), lambda f: f.value()[0].value()[0] + 1)
    assert torch.equal(out.wait(), torch.arange(4.0) + 1)
    assert futures.wait_for_callbacks(5.0)


def test_a_failing_callback_is_released_too() -> None:
    fut: torch.futures.Future = torch.futures.Future()

    def boom(_: torch.futures.Future) -> None:
        raise ValueError("boom")

    child = futures.then(fut, boom)
    fut.set_result(None)
    with pytest.raises(RuntimeError, match="boom"):
        child.wait()
    assert futures.wait_for_callbacks(1.0)
