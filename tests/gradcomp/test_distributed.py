"""Multi-process gloo checks at world sizes 2, 3 and 4 (3 catches power-of-two assumptions in gTop-k)."""

from __future__ import annotations

import pytest

from tests.gradcomp import checks
from tests.gradcomp.dist_util import run_ranks


@pytest.mark.parametrize(
    "world", [pytest.param(2, marks=pytest.mark.slow), 3, pytest.param(4, marks=pytest.mark.slow)]
)
def test_all_methods_lossless_gtopk_hooks_plan_pto(world: int) -> None:
    run_ranks(checks.all_checks, world)


@pytest.mark.slow
def test_top1_percent_with_error_feedback_matches_dense_accuracy() -> None:
    run_ranks(checks.topk_ef_accuracy_close_to_dense, 2)
