"""Applying a fix's change inside the unmodified training script, through the import hook.

``dsanalyzer fix`` runs the script with one :class:`Change` in its environment (``DSANALYZER_APPLY``,
JSON); the hook (:mod:`dsanalyzer.intercept`) installs it with :func:`install` and calls
:func:`on_torch` when ``import torch`` completes and :func:`patch_construction` on each loader class it
patches. What a change can set, all of it before the script's loop runs:

* ``torch_threads``: the main process's intra-op threads, set when torch is imported; the script's own
  later ``torch.set_num_threads`` calls in the main process are then ignored (loader workers keep
  theirs: torch sets one thread in each);
* ``loader_args``: keyword arguments of the loader built at ``site`` (the script's file and line, from
  the profile: :mod:`~dsanalyzer.measure.callsite`), replacing the script's own (``num_workers``,
  ``prefetch_factor``, and coordl's ``cache_bytes``, ``fetch_ahead``, ``sample_cache`` (given as
  ``"memcache.LocalStore(N)"``: a new store of N bytes per run) for a coordl loader);
* ``switch_to="coordl.DataLoader"``: at that line, ``coordl.DataLoader`` is built where the script
  builds ``torch.utils.data.DataLoader``, with the script's arguments and ``loader_args`` (torch's
  ``DataLoader.__new__`` returns coordl's loader, a subclass, which is built once).

Other loaders (a validation loader built at another line) keep their arguments.
"""

from __future__ import annotations

import inspect
import json
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import wraps
from typing import Any

from dsanalyzer.measure import callsite

__all__ = ["Change", "ENV_APPLY", "install", "on_torch", "patch_construction", "applied"]

ENV_APPLY = "DSANALYZER_APPLY"


@dataclass(frozen=True)
class Change:
    """One configuration to run the script with (empty: the script as written)."""

    torch_threads: int | None = None
    loader_args: dict = field(default_factory=dict)
    switch_to: str = ""  # "coordl.DataLoader": built where the script builds torch's loader
    site: dict | None = None  # {"file", "line"} of the loader call; None: every loader the script builds

    def to_env(self) -> dict[str, str]:
        return {ENV_APPLY: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Change | None:
        text = (os.environ if env is None else env).get(ENV_APPLY)
        if not text:
            return None
        try:
            change = cls(**json.loads(text))
        except (ValueError, TypeError) as e:
            raise ValueError(f"{ENV_APPLY} is not a change dsanalyzer wrote: {e}") from None
        if change.switch_to not in ("", "coordl.DataLoader"):
            raise ValueError(f"{ENV_APPLY}: switch_to must be coordl.DataLoader, got {change.switch_to!r}")
        return change

    def matches(self, site: dict | None) -> bool:
        """Whether a loader built at ``site`` is the one to change."""
        if self.site is None:
            return True
        return (
            site is not None
            and site["file"] == self.site.get("file")
            and site["line"] == self.site.get("line")
        )


class _State:
    """The installed change and what it did (``applied``), with the construction depth (coordl's loader
    builds torch's inside it: only the outermost construction is the script's)."""

    def __init__(self, change: Change | None) -> None:
        self.change = change
        self.depth = 0
        self.built: set[int] = set()  # loaders __new__ built whole: their second __init__ is skipped
        self.applied: list[dict] = []
        self.pid = os.getpid()


_STATE = _State(None)


def install(change: Change | None) -> None:
    """Make ``change`` the one applied from now on (None: record loader sites only)."""
    global _STATE
    _STATE = _State(change)


def applied() -> list[dict]:
    """What the installed change did so far: ``{"what", "site", ...}`` per application."""
    return list(_STATE.applied)


def on_torch(torch_module: Any) -> None:
    """Set the main process's intra-op threads, and keep them, when the change asks for a count."""
    n = _STATE.change.torch_threads if _STATE.change is not None else None
    original = getattr(torch_module, "set_num_threads", None)
    if n is None or original is None or getattr(original, "_dsanalyzer_applied", False):
        return
    original(int(n))
    _STATE.applied.append({"what": "torch_threads", "torch_threads": int(n)})

    def set_num_threads(k: int) -> None:
        if os.getpid() == _STATE.pid:  # the fix's count stands in the main process
            _STATE.applied.append({"what": "ignored set_num_threads", "asked": int(k)})
            return None
        return original(k)

    set_num_threads._dsanalyzer_applied = True  # type: ignore[attr-defined]
    torch_module.set_num_threads = set_num_threads


_STORE = re.compile(r"memcache\.LocalStore\((\d+)\)")


def _values(changes: dict) -> dict:
    """``changes`` with the sample cache's source text (``memcache.LocalStore(N)``) made a store: a new one
    per run (named for this process; the last process to leave removes it)."""
    out = dict(changes)
    text = out.get("sample_cache")
    if isinstance(text, str):
        match = _STORE.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"{ENV_APPLY}: sample_cache must be memcache.LocalStore(BYTES), got {text!r}")
        import memcache

        size = max(int(match.group(1)), 1 << 20)  # the least a LocalStore takes
        out["sample_cache"] = memcache.LocalStore(size, name=f"dsanalyzer_fix_{os.getpid()}")
    return out


def _bind(init: Callable, self: Any, args: tuple, kwargs: dict, changes: dict) -> tuple[tuple, dict]:
    """The call's arguments with ``changes`` in place (by name, whatever the script passed by position)."""
    bound = inspect.signature(init).bind(self, *args, **kwargs)
    bound.arguments.update(_values(changes))
    if int(bound.arguments.get("num_workers") or 0) == 0:  # torch refuses these without workers
        bound.arguments.pop("prefetch_factor", None)
        if "persistent_workers" in bound.arguments:
            bound.arguments["persistent_workers"] = False
    return bound.args, bound.kwargs


def patch_construction(cls: type, torch_loader: bool) -> None:
    """Wrap ``cls.__init__`` (its own) to record where the script builds it and apply the change there;
    on torch's loader (``torch_loader``) also ``__new__``, which builds coordl's loader instead when
    the change switches it."""
    orig = cls.__dict__.get("__init__")
    if orig is None or getattr(orig, "_dsanalyzer_site", False):
        return

    @wraps(orig)  # frameworks read the loader's signature from __init__ (Lightning re-builds loaders)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        state = _STATE
        if id(self) in state.built:  # __new__ built it whole: type.__call__ asks again
            state.built.discard(id(self))
            return
        if state.depth == 0:
            site = callsite.caller_site(2)
            callsite.record(self, site)
            change = state.change
            if change is not None and change.loader_args and change.matches(site):
                args, kwargs = _bind(orig, self, args, kwargs, change.loader_args)
                state.applied.append({"what": "loader_args", "site": site, **change.loader_args})
                args = args[1:]  # bound.args starts with self
        state.depth += 1
        try:
            orig(self, *args, **kwargs)
        finally:
            state.depth -= 1

    __init__._dsanalyzer_site = True  # type: ignore[attr-defined]
    setattr(cls, "__init__", __init__)  # noqa: B010 (any loader class, patched in place)
    if torch_loader:
        _patch_new(cls)


def _patch_new(torch_cls: type) -> None:
    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        state = _STATE
        change = state.change
        if cls is torch_cls and state.depth == 0 and change is not None and change.switch_to:
            site = callsite.caller_site(2)
            if change.matches(site):
                from coordl import DataLoader  # the one loader a change switches to (Change.from_env)

                loader = DataLoader(*args, **kwargs)
                state.applied.append({"what": "switch_to", "site": site, "class": change.switch_to})
                state.built.add(id(loader))
                return loader
        return object.__new__(cls)

    torch_cls.__new__ = staticmethod(__new__)  # type: ignore[method-assign,assignment]
