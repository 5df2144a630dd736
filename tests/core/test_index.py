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


def test_dump_format() -> None:
    """The text format: a header line with size and count, then one 'start end' per sample."""
    assert dump_index([(0, 1536), (1536, 4096)], 10240) == (
        b"shardpipes-index 1 10240 2\n0 1536\n1536 4096\n"
    )
    assert dump_index([], 1024) == b"shardpipes-index 1 1024 0\n"


def test_load_without_a_shard_size_skips_the_staleness_check() -> None:
    """With no shard size to compare, the index's own size is not checked."""
    assert load_index(b"shardpipes-index 1 99 1\n0 5\n", url="i") == [(0, 5)]


def test_sample_ranges_follow_keys() -> None:
    """Ranges span all members of a sample; extension-less members are ignored."""
    ms = [
        Member("a.jpg", None, 0, 1024),
        Member("a.cls", None, 1024, 2048),
        Member("README", None, 2048, 3072),
        Member("b.jpg", None, 3072, 4096),
    ]
    assert sample_ranges(ms) == [(0, 2048), (3072, 4096)]


def test_sample_ranges_of_a_sample_spanning_three_members() -> None:
    """A range runs from its first member's header to its last member's end."""
    ms = [
        Member("dir/a.jpg", None, 512, 1024),
        Member("dir/a.cls", None, 1024, 2048),
        Member("dir/a.json", None, 2048, 2560),
        Member("dir/b.jpg", None, 2560, 3584),
        Member("dir/a.txt", None, 3584, 4096),  # a key seen again: a new sample
    ]
    assert sample_ranges(ms) == [(512, 2560), (2560, 3584), (3584, 4096)]
    assert sample_ranges([Member("README", None, 0, 512)]) == []
    assert sample_ranges([Member(".jpg", None, 0, 512)]) == [(0, 512)]  # an empty key


UNORDERED = "malformed index: ranges out of order or count wrong$"


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"garbage", "malformed index$"),
        (b"", "malformed index$"),
        (b"shardpipes-index 1 10\n", "malformed index$"),
        (b"shardpipes-index 1 10 1\n0 5 7\n", "malformed index$"),
        (b"shardpipes-index 1 10 1\n0 x\n", "malformed index$"),
        (b"shardpipes-index 1 10 1\n\xff 5\n", "malformed index$"),
        (b"other-index 1 10 0\n", r"not a shardpipes index \(header 'other-index 1 10 0'\)"),
        (b"shardpipes-index 2 10 0\n", "not a shardpipes index"),
        (b"shardpipes-index 1 10 2\n0 5\n", UNORDERED),
        (b"shardpipes-index 1 10 2\n0 5\n4 8\n", UNORDERED),
        (b"shardpipes-index 1 10 2\n5 8\n0 4\n", UNORDERED),
        (b"shardpipes-index 1 10 1\n5 5\n", UNORDERED),  # an empty range
        (b"shardpipes-index 1 10 1\n6 5\n", UNORDERED),
        (
            b"shardpipes-index 1 99 1\n0 5\n",
            "stale index: made for a shard of 99 bytes, the shard has 10",
        ),
    ],
)
def test_bad_indexes(data: bytes, match: str) -> None:
    """Malformed, foreign and stale indexes are refused with the index URL."""
    with pytest.raises(ShardIndexError, match=rf"^i\.idx: {match}"):
        load_index(data, url="i.idx", shard_size=10)
