"""The parallel phase's order (tests/conftest.py): tests that declare a long timeout head the workers' shares."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.conftest import long_tests_first


class _Item:
    def __init__(self, name: str, timeout_s: float | None = None) -> None:
        self.name = name
        self.mark = SimpleNamespace(args=(timeout_s,)) if timeout_s is not None else None

    def get_closest_marker(self, name: str) -> Any:
        return self.mark if name == "timeout" else None


def _shares(order: list[_Item], workers: int) -> list[list[str]]:
    """worksteal's first split: what is left, evenly over the workers still to serve, in order."""
    out, left, start = [], len(order), 0
    for w in range(workers):
        share = left // (workers - w)
        out.append([it.name for it in order[start : start + share]])
        start, left = start + share, left - share
    return out


def test_each_long_test_heads_a_share_longest_first_and_the_rest_keeps_its_order() -> None:
    items = [_Item(f"t{i}") for i in range(20)]
    items[5] = _Item("stress", 3000)
    items[17] = _Item("soak", 900)
    items[18] = _Item("wheel", 600)
    items[19] = _Item("plain", 120)  # a timeout below the default is not a long test
    order = long_tests_first(items, 4, 300)  # type: ignore[arg-type]
    assert sorted(it.name for it in order) == sorted(it.name for it in items)  # every test, once
    shares = _shares(order, 4)  # type: ignore[arg-type]
    assert [s[0] for s in shares] == ["stress", "soak", "wheel", "t13"]  # the fourth: no long test left
    rest = [it.name for it in order if it.name not in ("stress", "soak", "wheel")]
    assert rest == [it.name for it in items if it.name not in ("stress", "soak", "wheel")]


def test_more_long_tests_than_workers_go_round_the_heads() -> None:
    items = [_Item(f"t{i}") for i in range(10)] + [_Item(f"long{i}", 600) for i in range(3)]
    shares = _shares(long_tests_first(items, 2, 300), 2)  # type: ignore[arg-type]
    assert shares[0][:2] == ["long0", "long2"] and shares[1][0] == "long1"


def test_one_worker_or_no_long_test_keeps_the_collected_order() -> None:
    items = [_Item("a"), _Item("b", 900), _Item("c")]
    assert long_tests_first(items, 1, 300) is items  # type: ignore[arg-type]
    plain = [_Item("a"), _Item("b")]
    assert long_tests_first(plain, 4, 300) is plain  # type: ignore[arg-type]
