"""shardpipes.fs.readahead.ReadAhead driven directly, over files held in memory.

Storage here is a pair of callables over a dict (the fetch and size that ReadAhead is
given); the scheduling under test is the real one, with its thread pool. Fetches can be
held at a gate, so that what the scheduler asked for is seen before anything comes back
(what it asks for only changes as blocks come back or the reader reads): no sleeps.

What mutation testing found that the end-to-end tests (tests/cloud/test_readahead.py)
leave open: the size of each block asked for, the budget and the requests in flight at
their edges, plans kept and dropped, reads outside the plan, the end of a file, failures
and retries, the cache, chained URLs, and a forked child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from shardpipes.errors import ShardNotFoundError, StorageAccessError, StorageError
from shardpipes.fs.cache import ShardCache
from shardpipes.fs.readahead import FIRST_BLOCK, MAX_BLOCK, MIN_BLOCK, Read, ReadAhead
from shardpipes.fs.retry import RetryPolicy

MiB = 2**20
WAIT = 30  # seconds at most for what the pool's threads do (a timeout, not a sleep)

pytestmark = pytest.mark.timeout(60)  # a read that waits forever fails, not hangs the run


def payload(size: int, seed: int = 0) -> bytes:
    """``size`` bytes that differ at every offset modulo 251 (a misplaced block shows)."""
    pattern = bytes((i + seed) % 251 for i in range(251))
    return (pattern * (size // 251 + 1))[:size]


class Gate:
    """Where fetches wait: open, closed, or closed but letting a number of them through."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._open, self._tickets = True, 0

    def set(self) -> None:
        with self._changed:
            self._open = True
            self._changed.notify_all()

    def clear(self) -> None:
        with self._changed:
            self._open = False

    def allow(self, n: int) -> None:
        with self._changed:
            self._tickets += n
            self._changed.notify_all()

    def wait(self, timeout: float) -> bool:
        with self._changed:
            through = self._changed.wait_for(lambda: self._open or self._tickets > 0, timeout)
            if through and not self._open:
                self._tickets -= 1
            return through


class Storage:
    """Files in memory, read by ranged fetches and sized by one call each; what was asked.

    ``gate``: fetches wait at it (open by default). ``failures``: exceptions that the next
    fetches of ``(url, start)`` raise, in order. ``past_end``: what a fetch from the end of
    a file on does: ``"empty"`` (HTTP's 416) or ``"raise"`` (S3's InvalidRange).
    """

    def __init__(self, files: dict[str, bytes], past_end: str = "empty") -> None:
        self.files = files
        self.past_end = past_end
        self.gate = Gate()
        self.failures: dict[tuple[str, int], list[BaseException]] = {}
        self.size_failures: dict[str, list[BaseException]] = {}
        self.gets: list[tuple[str, int, int]] = []
        self.sizes: list[str] = []
        self.resolved: list[str] = []
        self.size_after_gets = 0  # a size request waits until this many fetches were asked
        self.in_flight = self.most_in_flight = 0
        self.changed = threading.Condition()

    def resolve(self, url: str) -> tuple[Any, str]:
        with self.changed:
            self.resolved.append(url)
        return self, url

    def fetch(self, filesystem: Any, url: str, path: str, start: int, end: int) -> bytes:
        assert filesystem is self and path == url
        with self.changed:
            self.gets.append((url, start, end))
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.changed.notify_all()
        try:
            assert self.gate.wait(WAIT)
            queued = self.failures.get((url, start))
            if queued:
                raise queued.pop(0)
            data = self.files[url]
            if start >= len(data) and self.past_end == "raise":
                msg = "InvalidRange: the range is not satisfiable"
                raise OSError(msg)
            return data[start:end]
        finally:
            with self.changed:
                self.in_flight -= 1
                self.changed.notify_all()

    def size(self, filesystem: Any, path: str) -> int:
        assert filesystem is self
        with self.changed:
            self.sizes.append(path)
        if self.size_after_gets:
            self.wait_for_gets(self.size_after_gets)
        queued = self.size_failures.get(path)
        if queued:
            raise queued.pop(0)
        return len(self.files[path])

    def wait_for_gets(self, n: int) -> None:
        """Wait until ``n`` fetches were asked for."""
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.gets) >= n, WAIT), self.gets

    def ranges(self, url: str) -> list[tuple[int, int]]:
        with self.changed:
            return sorted((s, e) for u, s, e in self.gets if u == url)


@pytest.fixture
def storage() -> Iterator[Storage]:
    made = Storage({})
    yield made
    made.gate.set()  # never leave the process's fetching threads waiting


def ahead_of(storage: Storage, **options: Any) -> ReadAhead:
    retry = options.pop("retry", RetryPolicy(retries=2, backoff=0.0))
    cache = options.pop("cache", None)
    return ReadAhead(storage.resolve, storage.fetch, storage.size, retry, cache, **options)


def whole(url: str, key: object = None) -> Read:
    return Read(url if key is None else key, url, lambda: ((0, None),))


def ranged(url: str, *ranges: tuple[int, int | None]) -> Read:
    return Read((url, ranges), url, lambda: ranges)


def read_exactly(stream: Any, n: int) -> bytes:
    """``n`` bytes (fewer only at the end): a read gives what has come, so read on."""
    parts = []
    while n > 0 and (data := stream.read(n)):
        parts.append(data)
        n -= len(data)
    return b"".join(parts)


# -- what is read -----------------------------------------------------------------------------


SIZES = [1, FIRST_BLOCK - 1, FIRST_BLOCK, FIRST_BLOCK + 1, 3 * FIRST_BLOCK + 5]


@pytest.mark.parametrize(
    ("size", "past_end"),
    [(0, "empty")] + [(size, how) for size in SIZES for how in ("empty", "raise")],
)
def test_a_whole_file_reads_exactly(storage: Storage, size: int, past_end: str) -> None:
    """Every byte once, in order; a block asked for past the end comes back empty.

    Past the end, HTTP says 416 (no bytes), S3 refuses the range (an error), which counts
    as no bytes once the size is known.
    """
    data = payload(size)
    storage.files["s3://b/f"] = data
    storage.past_end = past_end
    with ahead_of(storage).open(whole("s3://b/f")) as stream:
        assert stream.read() == data
        assert stream.read() == b""
        assert stream.read(10) == b""
        assert stream.tell() == size


def test_reads_of_any_length_join_up(storage: Storage) -> None:
    data = payload(5 * MiB + 77)
    storage.files["s3://b/f"] = data
    stream = ahead_of(storage).open(whole("s3://b/f"))
    assert stream.read(0) == b""
    assert stream.tell() == 0
    got = []
    while chunk := stream.read(300_007):
        assert len(chunk) == min(300_007, len(data) - sum(map(len, got)))
        got.append(chunk)
    assert b"".join(got) == data
    assert stream.read(0) == b""
    stream.close()


def test_a_waited_on_read_starts_small_and_doubles(storage: Storage) -> None:
    """1 MiB twice, then twice as much up to the block; the size is asked for once, alongside."""
    data = payload(20 * MiB)
    storage.files["s3://b/f"] = data
    ahead = ahead_of(storage)  # budget 64 MiB, 4 in flight: blocks of 8 MiB
    assert ahead.block == MAX_BLOCK
    with ahead.open(whole("s3://b/f")) as stream:
        assert stream.read() == data
    assert storage.ranges("s3://b/f") == [
        (0, MiB), (MiB, 2 * MiB), (2 * MiB, 4 * MiB), (4 * MiB, 8 * MiB), (8 * MiB, 16 * MiB),
        (16 * MiB, 20 * MiB),
    ]  # fmt: skip
    assert storage.sizes == ["s3://b/f"]


def test_the_first_two_blocks_go_out_before_the_size_is_known(storage: Storage) -> None:
    """The size is asked for alongside: it comes back only once both blocks were asked for."""
    data = payload(5 * MiB)
    storage.files["s3://b/f"] = data
    storage.size_after_gets = 2
    with ahead_of(storage).open(whole("s3://b/f")) as stream:
        assert stream.read() == data
    assert storage.ranges("s3://b/f")[:2] == [(0, MiB), (MiB, 2 * MiB)]


def test_block_sizes_follow_the_budget(storage: Storage) -> None:
    assert ahead_of(storage, budget=24 * MiB, concurrency=3).block == 4 * MiB
    assert ahead_of(storage, budget=0, concurrency=1).block == MIN_BLOCK
    assert ahead_of(storage, budget=2**40, concurrency=1).block == MAX_BLOCK


def test_only_the_planned_ranges_are_fetched(storage: Storage) -> None:
    """Ranges with ends: only their bytes, and no size asked for (without a cache)."""
    data = payload(4 * MiB)
    storage.files["s3://b/f"] = data
    read = ranged("s3://b/f", (100, 300), (2 * MiB, 2 * MiB + 10))
    with ahead_of(storage).open(read) as stream:
        assert stream.seek(100) == 100
        assert stream.read(200) == data[100:300]
        stream.seek(2 * MiB)
        assert stream.read(10) == data[2 * MiB : 2 * MiB + 10]
    assert storage.ranges("s3://b/f") == [(100, 300), (2 * MiB, 2 * MiB + 10)]
    assert storage.sizes == []


def test_reading_outside_the_plan_reads_on_to_the_end(storage: Storage) -> None:
    data = payload(3 * MiB)
    storage.files["s3://b/f"] = data
    with ahead_of(storage).open(ranged("s3://b/f", (1000, 5000))) as stream:
        stream.seek(1000)
        assert stream.read(4000) == data[1000:5000]
        assert stream.read(100) == data[5000:5100]  # past the planned range
        stream.seek(10)
        assert stream.read(20) == data[10:30]  # before it
        assert stream.read() == data[30:]
    assert storage.sizes == ["s3://b/f"]  # needed once the plan said "to the end"
    assert storage.ranges("s3://b/f")[:3] == [(10, 10 + MiB), (1000, 5000), (5000, 5000 + MiB)]


def test_a_read_gives_what_has_come_rather_than_wait_for_the_next_block(storage: Storage) -> None:
    """The tar reader parses the first block's samples while the second is on its way."""
    data = payload(3 * MiB)
    storage.files["s3://b/f"] = data
    storage.gate.clear()
    storage.gate.allow(1)  # the first block comes back; the rest wait
    ahead = ahead_of(storage, concurrency=1)
    with ahead.open(ranged("s3://b/f", (0, 3 * MiB))) as stream:
        assert stream.read(2 * MiB) == data[:MiB]
        storage.gate.set()
        assert read_exactly(stream, 2 * MiB) == data[MiB:]
        assert stream.read(1) == b""


def test_seeking(storage: Storage) -> None:
    data = payload(10_000)
    storage.files["s3://b/f"] = data
    with ahead_of(storage).open(ranged("s3://b/f", (0, 4000))) as stream:
        assert stream.seekable() and stream.readable()
        assert stream.seek(-100, 2) == 9900
        assert stream.read() == data[-100:]
        assert stream.seek(0) == 0
        assert stream.seek(50, 1) == 50
        assert stream.seek(25, 1) == 75
        assert stream.read(5) == data[75:80]
        assert stream.seek(0, 2) == 10_000
        assert stream.read() == b""
        with pytest.raises(ValueError, match="negative seek position -1"):
            stream.seek(-1)
        with pytest.raises(ValueError, match="negative seek position -5"):
            stream.seek(-10_005, 2)
        assert stream.tell() == 10_000


def test_a_file_shorter_than_its_ranges_ends_where_it_ends(storage: Storage) -> None:
    """Blocks come back short: the file's end is where the first short one ends."""
    data = payload(3 * MiB + 10)
    storage.files["s3://b/f"] = data
    with ahead_of(storage, budget=4 * MiB).open(ranged("s3://b/f", (0, 6 * MiB))) as stream:
        assert stream.read() == data
        assert stream.read(1) == b""
        assert stream.seek(0, 2) == len(data)  # found from the short block, not asked for
    assert storage.sizes == []


# -- the budget and the requests in flight ------------------------------------------------------


def test_blocks_are_asked_for_up_to_the_budget(storage: Storage) -> None:
    """Held at the gate, nothing comes back: what was asked is exactly what the budget allows."""
    data = payload(10 * MiB)
    storage.files["s3://b/f"] = data
    storage.gate.clear()
    ahead = ahead_of(storage, budget=3 * MiB, concurrency=4)  # blocks of 1 MiB
    stream = ahead.open(ranged("s3://b/f", (0, 10 * MiB)))
    storage.wait_for_gets(3)
    assert ahead.peak == 3 * MiB
    storage.gate.set()
    assert stream.read() == data
    assert ahead.peak == 3 * MiB
    assert storage.most_in_flight <= 3
    stream.close()


def test_no_more_requests_in_flight_than_the_concurrency(storage: Storage) -> None:
    """Two at once: blocks of 1, 1, then 2 MiB once one of the first two has come back."""
    data = payload(16 * MiB)
    storage.files["s3://b/f"] = data
    storage.gate.clear()
    ahead = ahead_of(storage, budget=64 * MiB, concurrency=2)
    stream = ahead.open(ranged("s3://b/f", (0, 16 * MiB)))
    storage.wait_for_gets(2)
    assert ahead.peak == 2 * MiB  # the third block waits for one of the first two
    storage.gate.allow(1)  # one comes back: one more goes out
    storage.wait_for_gets(3)
    ahead.plan([])  # returns once the scheduler is done (it takes the same lock)
    assert ahead.peak == 4 * MiB
    storage.gate.set()
    assert read_exactly(stream, 16 * MiB) == data
    assert storage.most_in_flight == 2
    stream.close()


def test_with_no_budget_one_block_at_a_time(storage: Storage) -> None:
    data = payload(5 * MiB + 3)
    storage.files["s3://b/f"] = data
    ahead = ahead_of(storage, budget=0)
    with ahead.open(whole("s3://b/f")) as stream:
        assert stream.read() == data
    assert ahead.peak == MIN_BLOCK


def test_with_no_budget_the_planned_ranges_are_read_on_demand(storage: Storage) -> None:
    """Each block is asked for as the reader reaches it, where the plan said: nothing else."""
    data = payload(4 * MiB)
    storage.files["s3://b/f"] = data
    ahead = ahead_of(storage, budget=0)
    with ahead.open(ranged("s3://b/f", (0, MiB + 10), (2 * MiB, 3 * MiB))) as stream:
        assert read_exactly(stream, MiB + 10) == data[: MiB + 10]
        stream.seek(2 * MiB)
        assert read_exactly(stream, MiB) == data[2 * MiB : 3 * MiB]
    assert storage.ranges("s3://b/f") == [(0, MiB), (MiB, MiB + 10), (2 * MiB, 3 * MiB)]
    assert storage.sizes == []
    assert ahead.peak == MIN_BLOCK


def test_the_next_read_is_fetched_ahead_in_full_blocks(storage: Storage) -> None:
    """A planned read: blocks of the full size from its start; opened, none is fetched again."""
    first, second = payload(100, 1), payload(20 * MiB, 2)
    storage.files |= {"s3://b/1": first, "s3://b/2": second}
    ahead = ahead_of(storage)  # blocks of 8 MiB
    ahead.plan([ranged("s3://b/2", (0, 20 * MiB))])
    with ahead.open(ranged("s3://b/1", (0, 100))) as stream:
        assert stream.read() == first
    storage.wait_for_gets(4)
    with ahead.open(ranged("s3://b/2", (0, 20 * MiB))) as stream:
        assert read_exactly(stream, 20 * MiB) == second
    assert storage.ranges("s3://b/2") == [(0, 8 * MiB), (8 * MiB, 16 * MiB), (16 * MiB, 20 * MiB)]


def test_reads_are_asked_for_in_the_order_of_the_plan(storage: Storage) -> None:
    """A planned read is not even located before the reads ahead of it have all gone out."""
    data = payload(10 * MiB)
    storage.files |= {"s3://b/f": data, "s3://b/g": b"g" * 10}
    read_so_far: list[int] = []  # by the reader, as g is located

    def locate_g() -> tuple[tuple[int, int | None], ...]:
        read_so_far.append(done)
        return ((0, 10),)

    done = 0
    storage.gate.clear()
    ahead = ahead_of(storage, budget=3 * MiB, concurrency=4)  # blocks of 1 MiB
    stream = ahead.open(ranged("s3://b/f", (0, 10 * MiB)))
    ahead.plan([Read("g", "s3://b/g", locate_g)])
    storage.gate.set()
    while chunk := stream.read(MiB):
        done += len(chunk)
    stream.close()
    with ahead.open(Read("g", "s3://b/g", locate_g)) as stream:
        assert stream.read(10) == b"g" * 10
    assert done == len(data)
    assert read_so_far[0] >= 7 * MiB  # f's last block goes out once 7 MiB were read


def test_a_read_waited_for_goes_out_over_the_budget(storage: Storage) -> None:
    """The budget is taken by the next read, fetched ahead: the one the reader waits for goes."""
    storage.files |= {"s3://b/f": payload(MiB), "s3://b/g": payload(4 * MiB, 1)}
    ahead = ahead_of(storage, budget=2 * MiB, concurrency=4)  # blocks of 1 MiB
    ahead.plan([ranged("s3://b/g", (0, 4 * MiB))])
    storage.wait_for_gets(2)
    with ahead.open(ranged("s3://b/f", (0, MiB))) as stream:
        assert stream.read(MiB) == payload(MiB)
    assert ahead.peak == 3 * MiB


def test_a_read_planned_again_keeps_its_blocks(storage: Storage) -> None:
    data = payload(2 * MiB)
    storage.files |= {"s3://b/f": data, "s3://b/g": b"g"}
    storage.gate.clear()
    ahead = ahead_of(storage, budget=4 * MiB, concurrency=2)
    ahead.plan([ranged("s3://b/f", (0, 2 * MiB))])
    storage.wait_for_gets(2)
    ahead.plan([ranged("s3://b/f", (0, 2 * MiB)), ranged("s3://b/g", (0, 1))])
    storage.gate.set()
    with ahead.open(ranged("s3://b/f", (0, 2 * MiB))) as stream:
        assert read_exactly(stream, 2 * MiB) == data
    assert storage.ranges("s3://b/f") == [(0, MiB), (MiB, 2 * MiB)]


def test_a_read_no_longer_planned_is_dropped(storage: Storage) -> None:
    """Its blocks go back to the budget; opened later, it is fetched anew."""
    data, other = payload(2 * MiB), payload(MiB, 3)
    storage.files |= {"s3://b/f": data, "s3://b/g": other}
    storage.gate.clear()
    ahead = ahead_of(storage, budget=2 * MiB, concurrency=4)  # blocks of 1 MiB
    ahead.plan([ranged("s3://b/f", (0, 2 * MiB))])
    storage.wait_for_gets(2)
    ahead.plan([ranged("s3://b/g", (0, MiB))])
    storage.gate.set()
    storage.wait_for_gets(3)  # g's block: the budget was given back as f's came back
    with ahead.open(ranged("s3://b/g", (0, MiB))) as stream:
        assert stream.read(MiB) == other
    with ahead.open(ranged("s3://b/f", (0, 2 * MiB))) as stream:
        assert read_exactly(stream, 2 * MiB) == data
    assert storage.ranges("s3://b/f") == [(0, MiB), (0, MiB), (MiB, 2 * MiB), (MiB, 2 * MiB)]
    assert storage.ranges("s3://b/g") == [(0, MiB)]


def test_closing_a_stream_gives_its_budget_to_the_next_read(storage: Storage) -> None:
    """All of it: the next read's block goes out once nothing is held (over budget or not)."""
    data, other = payload(4 * MiB), payload(MiB, 3)
    storage.files |= {"s3://b/f": data, "s3://b/g": other}
    storage.gate.clear()
    ahead = ahead_of(storage, budget=MiB, concurrency=4)  # blocks of 1 MiB
    stream = ahead.open(ranged("s3://b/f", (0, 4 * MiB)))
    ahead.plan([ranged("s3://b/g", (0, MiB))])
    storage.wait_for_gets(1)
    stream.close()  # f's block is given back as it comes
    storage.gate.set()
    storage.wait_for_gets(2)
    assert storage.ranges("s3://b/g") == [(0, MiB)]
    with ahead.open(ranged("s3://b/g", (0, MiB))) as again:
        assert again.read(MiB) == other
    assert storage.ranges("s3://b/f") == [(0, MiB)]


def test_closing_drops_everything(storage: Storage) -> None:
    data = payload(3 * MiB)
    storage.files["s3://b/f"] = data
    storage.gate.clear()
    ahead = ahead_of(storage, budget=2 * MiB, concurrency=4)
    ahead.plan([ranged("s3://b/f", (0, 3 * MiB))])
    storage.wait_for_gets(2)
    ahead.close()
    storage.gate.set()
    with ahead.open(ranged("s3://b/f", (0, 3 * MiB))) as stream:
        assert read_exactly(stream, 3 * MiB) == data
        ahead.close()  # an epoch abandoned; its reader's stream is closed after
    assert storage.ranges("s3://b/f").count((0, MiB)) == 2


# -- failures ---------------------------------------------------------------------------------


def test_a_transient_failure_is_fetched_again(storage: Storage) -> None:
    data = payload(3 * MiB)
    storage.files["s3://b/f"] = data
    storage.failures[("s3://b/f", MiB)] = [ConnectionResetError("reset"), TimeoutError()]
    with ahead_of(storage).open(whole("s3://b/f")) as stream:
        assert stream.read() == data
    assert storage.ranges("s3://b/f").count((MiB, 2 * MiB)) == 3


def test_a_failure_past_the_retries_names_the_url_and_offset(storage: Storage) -> None:
    storage.files["s3://b/f"] = payload(3 * MiB)
    storage.failures[("s3://b/f", MiB)] = [ConnectionResetError("reset")] * 3
    with ahead_of(storage).open(whole("s3://b/f")) as stream:
        assert len(stream.read(MiB)) == MiB
        with pytest.raises(StorageError) as caught:
            stream.read(1)
    assert caught.value.url == "s3://b/f"
    assert caught.value.offset == MiB
    assert "read failed after 2 retries: ConnectionResetError: reset" in str(caught.value)


def test_a_later_blocks_failure_is_raised_where_it_is_read(storage: Storage) -> None:
    """Ranges with ends (no size asked for): a failed block is not taken for the file's end."""
    data = payload(3 * MiB)
    storage.files["s3://b/f"] = data
    storage.failures[("s3://b/f", MiB)] = [FileNotFoundError("gone")]
    with ahead_of(storage).open(ranged("s3://b/f", (0, 3 * MiB))) as stream:
        assert stream.read(MiB) == data[:MiB]
        with pytest.raises(ShardNotFoundError):
            stream.read(1)


def test_a_missing_file_is_not_retried(storage: Storage) -> None:
    storage.files["s3://b/f"] = payload(100)
    storage.failures[("s3://b/f", 0)] = [FileNotFoundError("gone")]
    stream = ahead_of(storage).open(ranged("s3://b/f", (0, 100)))
    with pytest.raises(ShardNotFoundError):
        stream.read()
    assert storage.ranges("s3://b/f") == [(0, 100)]
    stream.close()


def test_a_size_that_cannot_be_found_fails_the_open(storage: Storage) -> None:
    storage.files["s3://b/f"] = payload(100)
    storage.size_failures["s3://b/f"] = [PermissionError("denied")]
    with pytest.raises(StorageAccessError):
        ahead_of(storage).open(whole("s3://b/f"))
    storage.size_failures["s3://b/f"] = [ConnectionResetError("reset")] * 3
    with pytest.raises(StorageError, match="open failed after 2 retries") as caught:
        ahead_of(storage).open(whole("s3://b/f"))
    assert caught.value.url == "s3://b/f" and caught.value.offset == 0


def test_a_size_that_cannot_be_found_fails_a_read_to_the_end(storage: Storage) -> None:
    """Planned with an end, read on past it: the size it then needs fails the read.

    The first two blocks from there go out before the size is known; the third waits for it.
    """
    data = payload(4 * MiB)
    storage.files["s3://b/f"] = data
    storage.size_failures["s3://b/f"] = [PermissionError("denied")]
    with ahead_of(storage).open(ranged("s3://b/f", (0, 10))) as stream:
        assert stream.read(10) == data[:10]
        assert read_exactly(stream, 2 * MiB) == data[10 : 2 * MiB + 10]
        with pytest.raises(StorageAccessError):
            stream.read(1)
    assert storage.ranges("s3://b/f") == [(0, 10), (10, MiB + 10), (MiB + 10, 2 * MiB + 10)]


def test_a_read_that_cannot_be_located_fails_the_open(storage: Storage) -> None:
    def locate() -> tuple[tuple[int, int | None], ...]:
        msg = "bad index"
        raise ValueError(msg)

    ahead = ahead_of(storage)
    with pytest.raises(ValueError, match="bad index"):
        ahead.open(Read("k", "s3://b/f", locate))
    assert storage.gets == []
    storage.files["s3://b/g"] = b"g" * 10
    with ahead.open(ranged("s3://b/g", (0, 10))) as stream:  # the next read goes on
        assert stream.read(10) == b"g" * 10


def test_a_dropped_reads_retries_stop(storage: Storage) -> None:
    """Closed while its block is being retried: no further try (nobody would read it)."""
    storage.files |= {"s3://b/f": payload(10), "s3://b/g": payload(10, 1)}
    storage.failures[("s3://b/f", 0)] = [ConnectionResetError("reset")] * 50
    storage.gate.clear()
    ahead = ahead_of(storage, concurrency=1, retry=RetryPolicy(retries=50, backoff=0.0))
    ahead.plan([ranged("s3://b/f", (0, 10))])
    storage.wait_for_gets(1)
    ahead.close()
    ahead.plan([ranged("s3://b/g", (0, 10))])  # asked for once f's block is done
    storage.gate.set()
    storage.wait_for_gets(2)
    assert storage.ranges("s3://b/f") == [(0, 10)]
    with ahead.open(ranged("s3://b/g", (0, 10))) as stream:
        assert stream.read() == payload(10, 1)


# -- the cache --------------------------------------------------------------------------------


def test_the_cache_is_filled_and_then_serves_the_blocks(storage: Storage, tmp_path: Path) -> None:
    data = payload(3 * MiB + 5)
    storage.files["s3://b/f"] = data
    cache = ShardCache(tmp_path, 10 * MiB)
    with ahead_of(storage, cache=cache).open(whole("s3://b/f")) as stream:
        assert stream.read() == data
    entry = cache.lookup("s3://b/f")
    assert entry is not None and entry.read_bytes() == data
    storage.gets.clear()
    with ahead_of(storage, cache=cache).open(whole("s3://b/f")) as stream:
        assert stream.read() == data
    assert storage.gets == []


def test_the_cache_is_filled_from_parts(storage: Storage, tmp_path: Path) -> None:
    """A part of a shard (with an end): its size is asked for, for the cache's entry."""
    data = payload(2 * MiB)
    storage.files["s3://b/f"] = data
    cache = ShardCache(tmp_path, 10 * MiB)
    with ahead_of(storage, cache=cache).open(ranged("s3://b/f", (500, 1500))) as stream:
        stream.seek(500)
        assert stream.read(1000) == data[500:1500]
    assert storage.sizes == ["s3://b/f"]
    assert cache.read("s3://b/f", 500, 1000) == data[500:1500]
    assert cache.read("s3://b/f", 499, 2) is None
    storage.gets.clear()
    with ahead_of(storage, cache=cache).open(ranged("s3://b/f", (500, 1500))) as stream:
        stream.seek(500)
        assert stream.read(1000) == data[500:1500]
    assert storage.gets == []


def test_a_read_planned_past_the_files_end_stops_there(storage: Storage, tmp_path: Path) -> None:
    """With a cache the size is found; blocks asked for after that end at the file's end."""
    data = payload(3 * MiB + 10)
    storage.files["s3://b/f"] = data
    storage.gate.clear()
    ahead = ahead_of(storage, budget=2 * MiB, cache=ShardCache(tmp_path, 10 * MiB))
    stream = ahead.open(ranged("s3://b/f", (0, 6 * MiB)))  # sized before open returns
    storage.gate.set()
    assert read_exactly(stream, 6 * MiB) == data
    stream.close()
    assert storage.ranges("s3://b/f") == [
        (0, MiB), (MiB, 2 * MiB), (2 * MiB, 3 * MiB), (3 * MiB, 3 * MiB + 10)
    ]  # fmt: skip


# -- chained URLs ---------------------------------------------------------------------------


def test_a_chained_url_is_opened_whole(storage: Storage) -> None:
    """``a::b`` URLs are read through their filesystem, the next one opened ahead."""
    memory = fsspec.filesystem("memory")
    one, two = payload(5000, 1), payload(7000, 2)
    memory.pipe({"/readahead-unit/1.tar": one, "/readahead-unit/2.tar": two})
    urls = [
        "simplecache::memory://readahead-unit/1.tar",
        "simplecache::memory://readahead-unit/2.tar",
    ]
    resolved: list[str] = []
    opened = threading.Event()

    def resolve(url: str) -> tuple[Any, str]:
        resolved.append(url)
        if url == urls[1]:
            opened.set()
        return memory, url.rpartition("memory:/")[2]

    ahead = ReadAhead(resolve, storage.fetch, storage.size, RetryPolicy(retries=0), None)
    try:
        with ahead.open(whole(urls[0])) as stream:
            ahead.plan([whole(urls[1])])
            assert opened.wait(WAIT)  # while the first is open
            assert stream.read(10) == one[:10]
            stream.seek(4000)
            assert stream.read() == one[4000:]
            assert stream.tell() == 5000
        with ahead.open(whole(urls[1])) as stream:
            assert stream.read() == two
        assert sorted(resolved) == urls
        assert storage.gets == [] and storage.sizes == []
        assert ahead.peak == 0  # no block held: their filesystem reads them
    finally:
        memory.rm("/readahead-unit", recursive=True)


class Recording(LocalFileSystem):
    """The local filesystem, keeping the files it opens (to see them closed)."""

    cachable = False

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[Any] = []

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        file = super()._open(path, mode, **kwargs)
        self.opened.append(file)
        return file


def test_a_chained_reads_file_is_closed_with_its_stream(storage: Storage, tmp_path: Path) -> None:
    data = payload(5000)
    (tmp_path / "a.tar").write_bytes(data)
    local = Recording()
    ahead = ReadAhead(
        lambda url: (local, url.rpartition("file://")[2]), storage.fetch, storage.size,
        RetryPolicy(retries=0), None,
    )  # fmt: skip
    with ahead.open(whole(f"simplecache::file://{tmp_path}/a.tar")) as stream:
        assert stream.read() == data
        (file,) = local.opened
        assert not file.closed
    assert file.closed
    with pytest.raises(ShardNotFoundError):
        ahead.open(whole(f"simplecache::file://{tmp_path}/gone.tar")).read()


@pytest.mark.parametrize("chained", [False, True], ids=["ranged", "chained"])
def test_a_read_is_counted_once(storage: Storage, tmp_path: Path, chained: bool) -> None:
    """``READ_STATS``: one open and the bytes read, once, chained (``simplecache::``) or not."""
    from shardpipes.fs import READ_STATS

    data = payload(100_000)
    if chained:
        (tmp_path / "a.tar").write_bytes(data)
        ahead = ReadAhead(
            lambda url: (LocalFileSystem(), url.rpartition("file://")[2]), storage.fetch,
            storage.size, RetryPolicy(retries=0), None,
        )  # fmt: skip
        read = whole(f"simplecache::file://{tmp_path}/a.tar")
    else:
        storage.files["s3://b/a.tar"] = data
        ahead, read = ahead_of(storage), whole("s3://b/a.tar")
    READ_STATS.reset()
    with ahead.open(read) as stream:
        assert stream.read() == data
    assert (READ_STATS.opens, READ_STATS.bytes) == (1, len(data))


# -- processes --------------------------------------------------------------------------------


def test_a_forked_child_reads_with_threads_of_its_own(storage: Storage) -> None:
    """The parent's fetching threads, reads in flight and held lock do not come along.

    The parent forks while its read-ahead's lock is held, as a fetching thread may hold it.
    """
    data = payload(2 * MiB)
    storage.files |= {"s3://b/f": data, "s3://b/g": payload(MiB, 1), "s3://b/h": payload(10, 2)}
    ahead = ahead_of(storage, concurrency=1)
    with ahead.open(whole("s3://b/f")) as stream:
        assert stream.read() == data
    storage.gate.clear()
    ahead.plan([ranged("s3://b/g", (0, MiB))])
    storage.wait_for_gets(len(storage.gets) + 1)  # held in the parent
    with warnings.catch_warnings(), ahead._lock:
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: forking with threads
        pid = os.fork()
    if pid == 0:  # the child: exits 0 if it read the bytes, and once, ahead
        code = 1
        try:
            signal.alarm(2 * WAIT)  # a child without threads to fetch would wait forever
            storage.gate.set()
            with ahead.open(whole("s3://b/f")) as stream:
                code = 0 if stream.read() == data else 2
            seen = len(storage.gets)
            ahead.plan([ranged("s3://b/h", (0, 10))])  # fetched ahead in the child too
            storage.wait_for_gets(seen + 1)
            with ahead.open(ranged("s3://b/h", (0, 10))) as stream:
                code = code or (0 if stream.read(10) == payload(10, 2) else 3)
            code = code or (0 if len(storage.gets) == seen + 1 else 4)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    storage.gate.set()
    assert os.waitstatus_to_exitcode(status) == 0


STATS = """
import threading

from shardpipes import fs
from shardpipes.fs.readahead import Read, ReadAhead
from shardpipes.fs.retry import RetryPolicy

data = bytes(range(256)) * 10000
calls = []


def fetch(filesystem, url, path, start, end):
    calls.append(start)
    if start == 2**20 and calls.count(start) == 1:
        raise ConnectionResetError("reset")
    return data[start:end]


ahead = ReadAhead(
    lambda url: (None, url), fetch, lambda filesystem, path: len(data),
    RetryPolicy(backoff=0.0), None, budget=2**20, concurrency=1,
)
stream = ahead.open(Read("k", "mem://x", lambda: ((0, None),)))
ok = stream.read() == data
s = fs.READ_STATS
print(ok, len(data), len(calls), s.opens, s.bytes, s.fetched, s.requests, s.retries)


def locate():  # reads an index first, with a read-ahead of its own, on the same threads
    index = ReadAhead(
        lambda url: (None, url), lambda *_: b"i" * 16, lambda filesystem, path: 16,
        RetryPolicy(), None, budget=2**20, concurrency=1,
    )
    with index.open(Read("i", "mem://x.idx", lambda: ((0, 16),))) as found:
        assert found.read(16) == b"i" * 16
    return ((0, 1000),)


nested = ahead.open(Read("n", "mem://x", locate))
print(nested.read(1000) == data[:1000], threading.active_count())
"""


def test_a_process_of_its_own() -> None:
    """The statistics (the process's own): one retry, everything counted.

    The pool (fresh in a new process): one thread more than the requests in flight, so that
    a read whose location reads an index (with a read-ahead of its own) is not left
    waiting for a thread. The process ends without closing its reads: the threads are daemons.
    """
    done = subprocess.run(
        [sys.executable, "-c", STATS], capture_output=True, text=True, timeout=WAIT, check=True
    )
    stats, nested = done.stdout.splitlines()
    ok, size, calls, opens, read, fetched, requests, retries = stats.split()
    assert ok == "True"
    assert (opens, read, fetched, retries) == ("1", size, size, "1")
    assert int(requests) == int(calls) - 1
    assert "mem://x at byte 1048576: ConnectionResetError: reset; retry 1 of 5" in done.stderr
    assert nested.split() == ["True", "3"]  # the main thread and 1 + 1 fetching threads
