"""Profiling an unmodified training script from inside its own process.

``dsanalyzer profile -- python train.py ...`` puts ``dsanalyzer/_hook`` on ``PYTHONPATH``; its
``sitecustomize`` calls :func:`install_from_env`, which registers an import hook. When the script
imports ``torch.utils.data.dataloader`` (or ``coordl.dataloader``, ``coordl.dali.loader``), the hook
replaces the loader class's ``__iter__`` so that the first loader the script iterates is timed
(:class:`TimedIterator`) and prepared for the run named by ``DSANALYZER_MODE`` (see
:func:`dsanalyzer.jobs.prepare`). A DALI iterator (``nvidia.dali.plugin.pytorch.DALIGenericIterator``) is its
own iterator, so there the hook times ``__next__`` itself (:func:`patch_dali_iterator_class`). After
warm-up + N iterations it writes ``result-<pid>.json`` (plain JSON) into ``DSANALYZER_RESULT_DIR``
and ends the script with ``SystemExit(0)``; if the script ends first, an ``atexit`` handler writes
what was recorded.

A ``coordl.DataLoader`` is covered whether it subclasses torch's loader or wraps one: a re-entrancy
guard makes only the outermost loader timed (a ``coordl.dali.DALILoader`` that pulls from a DALI
iterator inside is timed as the DALILoader, once).
"""

from __future__ import annotations

import atexit
import importlib.abc
import os
import sys
import time
from collections.abc import Callable
from functools import partial, wraps
from typing import Any

from dsanalyzer.jobs import comm
from dsanalyzer.measure import apply, threads
from dsanalyzer.measure.hookconfig import ENV_MODE, HookConfig
from dsanalyzer.measure.online import OnlineTune
from dsanalyzer.measure.plan import MODES
from dsanalyzer.measure.recorder import RunComplete, RunRecorder
from dsanalyzer.measure.timeline import cuda_sync_or_none

__all__ = ["ProbeState", "TimedIterator", "install_from_env", "patch_loader_class",
           "patch_dali_iterator_class"]  # fmt: skip

# nvidia.dali.plugin.pytorch: where DALI 2.x defines DALIGenericIterator and its __next__
_TARGET_MODULES = ("torch", "torch.utils.data.dataloader", "coordl.dataloader", "coordl.dali.loader",
                   "nvidia.dali.plugin.pytorch", "torch.nn.parallel.distributed")  # fmt: skip
_LOADER_CLASSES = ("DataLoader", "DALILoader")


class ProbeState:
    """Which loader this process profiles, and getting it ready for the run; the recording is :attr:`recorder`'s.

    The first loader the script iterates becomes the profiled one (later loaders, and loaders that
    another profiled loader iterates inside itself, are passed through); at its first iterator the run
    is prepared by the loader's kind (:func:`dsanalyzer.jobs.prepare`), and every batch it yields
    goes through :meth:`timed_next` to the :class:`~dsanalyzer.measure.recorder.RunRecorder`.
    """

    def __init__(self, cfg: HookConfig) -> None:
        if cfg.mode not in MODES:
            raise ValueError(f"{ENV_MODE}={cfg.mode!r} is not one of {', '.join(MODES)}")
        self.cfg = cfg
        self.recorder = RunRecorder(cfg)
        self.comm = comm.CommLog()  # receives the trainer's collective timings (dsanalyzer.jobs.comm)
        self.loader: Any = None
        self.info: dict = {}
        self.done = False
        self.depth = 0
        self._replay: Any = None
        self.default_batch = 1
        # A DALI iterator has no __iter__ per epoch to mark a new epoch: its first batch is the first
        # __next__ after the previous epoch's StopIteration (the wait runs from that call).
        self._dali_epoch_ahead = True
        self.online = OnlineTune(cfg.tune_epochs) if cfg.tune_epochs else None  # fix --online

    # -- iterator creation -------------------------------------------------------------------
    def iter_for(self, loader: Any, orig_iter: Callable[[Any], Any]) -> Any:
        """Called by a patched ``__iter__``: the timed iterator for the profiled loader."""
        if self.depth > 0 or self.done or (self.loader is not None and loader is not self.loader):
            return orig_iter(loader)
        if self.online is not None and self.loader is not None and self.online.done():
            self.finish("tuned")  # the tuner tried what it would: the fix has its result
            sys.stderr.write("dsanalyzer: the loader's tuning is done, stopping the script\n")
            raise SystemExit(0)
        self.depth += 1
        try:
            if self.loader is None:
                self._first_iter(loader, orig_iter)
            opened = time.perf_counter()
            if self.cfg.mode == "compute":
                inner = self._replay
            else:
                inner = orig_iter(loader)
            self.recorder.timeline.iterator_opened(opened)
        finally:
            self.depth -= 1
        return TimedIterator(inner, self)

    def next_for(self, it: Any, orig_next: Callable[[Any], Any]) -> Any:
        """Called by a patched DALI iterator's ``__next__``: the next batch, timed when ``it`` is profiled."""
        if self.depth > 0 or self.done or (self.loader is not None and it is not self.loader):
            return orig_next(it)
        if self.loader is None:
            self.depth += 1
            try:
                self._first_iter(it, lambda loader: loader)  # a DALI iterator is its own iterator
            finally:
                self.depth -= 1
        replay = self._replay
        if self._dali_epoch_ahead:  # the iterator's first batch, or the first after a StopIteration
            self.recorder.timeline.iterator_opened(time.perf_counter())
        try:
            batch = self.timed_next(replay.__next__ if replay is not None else partial(orig_next, it))
        except StopIteration:
            self._dali_epoch_ahead = True  # auto_reset, or the script's reset(), starts the next epoch
            raise
        self._dali_epoch_ahead = False
        return batch

    def timed_next(self, pull: Callable[[], Any]) -> Any:
        """One batch from ``pull``, recorded; after warm-up + N batches, write the result and stop the script."""
        try:
            batch = self.recorder.next_batch(pull, self._items_of)
        except RunComplete:
            self.finish("stopped")
            sys.stderr.write(f"dsanalyzer: {self.cfg.mode} run done, stopping the script\n")
            raise SystemExit(0) from None
        self.comm.iteration = self.recorder.batches - 1  # the step that follows is this batch's
        return batch

    def _items_of(self, batch: Any) -> int:
        return _batch_items(batch, self.default_batch)

    def _first_iter(self, loader: Any, orig_iter: Callable[[Any], Any]) -> None:
        from dsanalyzer import jobs  # lazy: keeps the hook cheap for processes that never iterate

        self.loader = loader
        if "torch" in sys.modules:
            self.recorder.timeline.sync = cuda_sync_or_none()
        self.default_batch = getattr(loader, "batch_size", None) or 1
        from dsanalyzer.jobs.coordl_loader import fresh_iter, remote_counters

        if self.online is not None:  # fix --online: the job as it runs (no cold start), tuning itself
            from dsanalyzer.jobs.torch_loader import loader_facts

            self.info["loader"] = loader_facts(loader)
            self.online.start(loader)
            if self.online.error is not None:  # not a loader that tunes itself: said in the result
                self.finish("not tuned")
                raise SystemExit(0)
            return
        prepared = jobs.prepare(
            self.cfg,  # a HookConfig is the RunPlan it asks for
            loader,
            lambda: orig_iter(loader),
            fresh_iter(loader, lambda: orig_iter(loader)),  # a fresh iterator per worker count
            progress=self.recorder.progress,
        )
        self.info.update(prepared.info)
        self._replay = prepared.replay
        self.recorder.counters = remote_counters(loader)
        if self.cfg.mode == "prep_scaling":  # measured entirely inside prepare: stop the script
            self.finish("stopped")
            raise SystemExit(0)

    def finish(self, status: str) -> None:
        """Write ``result-<pid>.json`` once, from the process that started profiling."""
        if self.done or self.loader is None or os.getpid() != self.recorder.pid:
            return
        self.done = True
        info = dict(self.info)
        if self.online is not None:
            info["tune"] = self.online.facts()
        if self.comm.per_iter:
            info["comm"] = self.comm.series(self.recorder.batches)
        self.recorder.write_result(status, info)


def _batch_items(batch: Any, default: int) -> int:
    shape = getattr(batch, "shape", None)  # the common cases first: a tensor, or a tuple of them
    if shape is None and isinstance(batch, (list, tuple)) and batch:
        shape = getattr(batch[0], "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    from dsanalyzer.measure.runs import batch_items

    return batch_items(batch, default)


class TimedIterator:
    """Wraps a loader's iterator: records wait/step at each ``__next__`` and stops after N batches."""

    def __init__(self, inner: Any, state: ProbeState) -> None:
        self._inner = inner
        self._state = state
        self._pull = partial(next, inner)

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> Any:
        return self._state.timed_next(self._pull)

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


_STATE: ProbeState | None = None


def patch_loader_class(cls: type) -> None:
    """Replace ``cls.__iter__`` (only if ``cls`` defines its own) with the timed version."""
    orig = cls.__dict__.get("__iter__")
    if orig is None or getattr(orig, "_dsanalyzer_patched", False):
        return

    def __iter__(self: Any) -> Any:
        if _STATE is None:
            return orig(self)
        return _STATE.iter_for(self, orig)

    __iter__._dsanalyzer_patched = True  # type: ignore[attr-defined]
    setattr(cls, "__iter__", __iter__)  # noqa: B010 (the class is any loader class: patched in place)


def patch_dali_iterator_class(cls: type) -> None:
    """Time ``cls.__next__`` (a DALI iterator is its own iterator: ``__iter__`` returns it).

    ``__init__`` is wrapped too: DALI prepares its first batch inside it (``prepare_first_batch``)
    through ``__next__``, which must not make the iterator the profiled loader before the script
    asks for a batch.
    """
    orig_next, orig_init = cls.__dict__.get("__next__"), cls.__dict__.get("__init__")
    if orig_next is None or orig_init is None or getattr(orig_next, "_dsanalyzer_patched", False):
        return

    @wraps(orig_next)
    def __next__(self: Any) -> Any:
        if _STATE is None:
            return orig_next(self)
        return _STATE.next_for(self, orig_next)

    @wraps(orig_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if _STATE is None:
            return orig_init(self, *args, **kwargs)
        _STATE.depth += 1
        try:
            orig_init(self, *args, **kwargs)
        finally:
            _STATE.depth -= 1

    __next__._dsanalyzer_patched = True  # type: ignore[attr-defined]
    __init__._dsanalyzer_patched = True  # type: ignore[attr-defined]
    # setattr: the class is any loader class the job imported, patched in place.
    setattr(cls, "__next__", __next__)  # noqa: B010
    setattr(cls, "__init__", __init__)  # noqa: B010


def patch_ddp_class(cls: type) -> None:
    """Give a DDP model without a comm hook of its own the timed default all-reduce, at its first forward.

    A trainer that registers a hook (gradcomp) reports its own timings through ``dsanalyzer.jobs.comm``.
    """
    orig = cls.__dict__.get("_pre_forward")
    if orig is None or getattr(orig, "_dsanalyzer_patched", False):
        return

    def _pre_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if (
            _STATE is not None
            and not getattr(self, "_comm_hooks", True)
            and not self.__dict__.get("_dsanalyzer")
        ):
            self._dsanalyzer = True
            self.register_comm_hook(None, comm.timed_allreduce)
        return orig(self, *args, **kwargs)

    _pre_forward._dsanalyzer_patched = True  # type: ignore[attr-defined]
    cls._pre_forward = _pre_forward  # type: ignore[attr-defined]


def _patch_module(module: Any) -> None:
    names = vars(module)  # not getattr: a module's lazy __getattr__ must not import anything here
    if module.__name__ == "torch":  # imported whole (its docs attached): the script has not run a line
        threads.watch(module)
        apply.on_torch(module)  # a fix's intra-op threads (dsanalyzer.measure.apply)
        return
    for name in _LOADER_CLASSES:
        if isinstance(names.get(name), type):
            patch_loader_class(names[name])
            # where the script builds it (the fix's patch), and a fix's arguments applied there
            apply.patch_construction(names[name], module.__name__ == "torch.utils.data.dataloader")
    dali = names.get("DALIGenericIterator")
    if isinstance(dali, type) and dali.__module__ == module.__name__:
        patch_dali_iterator_class(dali)
    ddp = getattr(module, "DistributedDataParallel", None)
    if isinstance(ddp, type):
        patch_ddp_class(ddp)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds the loader modules through the other finders, then patches them right after import."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _TARGET_MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            _patch_module(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install_from_env() -> bool:
    """Install the hook when ``DSANALYZER_MODE`` is set; True when installed."""
    global _STATE
    if not os.environ.get(ENV_MODE) or _STATE is not None:
        return False
    cfg = HookConfig.from_env()
    apply.install(apply.Change.from_env())
    _STATE = ProbeState(cfg)
    comm.set_recorder(_STATE.comm)
    for name in _TARGET_MODULES:
        if name in sys.modules:
            _patch_module(sys.modules[name])
    sys.meta_path.insert(0, _PatchOnImport())
    atexit.register(lambda: _STATE.finish("exit") if _STATE is not None else None)
    return True
