"""What a worker left, on references only (``shardpipes._core.elastic``): no shard is read.

Shards are given as their sample byte ranges: shard ``sN`` holds samples of 10 bytes each.
"""

from __future__ import annotations

from typing import Any

import pytest

from shardpipes._core.elastic import (
    buffer_seed_of,
    left_over,
    part_indices,
    replay,
    samples_of,
    share,
    size_of,
    units_of,
)
from shardpipes._core.run import EpochRun
from shardpipes._core.split import ShardPart

COUNTS = {"s0": 7, "s1": 5, "s2": 9}
RANGES: dict[str, Any] = {
    url: [(k * 10, k * 10 + 10) for k in range(n)] for url, n in COUNTS.items()
}
PARTS = [
    ShardPart("s0", start=2, stop=7, span=(20, 70)),
    ShardPart("s1"),
    ShardPart("s2", 1, 3),  # block 1 of 3: samples 3..5
]


class Known:
    """The shards' ranges; the ``streamed`` ones read from their start (gzip, no index)."""

    def __init__(self, *streamed: str) -> None:
        self.streamed_urls = set(streamed)

    def ranges(self, url: str) -> Any:
        return RANGES[url]

    def streamed(self, url: str) -> bool:
        return url in self.streamed_urls


INDEXED = Known()


def samples(units: list[ShardPart], *, streamed: bool = False) -> list[tuple[str, int]]:
    """The samples the units hold, as (shard, index)."""
    out = []
    for unit in units:
        n = COUNTS[unit.url]
        if unit.parts == 1:
            out += [(unit.url, i) for i in range(n)[unit.start : unit.stop]]
        elif streamed:
            out += [(unit.url, i) for i in range(unit.start + unit.part, n, unit.parts)]
        else:
            first, last = n * unit.part // unit.parts, n * (unit.part + 1) // unit.parts
            out += [(unit.url, i) for i in range(first, last)]
    return out


ALL = samples(PARTS)


def position(**changes: Any) -> dict[str, Any]:
    base = {
        "cursor": [0, -1, -1],
        "draining": False,
        "done": False,
        "buffer": [],
        "ahead": [],
        "shards": [],
    }
    return {**base, **changes}


def test_a_worker_that_had_not_begun_or_had_ended() -> None:
    assert left_over(PARTS, None, INDEXED) == PARTS
    assert left_over(PARTS, position(done=True), INDEXED) == []


def test_at_the_start_of_a_part_the_whole_part_is_left() -> None:
    """Cursor (2, -1, -1): part 2 taken, nothing read of it."""
    left = left_over(PARTS, position(cursor=[2, -1, -1]), INDEXED)
    assert left == PARTS[1:]


def test_in_a_part_the_rest_of_it_with_its_byte_span() -> None:
    left = left_over(PARTS, position(cursor=[1, 40, 4]), INDEXED)
    assert left[0] == ShardPart("s0", start=4, stop=7, span=(40, 70))
    assert samples(left) == ALL[2:]
    assert left_over(PARTS, position(cursor=[1, 70, 7]), INDEXED) == PARTS[1:]  # read to its end


def test_buffered_samples_come_back_merged_into_runs() -> None:
    held = [[0, 30, 40], [0, 50, 60], [0, 40, 50], [1, 0, 10]]  # s0's 3, 5, 4 and s1's 0
    left = left_over(
        PARTS,
        position(cursor=[2, 10, 1], buffer=held[:3], ahead=held[3:], shards=["s0", "s1"]),
        INDEXED,
    )
    assert left[:2] == [
        ShardPart("s0", start=3, stop=6, span=(30, 60)),
        ShardPart("s1", start=0, stop=1, span=(0, 10)),
    ]
    assert left[2] == ShardPart("s1", start=1, stop=5, span=(10, 50))


def test_a_changed_or_compressed_shard_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"^s0: no sample at bytes 31\.\.40 \(has the shard changed\?\)"
    ):
        left_over(PARTS, position(buffer=[[0, 31, 40]], shards=["s0"]), INDEXED)
    with pytest.raises(ValueError, match=r"^s0: no sample at bytes 30\.\.45"):
        left_over(PARTS, position(buffer=[[0, 30, 45]], shards=["s0"]), INDEXED)
    with pytest.raises(
        ValueError, match=r"^s0: no sample 4 at byte 41 \(has the shard changed\?\)"
    ):
        left_over(PARTS, position(cursor=[1, 41, 4]), INDEXED)
    with pytest.raises(ValueError, match=r"^s0: no sample 1 at byte 10"):
        left_over(PARTS, position(cursor=[1, 10, 1]), INDEXED)  # before the part


def test_a_streamed_shard_is_left_without_byte_spans() -> None:
    """A gzip (or not indexed) shard: the rest of a part k of m is every m-th sample."""
    gzip = Known("s1", "s2")
    left = left_over(PARTS, position(cursor=[3, 30, 3], buffer=[[0, 0, 10]], shards=["s1"]), gzip)
    assert left[0] == ShardPart("s1", start=0, stop=1)  # no span: read from the start
    assert left[1] == ShardPart("s2", 0, 3, start=4, stop=None)  # samples 4 and 7 of s2 (1 of 3)
    assert samples([ShardPart("s2", 1, 3)], streamed=True) == [("s2", 1), ("s2", 4), ("s2", 7)]


@pytest.mark.parametrize("delivered", [0, 1, 4, 5, 9, 12])
def test_a_replay_leaves_what_the_run_did_not_deliver(delivered: int) -> None:
    """The replay's rest plus what the same run delivered is every sample, once."""
    run = EpochRun(_Reader(), PARTS, buffer_size=3, seed=5)
    out = [
        (loc.sample["__url__"], loc.nth)
        for _, loc in zip(range(delivered), run.located(), strict=False)
    ]
    rest = left_over(
        PARTS, replay(PARTS, INDEXED, buffer_size=3, seed=5, delivered=delivered), INDEXED
    )
    assert sorted(out + samples(rest)) == sorted(ALL)
    assert len(samples(rest)) == len(ALL) - delivered


def test_a_replay_past_the_parts_is_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"^a worker's parts hold 13 samples; its rank's state says it delivered 14$",
    ):
        replay(PARTS, INDEXED, buffer_size=0, seed=0, delivered=14)


def test_a_replay_to_a_limit_past_the_parts_leaves_nothing() -> None:
    """strict=False (a limit_samples quota the parts cannot fill): the epoch's end."""
    position = replay(PARTS, INDEXED, buffer_size=3, seed=5, delivered=14, strict=False)
    assert left_over(PARTS, position, INDEXED) == []
    short = replay(PARTS, INDEXED, buffer_size=3, seed=5, delivered=4, strict=False)
    assert len(samples_of(left_over(PARTS, short, INDEXED), INDEXED)) == len(ALL) - 4


def test_samples_of_reads_parts_as_the_reader_does() -> None:
    assert samples_of(PARTS, INDEXED) == ALL
    assert samples_of([ShardPart("s2", 1, 3)], Known("s2")) == [("s2", 1), ("s2", 4), ("s2", 7)]
    assert samples_of([ShardPart("s1", start=3, stop=None)], INDEXED) == [("s1", 3), ("s1", 4)]


def test_units_of_merges_runs_by_shard() -> None:
    """Samples in any order: sample ranges by shard (first seen first), with byte spans."""
    units = units_of([("s1", 4), ("s0", 3), ("s0", 2), ("s1", 0), ("s0", 5)], INDEXED)
    assert units == [
        ShardPart("s1", start=4, stop=5, span=(40, 50)),
        ShardPart("s1", start=0, stop=1, span=(0, 10)),
        ShardPart("s0", start=2, stop=4, span=(20, 40)),
        ShardPart("s0", start=5, stop=6, span=(50, 60)),
    ] or units == [
        ShardPart("s1", start=0, stop=1, span=(0, 10)),
        ShardPart("s1", start=4, stop=5, span=(40, 50)),
        ShardPart("s0", start=2, stop=4, span=(20, 40)),
        ShardPart("s0", start=5, stop=6, span=(50, 60)),
    ]
    assert units_of([("s2", 1), ("s2", 2)], Known("s2")) == [ShardPart("s2", start=1, stop=3)]
    subset = ALL[::2]
    assert sorted(samples_of(units_of(subset, INDEXED), INDEXED)) == sorted(subset)


def test_share_keeps_whole_units_and_cuts_the_others_evenly() -> None:
    units = [
        ShardPart("s0", start=0, stop=4, span=(0, 40)),
        ShardPart("s2", start=2, stop=7, span=(20, 70)),
    ]
    mine = [share(units, 3, w, even=True) for w in range(3)]
    assert [sum(size_of(u) or 0 for u in m) for m in mine] == [3, 3, 3]
    assert mine[0] == [ShardPart("s0", start=0, stop=3)]
    assert mine[1] == [ShardPart("s0", start=3, stop=4), ShardPart("s2", start=2, stop=4)]
    assert mine[2] == [ShardPart("s2", start=4, stop=7)]
    assert share(units, 1, 0, even=True) == units  # whole: spans kept
    streamed = [ShardPart("s1"), ShardPart("s0", start=1, stop=3)]
    assert share(streamed, 2, 1, even=True) == [streamed[1]]  # a count unknown: unit by unit


def test_buffer_seeds_are_stable_across_releases() -> None:
    """A checkpoint of an earlier version replays only if the seeds stay the same."""
    assert buffer_seed_of(17, 3, 5) == 10725327631256559591


class _Reader:
    """The samples of a part, read for real (by index), as EpochRun asks."""

    def samples(self, item: Any, *, spans: bool = False, at: Any = None) -> Any:
        from shardpipes._core.samples import Located
        from shardpipes._core.split import part_samples

        ranges = RANGES[item.url]
        for i in part_samples(len(ranges), item):
            yield Located({"__url__": item.url}, *ranges[i], i)

    def fetch(self, url: str, spans: Any) -> Any:
        raise AssertionError

    def upcoming(self, parts: Any) -> None:
        pass


def test_share_without_even_leaves_nothing_out() -> None:
    units = [ShardPart("s0", start=0, stop=4), ShardPart("s2", start=2, stop=7)]
    mine = [share(units, 2, w, even=False) for w in range(2)]
    assert [sum(size_of(u) or 0 for u in m) for m in mine] == [4, 5]
    assert share(units[:1], 5, 4, even=False) == [ShardPart("s0", start=3, stop=4)]
    assert share(units[:1], 5, 4, even=True) == []  # fewer than one each: left out


def test_a_streamed_part_with_a_stop_ends_there() -> None:
    """Every 3rd sample from 1 of a streamed shard, below its stop (and the shard's end)."""
    assert list(part_indices(ShardPart("s2", 1, 3, start=0, stop=6), 9, streamed=True)) == [1, 4]
    assert list(part_indices(ShardPart("s2", 1, 3, start=0, stop=20), 9, streamed=True)) == [
        1,
        4,
        7,
    ]
    streamed = Known("s2")
    left = left_over(
        [ShardPart("s2", 0, 2, start=0, stop=7)],
        {"done": False, "draining": False, "buffer": [], "ahead": [], "shards": [],
         "cursor": [1, 20, 2]},
        streamed,
    )  # fmt: skip
    assert left == [ShardPart("s2", 0, 2, start=2, stop=7)]
    assert samples_of(left, streamed) == [("s2", 2), ("s2", 4), ("s2", 6)]
