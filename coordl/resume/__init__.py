"""Resumable loader state: stop anywhere, continue in a new process with exactly the batches that had
not been handed out, in the same order (torchdata's ``StatefulDataLoader`` semantics).

What a state holds (plain data, O(workers), never O(dataset)):

* the pass: its epoch and the batches already handed out (batches whose items were all skipped
  count: they were used up), named by the lowest not handed out and, with ``in_order=False``, the
  numbers above it that were;
* the order: the state, when the pass began, of the generator that shuffles it (``generator=``, or
  the loader's own one for ``shuffle=True`` without it, seeded once from torch's global RNG as torch's
  and torchdata's ``RandomSampler`` seed theirs), and torch's RNG when the workers were made (their
  seeds); resuming skips the batches already handed out *in the sampler*, so they are never fetched
  or prepped again;
* the Stateful protocol (``state_dict()`` / ``load_state_dict()``, torchdata's meaning): a sampler,
  batch sampler or sampler iterator that has them saves its own position instead (after the last
  batch handed out, not the ones drawn ahead); a dataset, and an ``IterableDataset``'s iterator, that
  have them are saved where they live, in each worker after the last batch it gave (or as it began
  the pass, before it gave one; in the main process without workers), and restored in that worker,
  whose turn in torch's round robin the resumed pass keeps;
* an ``IterableDataset`` without any state is replayed from the start of the epoch and the batches
  already handed out are dropped (torchdata's fast-forward, with the same worker seeds).

Random draws inside ``prep`` / ``__getitem__``: with ``generator=``, each item's prep runs with torch's
RNG seeded from (epoch seed, item index) (:class:`SeededIndex`), so an item's augmentation does not
depend on which worker prepped it or where the epoch was interrupted. Without it, torch's per-worker
seeding applies unchanged; a dataset that keeps its RNG in its own state resumes it exactly.

A job of a coordination group (``coordinate=``) saves its group epoch and the batches it got; resumed,
it rejoins the group at that position when the group is still at that epoch, else it makes the rest of
that epoch's batches itself and then follows the group (:func:`group_state`).
"""

from coordl.resume.loader import Resume
from coordl.resume.order import ResumableSampler, SeededIndex, item_seed
from coordl.resume.state import (
    STATE_FORMAT,
    STATE_VERSION,
    StateMismatchError,
    check_state,
    decode_generator_state,
    encode_generator_state,
    group_state,
    is_stateful,
    load_group_state,
)
from coordl.resume.tracker import PassTracker, torch_iterator

__all__ = [
    "STATE_FORMAT",
    "STATE_VERSION",
    "PassTracker",
    "StateMismatchError",
    "Resume",
    "ResumableSampler",
    "SeededIndex",
    "check_state",
    "decode_generator_state",
    "encode_generator_state",
    "group_state",
    "is_stateful",
    "item_seed",
    "load_group_state",
    "torch_iterator",
]
