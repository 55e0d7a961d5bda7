"""coordl.DataLoader and torch.utils.data.DataLoader, same datasets and arguments: same batches, same len(),
same public attributes, same exception types (torch's wording in the message).

Each case builds both loaders with :func:`tests.coordl.parity_cases.both` and compares everything a training
loop sees (:func:`tests.coordl.parity_cases.outcomes`). Errors raised inside the dataset are in
``test_parity_errors.py``; workers that finish early in ``test_parity_workers.py``.
"""

from __future__ import annotations

import typing
import warnings

import pytest
import torch
import torch.utils.data as tud

import coordl
from tests.coordl.parity_cases import (
    TORCH_ATTRIBUTES,
    Batched,
    Columns,
    Configured,
    Items,
    Keyed,
    Mixed,
    Overlong,
    RangeStream,
    Shards,
    WorkerInfo,
    assert_same_outcomes,
    both,
    configure_worker,
    outcomes,
    pid_init,
    rows_pipe,
    shuffled_pipe,
    split_range,
)

pytestmark = pytest.mark.timeout(120)


def compare(make, epochs: int = 1, ordered: bool = True, **kwargs) -> None:
    ours, theirs = both(make, **kwargs)
    with ours:
        assert_same_attributes(ours, theirs)
        assert_same_len(ours, theirs)
        assert_same_outcomes(outcomes(ours, epochs), outcomes(theirs, epochs), ordered=ordered)


def assert_same_len(ours, theirs) -> None:
    try:
        expected = len(theirs)
    except TypeError as e:
        with pytest.raises(type(e)):
            len(ours)
        return
    assert len(ours) == expected


def assert_same_attributes(ours, theirs) -> None:
    for name in TORCH_ATTRIBUTES:
        a, b = getattr(ours, name), getattr(theirs, name)
        if name == "generator":
            assert (a is None) == (b is None)
        elif name == "multiprocessing_context":
            assert (a.get_start_method() if a else None) == (b.get_start_method() if b else None)
        else:
            assert a == b, name
    assert type(ours.sampler) is type(theirs.sampler)
    assert type(ours.batch_sampler) is type(theirs.batch_sampler)


# -- samplers, generators, batching --------------------------------------------------------------------

SAMPLERS = {
    "sequential": {},
    "shuffle+generator": {"shuffle": True, "generator": 3},
    "random sampler, own generator": {"sampler": lambda ds, g: tud.RandomSampler(ds, generator=g)},
    "random with replacement": {
        "sampler": lambda ds, g: tud.RandomSampler(ds, replacement=True, num_samples=25, generator=g)
    },
    "subset random": {"sampler": lambda ds, g: tud.SubsetRandomSampler(range(3, 30), generator=g)},
    "weighted": {
        "sampler": lambda ds, g: tud.WeightedRandomSampler(
            [1.0 + (i % 3) for i in range(40)], 30, generator=g
        )
    },
    "batch sampler": {
        "batch_size": 1,
        "batch_sampler": lambda ds, g: tud.BatchSampler(
            tud.RandomSampler(ds, generator=g), 6, drop_last=False
        ),
    },
    "list sampler": {"sampler": [5, 3, 9, 9, 0, 39]},
}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("case", list(SAMPLERS))
def test_samplers_and_generators(case: str, num_workers: int) -> None:
    kwargs = {"batch_size": 4, **SAMPLERS[case]}
    if "batch_sampler" in kwargs:
        kwargs.pop("batch_size")
    compare(Items, num_workers=num_workers, epochs=2, **kwargs)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_default_collate_of_every_kind(drop_last: bool, num_workers: int) -> None:
    compare(lambda: Mixed(11), batch_size=3, drop_last=drop_last, num_workers=num_workers)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_custom_collate_and_worker_init(num_workers: int) -> None:
    compare(Items, batch_size=5, num_workers=num_workers, collate_fn=list, worker_init_fn=pid_init)


# -- batch_size=None: the sampler's elements go to the dataset as they are --------------------------------

KEYS = {
    "ints": [3, 1, 4],
    "lists": [[1, 2], [3, 4, 5], [0]],
    "tuples": [(1, 2), (7,)],
    "slices": [slice(0, 3), slice(4, 10, 2)],
    "strings": ["k3", "k0", "k11"],
}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("keys", list(KEYS))
def test_batch_size_none_passes_sampler_elements_as_they_are(keys: str, num_workers: int) -> None:
    compare(Keyed, batch_size=None, sampler=KEYS[keys], num_workers=num_workers)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_size_none_with_a_generator(num_workers: int) -> None:
    compare(Items, batch_size=None, shuffle=True, generator=5, num_workers=num_workers)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_size_none_keys_with_a_generator(num_workers: int) -> None:
    compare(Keyed, batch_size=None, sampler=KEYS["lists"], generator=5, num_workers=num_workers)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_sampler_of_keys_that_are_not_ints(num_workers: int) -> None:
    compare(Keyed, batch_sampler=[["k1", "k2"], ["k5", "k0"]], num_workers=num_workers)


# -- a dataset that fetches a batch in one call --------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_getitems_is_called_for_batches(num_workers: int) -> None:
    compare(Batched, batch_size=4, num_workers=num_workers)
    compare(Batched, batch_size=None, num_workers=num_workers)  # no batches: __getitem__ per item


@pytest.mark.parametrize("num_workers", [0, 2])
def test_getitems_that_returns_its_own_batch(num_workers: int) -> None:
    compare(lambda: Columns(10), batch_size=4, num_workers=num_workers)


def test_subset_of_a_batched_dataset_reaches_its_getitems() -> None:
    compare(lambda: tud.Subset(Batched(20), [3, 5, 7, 11, 13]), batch_size=2, num_workers=2)


# -- iterable datasets, worker info, start methods, persistent workers, order, pinning ------------------


@pytest.mark.parametrize(
    ("sizes", "num_workers", "batch_size"),
    [((7,), 0, 3), ((4, 3), 2, 2), ((0, 5, 1), 3, 2), ((1, 0), 2, 2), ((3, 3), 2, None)],
)
def test_iterable_datasets(sizes, num_workers: int, batch_size) -> None:
    compare(lambda: Shards(sizes), num_workers=num_workers, batch_size=batch_size, epochs=2)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_datapipes_shuffled_and_sharded_under_the_loaders_control(num_workers: int) -> None:
    compare(shuffled_pipe, batch_size=3, shuffle=True, num_workers=num_workers, generator=8, epochs=2)
    compare(shuffled_pipe, batch_size=3, shuffle=False, num_workers=num_workers)


@pytest.mark.parametrize("method", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_datapipe_of_numpy_rows(method: str) -> None:
    compare(rows_pipe, batch_size=2, num_workers=2, multiprocessing_context=method, shuffle=True, generator=1)


def test_iterable_dataset_drop_last() -> None:
    compare(lambda: Shards((5, 4)), num_workers=2, batch_size=2, drop_last=True)


@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_worker_info(num_workers: int) -> None:
    compare(WorkerInfo, batch_size=4, num_workers=num_workers, generator=11)


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_init_fn_configures_the_users_dataset(persistent: bool) -> None:
    compare(
        Configured,
        batch_size=3,
        num_workers=2,
        worker_init_fn=configure_worker,
        persistent_workers=persistent,
    )
    compare(
        RangeStream, batch_size=4, num_workers=2, worker_init_fn=split_range, persistent_workers=persistent
    )


# A spawned or forkserver worker imports torch afresh (seconds each): one such case runs by default, the rest
# with the slow tests (CI runs them).
SLOW_START = pytest.mark.slow


@pytest.mark.parametrize("method", ["fork", "spawn", pytest.param("forkserver", marks=SLOW_START)])
def test_start_methods(method: str) -> None:
    compare(WorkerInfo, batch_size=4, num_workers=2, multiprocessing_context=method, generator=2)


@pytest.mark.parametrize("method", ["fork", pytest.param("spawn", marks=SLOW_START)])
def test_start_methods_iterable(method: str) -> None:
    compare(lambda: Shards((3, 0, 2)), batch_size=2, num_workers=3, multiprocessing_context=method)


@pytest.mark.parametrize("dataset", ["map", "iterable"])
def test_persistent_workers(dataset: str) -> None:
    make = WorkerInfo if dataset == "map" else (lambda: Shards((2, 3)))
    compare(make, batch_size=2, num_workers=2, persistent_workers=True, epochs=3, generator=4)


def test_in_order_false_gives_the_same_batches() -> None:
    compare(Items, batch_size=3, num_workers=2, in_order=False, ordered=False, epochs=2)


def test_pin_memory() -> None:
    ours, theirs = both(Mixed, batch_size=4, num_workers=2, pin_memory=True)
    with ours, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # no accelerator: torch says pinning is off
        a, b = next(iter(ours)), next(iter(theirs))
        assert a["x"].is_pinned() == b["x"].is_pinned()
        assert_same_outcomes(outcomes(ours), outcomes(theirs))


def test_more_items_than_len_warns_only_after_len_was_asked() -> None:
    ours, theirs = both(Overlong, batch_size=1, num_workers=2)
    with ours:
        for loader in (theirs, ours):
            with warnings.catch_warnings():
                warnings.simplefilter("error", UserWarning)
                assert sum(len(b) for b in loader) == 12  # never asked len(): no warning
            assert len(loader) == 6
            with pytest.warns(UserWarning, match=r"was reported to be 6.*samples have been fetched"):
                list(loader)


def test_len_of_iterable_dataset_with_len() -> None:
    class Sized(Shards):
        def __len__(self) -> int:
            return sum(self.sizes)

    ours, theirs = both(lambda: Sized((3, 4)), batch_size=2)
    with ours:
        assert len(ours) == len(theirs) == 4


# -- construction: torch's errors, torch's attributes ----------------------------------------------------

BAD_ARGUMENTS = {
    "shuffle and sampler": {"shuffle": True, "sampler": [0, 1]},
    "batch_sampler and batch_size": {"batch_sampler": [[0, 1]], "batch_size": 2},
    "batch_sampler and shuffle": {"batch_sampler": [[0, 1]], "shuffle": True},
    "batch_sampler and drop_last": {"batch_sampler": [[0, 1]], "drop_last": True},
    "batch_size None and drop_last": {"batch_size": None, "drop_last": True},
    "negative workers": {"num_workers": -1},
    "negative timeout": {"timeout": -1},
    "prefetch_factor without workers": {"prefetch_factor": 2},
    "negative prefetch_factor": {"num_workers": 1, "prefetch_factor": -1},
    "persistent without workers": {"persistent_workers": True},
    "unknown start method": {"num_workers": 1, "multiprocessing_context": "teleport"},
    "context without workers": {"multiprocessing_context": "spawn"},
}


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_bad_arguments_raise_torchs_errors(case: str) -> None:
    kwargs = BAD_ARGUMENTS[case]
    with pytest.raises(Exception) as theirs:
        tud.DataLoader(Items(), **kwargs)
    with pytest.raises(type(theirs.value)) as ours, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        coordl.DataLoader(Items(), **kwargs)
    assert str(theirs.value) in str(ours.value)


@pytest.mark.parametrize("kwargs", [{"shuffle": True}, {"sampler": [0]}, {"batch_sampler": [[0]]}])
def test_iterable_dataset_refuses_order_arguments_like_torch(kwargs) -> None:
    with pytest.raises(ValueError) as theirs:
        tud.DataLoader(Shards((2,)), **kwargs)
    with pytest.raises(ValueError) as ours:
        coordl.DataLoader(Shards((2,)), **kwargs)
    assert str(theirs.value) in str(ours.value)


@pytest.mark.parametrize(
    "name", ["batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"]
)
def test_assigning_constructor_attributes_after_init_raises_like_torch(name: str) -> None:
    ours, theirs = both(Items, batch_size=2)
    with ours:
        with pytest.raises(ValueError) as torch_error:
            setattr(theirs, name, getattr(theirs, name))
        with pytest.raises(ValueError) as coordl_error:
            setattr(ours, name, getattr(ours, name))
        assert str(torch_error.value) in str(coordl_error.value)


def test_multiprocessing_context_stays_assignable() -> None:
    ours, theirs = both(Items, batch_size=2, num_workers=1)
    with ours:
        theirs.multiprocessing_context = "spawn"
        ours.multiprocessing_context = "spawn"
        assert ours.multiprocessing_context.get_start_method() == "spawn"
        assert len(next(iter(ours))) == 2


def test_dataloader_is_generic_like_torchs() -> None:
    alias = coordl.DataLoader[torch.Tensor]
    assert alias.__origin__ is coordl.DataLoader
    assert isinstance(coordl.DataLoader(Items(4)), tud.DataLoader)

    def annotated(loader: coordl.DataLoader[torch.Tensor]) -> int:  # evaluated at run time
        return len(loader)

    assert typing.get_type_hints(annotated)["loader"] == coordl.DataLoader[torch.Tensor]
