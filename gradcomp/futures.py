"""Python callbacks on torch Futures that cannot abort the interpreter's exit.

Why this exists. A process that used ``gradcomp.register`` occasionally died at exit with "terminate called
without an active exception" (SIGABRT, about 1 exit in 60 on a loaded 2-core machine). A core dump shows the
mechanism: the last bucket's collective completes on a gloo worker thread, which runs our ``Future.then``
callbacks, and DDP's main thread is released as soon as the last one has *run*. The worker thread then releases
the callbacks, and each release takes the GIL (torch's ``PythonFunctionGuard``); so does dropping the last
reference to a future whose value is a Python object. If the main thread has meanwhile begun finalising the
interpreter, taking the GIL makes Python 3.11 end the worker thread with ``pthread_exit``, whose forced unwind
meets a ``noexcept`` destructor: ``std::terminate``.

The fix, in two parts:

- every Python callable handed to ``Future.then`` goes through ``then`` below, which counts it as live until the
  worker thread has released it (its ``__del__`` runs inside that release, with the GIL);
- the futures, and the tensors their collectives use, are also referenced from here, so a worker thread never
  drops the last reference to one (freeing a future's Python value or a tensor's Python object takes the GIL
  too); they are let go on the main thread, once every callback has been released.

An ``atexit`` handler (registered with the first callback) waits, GIL released, until no callback is live; ``atexit``
handlers run before finalisation begins, so the worker threads can still take the GIL while it waits. It then
leaks the references it holds instead of dropping them: a callback counts as released while the worker thread is
still tearing down the rest of that callback's closure (a core dump showed the child future, captured next to the
callback, freed there a moment later), so dropping them at exit could hand the worker thread the last reference
during finalisation again. The leaked objects are the last step's futures and buffers, and the process is ending.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["then", "collect_all", "wait_for_callbacks", "live_callbacks"]

#: How long the exit handler waits for worker threads to release callbacks. They need microseconds once the
#: collective is done; the bound keeps a collective that never completes (a dead peer, Ctrl-C during a step) from
#: turning exit into a hang.
EXIT_WAIT_S = 5.0


class _Registry:
    """Live callback count and the futures kept alive on the main thread's side."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._live = 0
        self._held: list[torch.futures.Future] = []
        self._exit_hooked = False

    def track(self, fn: Callable[[Any], Any], futures: Iterable[torch.futures.Future]) -> _Tracked:
        with self._cond:
            if not self._exit_hooked:
                atexit.register(_at_exit)
                self._exit_hooked = True
            if self._live == 0:
                # Every earlier callback has been released, so no worker thread holds these any more: drop them
                # here, on a thread that may take the GIL at any time.
                self._held.clear()
            self._held.extend(futures)
            self._live += 1
        return _Tracked(fn, self)

    def hold(self, futures: Iterable[torch.futures.Future]) -> None:
        with self._cond:
            self._held.extend(futures)

    def released(self) -> None:
        with self._cond:
            self._live -= 1
            if self._live == 0:
                self._cond.notify_all()

    def drain(self, timeout_s: float, keep_held: bool = False) -> bool:
        with self._cond:
            done = self._cond.wait_for(lambda: self._live == 0, timeout=timeout_s)
            if keep_held:
                # One extra reference that nothing gives back: see the module docstring.
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(self._held))
                self._held = []
            elif done:
                self._held.clear()
            return done

    def live(self) -> int:
        with self._cond:
            return self._live


class _Tracked:
    """Calls ``fn``; tells the registry when torch lets go of it (on a worker thread, holding the GIL)."""

    __slots__ = ("_fn", "_registry")

    def __init__(self, fn: Callable[[Any], Any], registry: _Registry) -> None:
        self._fn = fn
        self._registry = registry

    def __call__(self, fut: torch.futures.Future) -> Any:
        return self._fn(fut)

    def __del__(self) -> None:
        self._registry.released()


_REGISTRY = _Registry()


def then(
    fut: torch.futures.Future, fn: Callable[[torch.futures.Future], Any], keep: Iterable[object] = ()
) -> torch.futures.Future:
    """``fut.then(fn)``, with ``fn`` and both futures tracked as described in the module docstring.

    ``keep``: the Python tensors the collective behind ``fut`` reads or writes. The collective's work object holds
    them on the worker thread; while this side holds them too, its release there is plain reference counting
    (a tensor whose last reference dies on a worker thread takes the GIL to free its Python object).
    """
    child = fut.then(_REGISTRY.track(fn, (fut, *keep)))
    _REGISTRY.hold((child,))
    return child


def collect_all(futures: list[torch.futures.Future]) -> torch.futures.Future:
    """``torch.futures.collect_all``, with the input and output futures kept alive on the main thread's side."""
    out = torch.futures.collect_all(futures)
    _REGISTRY.hold([*futures, out])
    return out


def wait_for_callbacks(timeout_s: float = EXIT_WAIT_S) -> bool:
    """Block until worker threads have released every tracked callback; True if they did within the timeout."""
    return _REGISTRY.drain(timeout_s)


def _at_exit() -> None:
    _REGISTRY.drain(EXIT_WAIT_S, keep_held=True)


def live_callbacks() -> int:
    """Tracked callbacks not yet released (0 when every collective's follow-up work is over)."""
    return _REGISTRY.live()
