"""Shared pytest configuration: markers and skips that every test package relies on, and the order of the
parallel phase (the suite's longest tests start first)."""

from __future__ import annotations

import os
import resource
import shutil

import pytest


def _declared_timeout(item: pytest.Item, default_s: float) -> float:
    mark = item.get_closest_marker("timeout")
    if mark is None or not mark.args:
        return default_s
    try:
        return float(mark.args[0])
    except (TypeError, ValueError):
        return default_s


def long_tests_first(items: list[pytest.Item], workers: int, default_timeout_s: float) -> list[pytest.Item]:
    """The order for ``workers`` pytest-xdist workers under ``--dist worksteal``: each test that declares a
    timeout above the suite's default (the longest ones: the gpu-check dry run, the wheel, the soak, the stress
    runs) at the head of a worker's share, longest budget first, the other tests in their collected order.

    worksteal gives each worker an equal contiguous share of the collection at the start and lets an idle
    worker take the tail half of the longest queue, never its head: a long test placed at a head starts in the
    first minutes. In the collected order the longest tests are the last files (tests/scripts,
    tests/test_soak.py), so they started when the other workers had nothing left: a 4-minute test started last
    holds the phase 4 minutes after the rest is done."""
    if workers <= 1:
        return items
    long = [it for it in items if _declared_timeout(it, default_timeout_s) > default_timeout_s]
    if not long:
        return items
    long.sort(key=lambda it: -_declared_timeout(it, default_timeout_s))  # stable: collected order if equal
    chosen = set(map(id, long))
    rest = [it for it in items if id(it) not in chosen]
    out: list[pytest.Item] = []
    left = len(items)
    for w in range(workers):
        share = left // (workers - w)  # worksteal's split: what is left, evenly over the workers to serve
        head = long[w::workers]
        take = max(0, share - len(head))
        out += head + rest[:take]
        rest = rest[take:]
        left -= share
    return out + rest


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected: the order is of the tests that run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_cuda = False
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        pass
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        if "redis" in item.keywords and shutil.which("redis-server") is None:
            item.add_marker(pytest.mark.skip(reason="redis-server is not installed: run scripts/setup.sh"))
        if "netns" in item.keywords and (os.geteuid() != 0 or shutil.which("ip") is None):
            item.add_marker(pytest.mark.skip(reason="network namespaces need root and iproute2"))
    # an xdist worker's (each collects, and all must reach the same order); not the environment variable, which
    # a test's own pytest run (the gpu-check dry run's tests section) inherits
    worker_input = getattr(config, "workerinput", None)
    workers = int(worker_input["workercount"]) if worker_input else 1
    try:
        default_timeout_s = float(config.getini("timeout") or 0)  # pytest-timeout's (pyproject.toml: 300)
    except ValueError:  # pytest-timeout not installed: no test declares a longer budget that it would read
        return
    if default_timeout_s > 0:
        items[:] = long_tests_first(items, workers, default_timeout_s)


def _cpu_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """With ``COORDL_TEST_CPU=<file>``: one line per test appended to that file, ``cpu_s own_s children_s nodeid``
    (tab-separated): the CPU seconds of the test's setup, call and teardown in its pytest process and in the
    processes it started and waited for (loader workers, jobs, torchrun and its ranks; not daemons left to
    others, such as Ray's). On 2 cores a parallel phase takes at least its tests' CPU over 2: the numbers
    behind docs/testing.md "Where the time goes"."""
    out = os.environ.get("COORDL_TEST_CPU")
    if not out:
        yield
        return
    own, kids = _cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN)
    yield
    own, kids = _cpu_s(resource.RUSAGE_SELF) - own, _cpu_s(resource.RUSAGE_CHILDREN) - kids
    with open(out, "a") as f:  # one short line per write: the xdist workers' lines do not interleave
        f.write(f"{own + kids:.2f}\t{own:.2f}\t{kids:.2f}\t{item.nodeid}\n")
