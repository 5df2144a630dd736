"""The background prefetch (``_core.prefetch``): bounded, in order, errors and stops passed on."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from shardpipes._core.prefetch import Prefetch

URL = "shard-7.tar"


class Producer:
    """Items 0, 1, … that count themselves, and wait to be let go at one of them."""

    def __init__(self, n: int, hold_at: int | None = None) -> None:
        self.n, self.hold_at = n, hold_at
        self.made = 0
        self.changed = threading.Condition()
        self.release = threading.Event()
        self.closed = False

    def __iter__(self) -> Iterator[int]:
        try:
            for i in range(self.n):
                if i == self.hold_at:
                    self.release.wait()
                with self.changed:
                    self.made += 1
                    self.changed.notify_all()
                yield i
        finally:
            self.closed = True

    def wait_made(self, n: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.made >= n, timeout=30)


def prefetch(items: Iterator[int], size: int) -> Prefetch:
    count = iter(range(1_000_000))
    return Prefetch(items, size, lambda: next(count), (0, "start"))


@pytest.mark.parametrize("size", [1, 3])
def test_the_producer_is_never_more_than_size_plus_one_ahead(size: int) -> None:
    """After each item taken, the producer fills the queue and stops: exactly size + 1 ahead."""
    producer = Producer(40)
    run = prefetch(iter(producer), size)
    taken = 0
    for item in run:
        assert item == taken
        taken += 1
        ahead = min(taken + size + 1, producer.n)
        producer.wait_made(ahead)
        assert producer.made == ahead
    assert taken == 40


def test_snapshots_after_the_first_every_size_th_and_the_last() -> None:
    """The mark is the newest snapshot delivered; behind() counts the items since it."""
    producer = Producer(11)
    made: list[int] = []

    def snapshot() -> int:
        made.append(producer.made)
        return producer.made

    run = Prefetch(iter(producer), 4, snapshot, (0, 0))
    marks = []
    for _ in run:
        assert run.mark[1] == run.mark[0]  # the state after mark[0] items
        assert 0 <= run.behind() < 4
        marks.append(run.mark[0])
    assert made == [1, 4, 8, 11]
    assert marks == [1, 1, 1, 4, 4, 4, 4, 8, 8, 8, 8]
    assert run.mark == (11, 11)
    assert run.behind() == 0


def test_an_error_upstream_is_raised_to_the_consumer_after_the_items_before_it() -> None:
    def failing() -> Iterator[int]:
        yield 1
        yield 2
        raise KeyError(URL)

    got = []
    with pytest.raises(KeyError, match=r"shard-7\.tar"):
        got.extend(prefetch(failing(), 2))
    assert got == [1, 2]


def test_closing_stops_the_thread_and_closes_the_source() -> None:
    """A consumer that stops early leaves no thread behind, and the source closed."""
    producer = Producer(1000)
    run = prefetch(iter(producer), 2)
    items = iter(run)
    assert [next(items), next(items)] == [0, 1]
    items.close()
    assert producer.closed
    assert not [t for t in threading.enumerate() if t.name == "shardpipes-prefetch"]


def test_closing_while_the_producer_waits_for_its_source() -> None:
    """The producer busy inside its source finishes that item, then stops."""
    producer = Producer(10, hold_at=3)
    items = iter(prefetch(iter(producer), 5))
    assert next(items) == 0
    producer.wait_made(3)
    closing = threading.Thread(target=items.close)
    closing.start()
    producer.release.set()
    closing.join(30)
    assert not closing.is_alive()
    assert producer.closed


@pytest.mark.parametrize("size", [0, -1, True, 2.0])
def test_size_must_be_a_positive_int(size: object) -> None:
    with pytest.raises(ValueError, match="size must be a positive int"):
        Prefetch(iter([]), size, lambda: None, (0, None))  # type: ignore[arg-type]


def test_before_any_item_it_is_at_its_mark() -> None:
    run = prefetch(iter(range(3)), 2)
    assert run.mark == (0, "start")
    assert run.behind() == 0
    assert list(run) == [0, 1, 2]  # a source without close() (a list iterator)
    assert run.behind() == 0
    with pytest.raises(RuntimeError, match="iterated once"):
        list(run)


def test_the_producer_is_a_named_daemon_thread() -> None:
    """Named, so that a leak shows; a daemon, so that it never keeps a program alive."""
    producer = Producer(100)
    items = iter(prefetch(iter(producer), 2))
    next(items)
    threads = [t for t in threading.enumerate() if t.name == "shardpipes-prefetch"]
    assert len(threads) == 1
    assert threads[0].daemon
    items.close()  # type: ignore[attr-defined]
