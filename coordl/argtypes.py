"""argparse types shared by coordl's sub-commands: each refuses a bad value with a message naming it."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["int_between", "nonnegative_int", "positive_float", "positive_int"]


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (``--n``, ``--epochs``...)."""
    return int_between(1, None)(text)


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0 (``--workers`` where 0 means the main process)."""
    return int_between(0, None)(text)


def int_between(low: int, high: int | None) -> Callable[[str], int]:
    """argparse type: an integer in ``low..high`` (``high`` None: no upper bound)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (a bandwidth, a size in GB)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value
