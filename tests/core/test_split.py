"""The splitter: exactly once across workers, by shard and by sample."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardpipes._core.samples import PartFilter
from shardpipes._core.split import assign, block


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
