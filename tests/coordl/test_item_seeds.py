"""Per-item seeds (coordl.resume.order): one per (epoch seed, index), the same whether derived one at a time
(the main process, for a batch's first index) or a batch at a time (a worker), and distinct."""

from __future__ import annotations

from coordl.resume.order import SeededIndex, batch_seeds, item_seed


def test_a_batch_derives_each_items_seed_as_one_at_a_time() -> None:
    for epoch_seed in (0, 7, 2**63 + 5, 2**64 - 1):
        indices = [0, 1, 2, 999_999, 12_345, 2**40]
        batch = [
            SeededIndex(indices[0], item_seed(epoch_seed, indices[0]), epoch_seed=epoch_seed),
            *indices[1:],
        ]
        assert batch_seeds(batch) == [item_seed(epoch_seed, i) for i in indices]


def test_seeds_are_distinct_63_bit_ints_across_items_and_epochs() -> None:
    n = 100_000
    seeds = []
    for epoch_seed in (11, 12, 13):
        got = batch_seeds([SeededIndex(0, None, epoch_seed=epoch_seed), *range(1, n)])
        assert all(type(s) is int and 0 <= s < 2**63 for s in got)
        seeds.extend(got)
    assert len(set(seeds)) == len(seeds)  # no two items of these epochs start their draws alike
