"""torchdata's resume scenarios (issue 46), each run with torchdata 0.11's ``StatefulDataLoader`` beside
``coordl.DataLoader`` on the same dataset: the resumed stream is the uninterrupted one, and where the
two loaders' orders are meant to match, coordl's is torchdata's.

1. a state saved at the end of an epoch of a stream yields the next full epoch (persistent workers too);
2. a sampler without ``state_dict()`` is fast-forwarded by the indices already drawn, with a warning;
3. ``in_order=False``: every batch exactly once after a resume (map-style: the state names the batches
   handed out, where torchdata's may repeat or lose some);
4. a state taken before the first batch (after construction, or right after ``iter()``);
5. a state asked for within the first ``num_workers`` batches after a load (round robin, persistent);
   for a map-style dataset, after ``iter()`` or after a load, each worker resumes from its own state;
6. another ``num_workers`` is refused at ``load_state_dict()`` (``tests/coordl/test_resume_stateful.py``).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

import coordl
from coordl.resume import StateMismatchError
from coordl.resume.state import decode_runs, encode_runs
from coordl.workers.start import _FLAGGED
from tests.coordl.resume_cases import (
    EpochStream,
    FlipStream,
    GlobalRngItems,
    PlainRngItems,
    PlainStream,
    SlowHalves,
    SlowItems,
    plain,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torchdata's set_vital, coordl's opaque stage

LOADERS = {"coordl": coordl.DataLoader, "torchdata": StatefulDataLoader}


def _identity(batch: Any) -> Any:
    return batch


def _round_trip(state: dict[str, Any]) -> dict[str, Any]:
    """Through JSON, as a checkpoint file would (torchdata's own states hold tensors: kept as they are)."""
    try:
        return json.loads(json.dumps(state))
    except TypeError:
        return state


def _close(loader: Any) -> None:
    if hasattr(loader, "close"):
        loader.close()


def _epochs(loader: Any, n: int) -> list[list[Any]]:
    return [[plain(b) for b in loader] for _ in range(n)]


# -- 1. the end of a stream's epoch -------------------------------------------------------------------


def _context(L: Callable, ctx: str | None) -> Any:
    """The start method for loader ``L``. torchdata's spawned workers (torch's own loop) can abort as they
    exit while their last batch is still being sent (issue 63, tests/coordl/workers/test_worker_exit.py):
    the reference run gets the spawn context coordl gives torch, whose workers exit as forked ones do; what
    it resumes is the same."""
    if ctx == "spawn" and L is not coordl.DataLoader:
        return _FLAGGED[multiprocessing.context.SpawnContext]
    return ctx


def _end_of_epoch(
    L: Callable, make_ds: Callable, workers: int, persistent: bool, ctx: str | None, resume: bool = True
) -> tuple:
    """Three epochs uninterrupted; then a state saved after the first, loaded into a new loader that
    had started an epoch of its own: its next two epochs (``resume=False``: no second loader, None)."""
    kwargs = {"num_workers": workers, "persistent_workers": persistent, "collate_fn": _identity}
    if workers:
        kwargs["multiprocessing_context"] = _context(L, ctx)
    dl = L(make_ds(), **kwargs)
    first = [plain(b) for b in dl]
    state = _round_trip(dl.state_dict())
    rest = _epochs(dl, 2)
    _close(dl)
    if not resume:
        return first, rest, None
    dl = L(make_ds(), **kwargs)
    it = iter(dl)
    next(it)
    next(it)
    dl.load_state_dict(state)
    resumed = _epochs(dl, 2)
    _close(dl)
    return first, rest, resumed


# spawn: one dataset (a spawned worker imports torch afresh, 30-70 s a case in CI's parallel phase; what differs
# under spawn is how the state reaches the worker, not the dataset)
@pytest.mark.parametrize(
    ("workers", "persistent", "ctx", "dataset"),
    [(w, p, c, d) for w, p, c in [(0, False, None), (3, False, "fork"), (3, True, "fork")] for d in ("stateful", "plain")]
    + [pytest.param(2, True, "spawn", "stateful", marks=pytest.mark.slow)]
    + [pytest.param(1, False, "fork", d, marks=pytest.mark.slow) for d in ("stateful", "plain")],
)  # fmt: skip
def test_state_at_an_epochs_end_yields_the_next_epoch(
    workers: int, persistent: bool, ctx, dataset: str
) -> None:
    def make():
        cls = EpochStream if dataset == "stateful" else PlainStream
        return cls(sizes=[0, 9, 5] if workers == 3 else None, n=14)

    # torchdata's resumed epochs are compared without persistent workers only (below): with them it stops there
    got = {
        name: _end_of_epoch(L, make, workers, persistent, ctx, resume=name == "coordl" or not persistent)
        for name, L in LOADERS.items()
    }
    first, rest, resumed = got["coordl"]
    assert len(first) == 14 and all(len(epoch) == 14 for epoch in rest)
    assert resumed == rest, "the resumed loader's next epochs are not the uninterrupted run's"
    # The uninterrupted epochs are torchdata's. (torchdata's own resume loses the first items of the
    # resumed epoch from the worker that had ended first when persistent workers of the new loader were
    # mid-epoch at the load: coordl is compared with the uninterrupted run there.)
    assert got["coordl"][:2] == got["torchdata"][:2]
    if not persistent:
        assert resumed == got["torchdata"][2]


# -- 2. a sampler without state_dict ------------------------------------------------------------------


def _user_sampler(L: Callable, workers: int, interrupt: int, caplog) -> tuple[list, list]:
    def make():
        ds = GlobalRngItems(20)
        return L(ds, batch_size=2, num_workers=workers, sampler=torch.utils.data.RandomSampler(ds))

    torch.manual_seed(0)
    whole = [plain(b) for b in make()]
    torch.manual_seed(0)
    dl = make()
    got = []
    for i, batch in enumerate(dl):
        got.append(plain(batch))
        if i + 1 == interrupt:
            break
    state = _round_trip(dl.state_dict())
    _close(dl)
    torch.manual_seed(0)  # the user's sampler draws its order from the global RNG, as when it began
    dl = make()
    caplog.clear()
    dl.load_state_dict(state)
    got += [plain(b) for b in dl]
    _close(dl)
    return whole, got


@pytest.mark.parametrize(("workers", "interrupt"), [(0, 1), (0, 4), (0, 9), (2, 3)])
def test_a_sampler_without_state_is_fast_forwarded(workers: int, interrupt: int, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="coordl")
    whole, got = _user_sampler(coordl.DataLoader, workers, interrupt, caplog)
    assert got == whole
    assert "fast-forward" in caplog.text and "RandomSampler" in caplog.text
    if workers == 0:  # with workers torchdata's stream differs (its sampler iterator is made twice)
        assert (whole, got) == _user_sampler(StatefulDataLoader, workers, interrupt, caplog)


# -- 3. in_order=False ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("interrupt", "batch_size", "sampler"), [(2, 1, False), (4, 1, False), (7, 1, False), (2, 2, True), (3, 1, True)]
)  # fmt: skip
def test_out_of_order_map_style_hands_out_every_batch_once(
    interrupt: int, batch_size: int, sampler: bool
) -> None:
    """Item 0 is slow: the batches after it overtake it. A state taken meanwhile names the lowest batch
    not handed out and the ones above it that were; the resumed loader hands out exactly the others,
    then whole epochs. (torchdata 0.11 keeps a count instead: the same runs with its loader repeated
    and lost batches, e.g. 3 workers, state after 4 batches: 2 and 5 again, 6 and 7 never.)"""

    def make():
        ds = SlowItems(12, slow=0, delay_s=0.6)
        order = StatefulDistributedSampler(ds, num_replicas=1, rank=0, shuffle=False) if sampler else None
        return coordl.DataLoader(ds, batch_size=batch_size, sampler=order, num_workers=2, in_order=False)

    dl = make()
    got = []
    for i, batch in enumerate(dl):
        got.append(plain(batch))
        if i + 1 == interrupt:
            break
    state = _round_trip(dl.state_dict())
    _close(dl)
    assert interrupt > 4 or all(0 not in batch for batch in got), "item 0 was not overtaken"
    handed = {batch[0] // batch_size for batch in got}
    lowest = min(set(range(12 // batch_size)) - handed)
    assert state["batches_done"] == lowest
    after = [n for first, last in state["handed_out_after"] for n in range(first, last + 1)]
    assert after == sorted(n for n in handed if n > lowest)
    dl = make()
    dl.load_state_dict(state)
    got += [plain(b) for b in dl]
    assert sorted(i for batch in got for i in batch) == list(range(12)), got
    assert sorted(i for b in dl for i in plain(b)) == list(range(12))  # the next epoch, whole
    _close(dl)


def test_out_of_order_state_names_runs_and_refuses_others() -> None:
    """The batches handed out above the lowest are saved as runs; a state holding anything else there
    is refused at load, naming the key."""
    assert encode_runs({3, 4, 5, 9, 11, 12}) == [[3, 5], [9, 9], [11, 12]]
    assert decode_runs([[3, 5], [9, 9]]) == {3, 4, 5, 9}
    dl = coordl.DataLoader(SlowItems(12, delay_s=0), batch_size=1, num_workers=0)
    state = dl.state_dict()
    dl.load_state_dict({**state, "handed_out_after": [[2, 3]]})
    with pytest.raises(StateMismatchError, match="handed_out_after"):
        dl.load_state_dict({**state, "handed_out_after": [4]})


@pytest.mark.parametrize("interrupt", [3, 7])
def test_out_of_order_stream_whose_workers_end_apart(interrupt: int) -> None:
    """Worker 1 starts late, so worker 0 ends first (after 7 batches, worker 0 has ended)."""

    def make():
        return coordl.DataLoader(SlowHalves(10, delay_s=0.6), batch_size=1, num_workers=2, in_order=False)

    dl = make()
    got = []
    for i, batch in enumerate(dl):
        got.append(int(batch))
        if i + 1 == interrupt:
            break
    state = _round_trip(dl.state_dict())
    _close(dl)
    dl = make()
    dl.load_state_dict(state)
    got += [int(b) for b in dl]
    _close(dl)
    assert sorted(got) == list(range(10)), got


# -- 4. a state before the first batch -----------------------------------------------------------------


def _before_first(
    L: Callable, workers: int, persistent: bool, when: str, own_first: bool
) -> tuple[list, list]:
    """The state taken right after construction (``when="init"``) or right after ``iter()``; loaded
    into a new loader before or after that loader's own first ``state_dict()``."""

    def make():
        return L(
            GlobalRngItems(12), batch_size=2, shuffle=True, num_workers=workers,
            persistent_workers=persistent and workers > 0,
        )  # fmt: skip

    torch.manual_seed(0)
    dl = make()
    it = iter(dl) if when == "iter" else None
    state = _round_trip(dl.state_dict())
    whole = [plain(b) for b in (it if it is not None else dl)]
    _close(dl)
    torch.manual_seed(99)
    dl = make()
    if own_first:
        dl.state_dict()
    dl.load_state_dict(state)
    got = [plain(b) for b in dl]
    _close(dl)
    return whole, got


@pytest.mark.parametrize(
    ("workers", "persistent"),
    [(0, False), (2, False), (2, True)] + [pytest.param(1, False, marks=pytest.mark.slow)],
)
@pytest.mark.parametrize("when", ["init", "iter"])
@pytest.mark.parametrize("own_first", [False, True])
def test_state_before_the_first_batch(workers: int, persistent: bool, when: str, own_first: bool) -> None:
    whole, got = _before_first(coordl.DataLoader, workers, persistent, when, own_first)
    assert got == whole
    if workers == 0:  # with workers the two loaders seed their shuffles differently
        assert whole == _before_first(StatefulDataLoader, workers, persistent, when, own_first)[0]


# -- 5. a state asked for within the first num_workers batches after a load ----------------------------


def _fast_request(L: Callable, interrupt: int, ctx: str, rest_only: bool = False) -> tuple[list, list]:
    """The rest of the run after a state at ``interrupt``, and what a load of it then gives (``rest_only``:
    the rest alone, and no second and third loader: the reference needs no more)."""

    def make():
        return L(
            FlipStream(40), batch_size=1, num_workers=3, persistent_workers=True, collate_fn=_identity,
            multiprocessing_context=_context(L, ctx),
        )  # fmt: skip

    dl = make()
    it = iter(dl)
    for _ in range(interrupt):
        next(it)
    state = _round_trip(dl.state_dict())
    rest = [plain(b) for b in it]
    if rest_only:
        _close(dl)
        return rest, []
    dl.load_state_dict(state)
    it = iter(dl)
    early = [plain(next(it)) for _ in range(2)]  # fewer than num_workers batches
    state2 = _round_trip(dl.state_dict())
    _close(dl)
    dl = make()
    dl.load_state_dict(state2)
    later = [plain(b) for b in dl]
    _close(dl)
    return rest, early + later


@pytest.mark.parametrize(
    ("interrupt", "ctx"),
    [(4, "fork"), (7, "fork"), (19, "fork")] + [pytest.param(7, "spawn", marks=pytest.mark.slow)],
)
def test_state_asked_right_after_a_load(interrupt: int, ctx: str) -> None:
    rest, got = _fast_request(coordl.DataLoader, interrupt, ctx)
    assert got == rest
    # The uninterrupted stream is torchdata's. (torchdata's resumed one differs here: the dataset hands
    # out its live list, which changes before torchdata's worker sends it on.)
    assert rest == _fast_request(StatefulDataLoader, interrupt, ctx, rest_only=True)[0]


# -- 5b. map-style: a state taken before every worker gave a batch -------------------------------------


def _early_map_state(
    L: Callable,
    make_ds: Callable,
    workers: int,
    persistent: bool,
    ctx: str | None,
    load_at: int | None,
    k: int,
    left_early: int = 0,
) -> tuple[list, list]:
    """``k`` batches after ``iter()`` (``load_at``: after ``load_at`` batches, a state loaded back into
    the same loader, and ``k`` batches after that; ``left_early``: after a pass left after that many
    batches), then a state: the rest of the run (and the next epoch with persistent workers)
    uninterrupted, and from a new loader, under another global seed, that loaded the state."""

    def make():
        kwargs: dict[str, Any] = {"batch_size": 2, "num_workers": workers, "persistent_workers": persistent}
        if workers:
            kwargs["multiprocessing_context"] = _context(L, ctx)
        return L(make_ds(16), **kwargs)

    epochs = 2 if persistent else 1  # later epochs' worker seeds come from the global RNG, as in torch
    torch.manual_seed(0)
    dl = make()
    it = iter(dl)
    if left_early:
        for _ in range(left_early):
            next(it)
        it = iter(dl)
    if load_at is not None:
        for _ in range(load_at):
            next(it)
        dl.load_state_dict(_round_trip(dl.state_dict()))
        it = iter(dl)
    for _ in range(k):
        next(it)
    state = _round_trip(dl.state_dict())
    whole = [plain(b) for b in it] + [plain(b) for _ in range(epochs - 1) for b in dl]
    _close(dl)
    torch.manual_seed(99)
    dl = make()
    dl.load_state_dict(state)
    got = [plain(b) for _ in range(epochs) for b in dl]
    _close(dl)
    return whole, got


_LOADS = [(None, 1), (None, 2), (1, 1), (4, 2)]


# spawn: the one case with a load and two workers' turns (the others cost CI's parallel phase 30-64 s each)
@pytest.mark.parametrize(
    ("workers", "persistent", "ctx", "load_at", "k"),
    [(w, p, c, *lk) for w, p, c in [(3, False, "fork"), (3, True, "fork")] for lk in _LOADS]
    + [pytest.param(w, p, c, *lk, marks=pytest.mark.slow) for w, p, c in [(0, False, None), (1, False, "fork")]
       for lk in _LOADS]
    + [pytest.param(2, True, "spawn", 4, 2, marks=pytest.mark.slow)],
)  # fmt: skip
def test_map_style_state_before_every_worker_gave_a_batch(
    workers: int, persistent: bool, ctx: str | None, load_at: int | None, k: int
) -> None:
    """Item i is [i, a draw from torch's RNG], the dataset's state that RNG: each worker draws from its
    own seed, so a worker resumed from another worker's state, or from none, draws otherwise. Each
    worker must resume from its own state (its state at its last batch handed out, or the loaded one, or
    as it started) with the turns of an uninterrupted run; torchdata's loader resumes the same."""
    whole, got = _early_map_state(coordl.DataLoader, GlobalRngItems, workers, persistent, ctx, load_at, k)
    assert got == whole
    assert (whole, got) == _early_map_state(
        StatefulDataLoader, GlobalRngItems, workers, persistent, ctx, load_at, k
    )


@pytest.mark.parametrize(("load_at", "k"), [(None, 1), (None, 2), (4, 2)])
def test_map_style_turns_kept_without_a_dataset_state(load_at: int | None, k: int) -> None:
    """The same without a dataset state: a worker's draws follow its seed only, so the resumed pass is
    not the uninterrupted one, but a worker that had given no batch yet makes its first as it would
    have, on its turn, as torchdata's loader does."""
    got = _early_map_state(coordl.DataLoader, PlainRngItems, 3, False, "fork", load_at, k)
    assert got == _early_map_state(StatefulDataLoader, PlainRngItems, 3, False, "fork", load_at, k)
    whole, resumed = got
    assert resumed[: 3 - k] == whole[: 3 - k]  # the workers that had given none: their first batch


@pytest.mark.parametrize(("left_early", "k"), [(2, 0), (2, 1), (4, 2)])
def test_persistent_map_workers_after_a_pass_left_early(left_early: int, k: int) -> None:
    """Persistent workers made batches of a pass left early that no one got: when the next pass begins
    their states are not those of their last batches handed out. A state taken in that pass before
    every worker gave a batch (right after ``iter()`` too) resumes each from the state it began the
    pass with; torchdata's loader resumes the same."""
    args = (GlobalRngItems, 3, True, "fork", None, k, left_early)
    whole, got = _early_map_state(coordl.DataLoader, *args)
    assert got == whole
    assert (whole, got) == _early_map_state(StatefulDataLoader, *args)
