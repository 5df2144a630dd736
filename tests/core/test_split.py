"""The splitter: exactly once across workers, by shard and by sample."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardpipes._core.samples import PartFilter
from shardpipes._core.split import (
    ShardPart,
    SplitPlanner,
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


def test_defaults_are_one_worker_in_list_order() -> None:
    """No options: one worker reads every shard whole, in the given order."""
    urls = [f"s{i}.tar" for i in range(4)]
    expected = [ShardPart(u) for u in urls]
    assert split_plan(urls) == expected
    assert SplitPlanner(urls).plan() == expected
    assert [SplitPlanner(urls).url(i) for i in range(4)] == urls


@pytest.mark.parametrize(
    ("worker_id", "expected"),
    [(0, ShardPart("a", 0, 2)), (1, ShardPart("b", 0, 1)), (2, ShardPart("a", 1, 2))],
)
def test_plan_of_a_shared_shard(worker_id: int, expected: ShardPart) -> None:
    """Fewer shards than workers: the plan names the part and the number of parts."""
    assert split_plan(["a", "b"], num_workers=3, worker_id=worker_id) == [expected]
    assert SplitPlanner(["a", "b"]).plan(num_workers=3, worker_id=worker_id) == [expected]


def test_shuffle_defaults_to_seed_0_epoch_0() -> None:
    """Shuffle alone orders by shard_order(seed=0, epoch=0), in the plan and the planner."""
    urls = [f"s{i}.tar" for i in range(12)]
    expected = [urls[i] for i in shard_order(12, seed=0)]
    assert shard_order(12, seed=0) == shard_order(12, seed=0, epoch=0)
    assert [p.url for p in split_plan(urls, shuffle=True)] == expected
    assert [p.url for p in SplitPlanner(urls, shuffle=True).plan()] == expected
    assert [p.url for p in split_plan(urls, shuffle=True, seed=0, epoch=1)] != expected


@pytest.mark.parametrize(
    ("n_shards", "total", "worker", "expected"),
    [
        (3, 3, 2, [(2, 0, 1)]),  # as many shards as workers: one whole shard each
        (2, 3, 2, [(0, 1, 2)]),  # fewer: shard 0 shared by workers 0 and 2
        (2, 3, 1, [(1, 0, 1)]),
        (0, 2, 1, []),
        (5, 2, 0, [(0, 0, 1), (2, 0, 1), (4, 0, 1)]),
    ],
)
def test_assign_table(
    n_shards: int, total: int, worker: int, expected: list[tuple[int, int, int]]
) -> None:
    """Known assignments, by shard and by part."""
    assert assign(n_shards, total, worker) == expected


@pytest.mark.parametrize(
    ("counts", "total", "worker", "expected"),
    [
        ([2, 2], 2, 0, [(0, 0, 2)]),  # a block ending exactly where a shard ends
        ([2, 2], 2, 1, [(1, 0, 2)]),
        ([2, 0, 2], 2, 1, [(2, 0, 2)]),  # an empty shard is nobody's
        ([3, 3, 1], 3, 1, [(0, 2, 3), (1, 0, 1)]),  # a block across a shard boundary
        ([7], 3, 2, [(0, 4, 6)]),
    ],
)
def test_assign_even_table(
    counts: list[int], total: int, worker: int, expected: list[tuple[int, int, int]]
) -> None:
    """Known even blocks, including ones that end on a shard boundary."""
    assert assign_even(counts, total, worker) == expected


def test_assign_even_needs_a_sample_per_worker() -> None:
    """Fewer samples than workers (or no shards at all) is refused, with the numbers."""
    with pytest.raises(ValueError, match=r"0 samples in 0 shards for 2 workers"):
        assign_even([], 2, 0)
    with pytest.raises(ValueError, match=r"1 samples in 2 shards for 2 workers"):
        assign_even([1, 0], 2, 1)


@pytest.mark.parametrize("shuffle", [False, True])
def test_even_plan_follows_the_shuffled_counts(shuffle: bool) -> None:
    """Even split with a shuffle: the counts move with their shards."""
    urls = [f"s{i}.tar" for i in range(6)]
    counts = [1, 9, 2, 8, 3, 7]
    by_url = dict(zip(urls, counts, strict=True))
    plans = [
        split_plan(urls, shuffle=shuffle, seed=5, num_workers=3, worker_id=w, counts=counts)
        for w in range(3)
    ]
    for plan in plans:
        assert sum(p.stop - p.start for p in plan) == 10  # type: ignore[operator]
        assert all(0 <= p.start < p.stop <= by_url[p.url] for p in plan)  # type: ignore[operator]
    order = [p.url for plan in plans for p in plan]
    expected = [urls[i] for i in shard_order(6, seed=5)] if shuffle else urls
    assert sorted(set(order), key=order.index) == expected
