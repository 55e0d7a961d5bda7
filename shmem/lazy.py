"""Lazy package exports: ``import pkg`` stays cheap, names load their module on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, namespace: dict[str, Any], table: dict[str, str], eager: list[str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """Module-level ``__getattr__``, ``__dir__`` and ``__all__`` for ``package``.

    Args:
        package: the package's name, for error messages.
        namespace: the package's ``globals()``; a loaded name is cached there.
        table: exported name -> module that defines it (a module exported under its own last name is
            returned as the module itself).
        eager: names the package imports itself, listed in ``__all__`` too.
    """
    names = sorted(set(table) | set(eager or []))

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        mod = importlib.import_module(module)
        value = mod if module.endswith("." + name) else getattr(mod, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__, names
