"""Tar index serialization."""

from __future__ import annotations

import pytest

from shardpipes._core.index import dump_index, load_index, sample_ranges
from shardpipes._core.tar import Member
from shardpipes.errors import ShardIndexError


def test_round_trip() -> None:
    """Dump then load gives back the ranges."""
    ranges = [(0, 1536), (1536, 4096), (4096, 5120)]
    assert load_index(dump_index(ranges, 10240), url="i", shard_size=10240) == ranges


def test_sample_ranges_follow_keys() -> None:
    """Ranges span all members of a sample; extension-less members are ignored."""
    ms = [
        Member("a.jpg", None, 0, 1024),
        Member("a.cls", None, 1024, 2048),
        Member("README", None, 2048, 3072),
        Member("b.jpg", None, 3072, 4096),
    ]
    assert sample_ranges(ms) == [(0, 2048), (3072, 4096)]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"garbage", "malformed"),
        (b"other-index 1 10 0\n", "not a shardpipes index"),
        (b"shardpipes-index 1 10 2\n0 5\n", "count wrong"),
        (b"shardpipes-index 1 10 2\n0 5\n4 8\n", "out of order"),
        (b"shardpipes-index 1 99 1\n0 5\n", "stale index"),
    ],
)
def test_bad_indexes(data: bytes, match: str) -> None:
    """Malformed, foreign and stale indexes are refused with the index URL."""
    with pytest.raises(ShardIndexError, match=f"i.idx: .*{match}"):
        load_index(data, url="i.idx", shard_size=10)
