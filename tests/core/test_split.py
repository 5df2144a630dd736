"""The splitter: exactly once across workers, by shard and by sample."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardpipes._core.samples import PartFilter
from shardpipes._core.split import (
    assign,
    assign_even,
    block,
    global_worker,
    part_samples,
    shard_order,
    split_plan,
)


@given(
    n_shards=st.integers(0, 40),
    total=st.integers(1, 40),
    per_shard=st.integers(1, 9),
    contiguous=st.booleans(),
)
def test_every_sample_exactly_once(
    n_shards: int, total: int, per_shard: int, contiguous: bool
) -> None:
    """Over all workers, every (shard, sample) is read exactly once, in either part mode."""
    seen: Counter[tuple[int, int]] = Counter()
    for worker in range(total):
        for shard, part, parts in assign(n_shards, total, worker):
            if contiguous:
                mine = list(block(per_shard, part, parts))
            else:
                keep = PartFilter(part, parts)
                mine = [i for i in range(per_shard) if keep(f"k{i}.jpg")]
            seen.update((shard, i) for i in mine)
    assert seen == Counter({(s, i): 1 for s in range(n_shards) for i in range(per_shard)})


@given(n_shards=st.integers(1, 50), total=st.integers(1, 50))
def test_balance(n_shards: int, total: int) -> None:
    """Whole shards differ by at most one per worker; shared shards by at most one part."""
    loads = [assign(n_shards, total, w) for w in range(total)]
    if n_shards >= total:
        counts = [len(x) for x in loads]
        assert max(counts) - min(counts) <= 1
    else:
        assert all(len(x) == 1 for x in loads)
        parts = [x[0][2] for x in loads]
        assert max(parts) - min(parts) <= 1


@given(n=st.integers(0, 100), parts=st.integers(1, 20))
def test_blocks_tile_the_range(n: int, parts: int) -> None:
    """Blocks are contiguous, in order, cover everything and differ in size by at most one."""
    blocks = [block(n, k, parts) for k in range(parts)]
    assert [i for b in blocks for i in b] == list(range(n))
    assert max(map(len, blocks)) - min(map(len, blocks)) <= 1


@pytest.mark.parametrize(("total", "worker"), [(0, 0), (2, 2), (2, -1)])
def test_bad_worker(total: int, worker: int) -> None:
    """A worker index outside range(total) is refused."""
    with pytest.raises(ValueError, match="worker must be in range"):
        assign(3, total, worker)


@given(
    counts=st.lists(st.integers(0, 9), min_size=1, max_size=30),
    total=st.integers(1, 40),
)
def test_even_split_is_exactly_once_and_equal(counts: list[int], total: int) -> None:
    """Even split: equal samples per worker, none twice, fewer than `total` left out."""
    n = sum(counts)
    if n < total:
        with pytest.raises(ValueError, match="at least one sample per worker"):
            assign_even(counts, total, 0)
        return
    seen: Counter[tuple[int, int]] = Counter()
    sizes = []
    for worker in range(total):
        ranges = assign_even(counts, total, worker)
        sizes.append(sum(stop - start for _, start, stop in ranges))
        for shard, start, stop in ranges:
            assert 0 <= start < stop <= counts[shard]
            seen.update((shard, i) for i in range(start, stop))
    assert set(sizes) == {n // total}
    assert max(seen.values()) == 1
    assert n - sum(seen.values()) == n % total < total


@given(
    n_shards=st.integers(1, 30),
    world_size=st.integers(1, 4),
    num_workers=st.integers(1, 4),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 5),
    even=st.booleans(),
)
def test_plan_over_ranks_and_workers(
    n_shards: int, world_size: int, num_workers: int, seed: int, epoch: int, even: bool
) -> None:
    """Every worker of every rank plans alone; together they read each sample once."""
    urls = [f"s{i}.tar" for i in range(n_shards)]
    counts = [3 + i % 4 for i in range(n_shards)] if even else None
    per_shard = dict(zip(urls, counts or [5] * n_shards, strict=True))
    total = world_size * num_workers
    if even and sum(per_shard.values()) < total:
        return
    seen: Counter[tuple[str, int]] = Counter()
    for rank in range(world_size):
        for worker_id in range(num_workers):
            plan = split_plan(
                urls, shuffle=True, seed=seed, epoch=epoch, world_size=world_size,
                rank=rank, num_workers=num_workers, worker_id=worker_id, counts=counts,
            )  # fmt: skip
            for part in plan:
                seen.update((part.url, i) for i in part_samples(per_shard[part.url], part))
    n = sum(per_shard.values())
    assert max(seen.values()) == 1
    assert n - sum(seen.values()) == (n % total if even else 0)


def test_shard_order_depends_on_seed_and_epoch_only() -> None:
    """The same (seed, epoch) gives the same permutation; another epoch another one."""
    a = shard_order(50, seed=3, epoch=0)
    assert a == shard_order(50, seed=3, epoch=0) and sorted(a) == list(range(50))
    assert a != shard_order(50, seed=3, epoch=1)
    assert a != shard_order(50, seed=4, epoch=0)


def test_plan_order_is_shared_by_all_world_sizes() -> None:
    """Ranks agree on the order: the shards read, in order, do not depend on the world size."""
    urls = [f"s{i}.tar" for i in range(24)]
    expected = [urls[i] for i in shard_order(24, seed=9, epoch=2)]
    for world_size in (1, 2, 3, 4):
        plans = [
            split_plan(urls, shuffle=True, seed=9, epoch=2, world_size=world_size, rank=r)
            for r in range(world_size)
        ]
        got = [plans[i % world_size][i // world_size].url for i in range(24)]
        assert got == expected


def test_global_worker_numbering() -> None:
    """Worker w of rank r is global worker w * world_size + r, as torch's DataLoader does."""
    ids = [global_worker(3, r, 2, w) for r in range(3) for w in range(2)]
    assert sorted(i for _, i in ids) == list(range(6)) and {t for t, _ in ids} == {6}
    assert global_worker(3, 1, 2, 1) == (6, 4)
    with pytest.raises(ValueError, match="rank must be in range"):
        global_worker(2, 2, 1, 0)
    with pytest.raises(ValueError, match="worker_id must be in range"):
        global_worker(1, 0, 2, 2)


def test_counts_must_match_the_shards() -> None:
    """Counts for another shard list are refused."""
    with pytest.raises(ValueError, match="counts has 2 entries for 3 shards"):
        split_plan(["a", "b", "c"], counts=[1, 2])
