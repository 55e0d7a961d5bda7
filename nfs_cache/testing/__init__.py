"""Helpers for tests and benchmarks: a throw-away nfs-ganesha server."""
