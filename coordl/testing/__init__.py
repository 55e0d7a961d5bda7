"""Test fixtures for coordl and its sibling packages: emulated multi-node networks (:mod:`coordl.testing.netns`)."""

from __future__ import annotations

from coordl.testing.netns import Host, VirtualNetwork, cleanup_stale, skip_reason

__all__ = ["Host", "VirtualNetwork", "cleanup_stale", "skip_reason"]
