"""Every gradcomp test in this process runs with fixed numerics: one thread, deterministic kernels, a seeded RNG.

Multi-process checks get the same settings in each rank (``dist_util``). The previous values are restored after
each test, so tests of other packages in the same pytest session are unaffected.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def fixed_numerics() -> Iterator[None]:
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    rng = torch.get_rng_state()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        torch.set_rng_state(rng)
