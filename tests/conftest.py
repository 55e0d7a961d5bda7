"""Shared pytest configuration: markers and skips that every test package relies on."""

from __future__ import annotations

import os
import shutil

import pytest


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
