"""What :class:`~shardpipes.fs.readahead.ReadAhead` plans: each read's ranges, size, blocks."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardpipes.fs.resilient import ResilientStream

__all__ = [
    "FIRST_BLOCK",
    "Block",
    "Ranges",
    "Read",
    "Source",
    "next_offset",
    "speculate",
]

FIRST_BLOCK = 1 * 2**20  #: the first block of a read: its first samples after one round trip

Ranges = tuple[tuple[int, int | None], ...]


@dataclass(frozen=True)
class Read:
    """A planned read: what :meth:`ReadAhead.open` will be asked for, and how to find it.

    Attributes:
        key: What identifies the read when it is opened (e.g. the shard part and offset).
        url: The file's URL.
        locate: The byte ranges to read, ``end=None`` meaning to the end of the file;
            called in a fetching thread (it may read an index).
    """

    key: Hashable
    url: str
    locate: Callable[[], Ranges]


@dataclass
class Block:
    """One ranged request: its bytes come in ``future``; it holds budget until released."""

    offset: int
    length: int
    future: Future[bytes] = field(default_factory=Future)
    dropped: bool = False  # read past, or its read was dropped
    released: bool = False  # its bytes given back to the budget

    @property
    def end(self) -> int:
        """The offset just past the block."""
        return self.offset + self.length


class Source:
    """The state of one planned read: its ranges, its size, its blocks asked for."""

    def __init__(self, read: Read) -> None:
        self.read = read
        self.ranges: list[tuple[int, int | None]] | None = None  # None: not located yet
        self.size: int | None = None  # the file's size, where needed and known
        self.sized: Future[None] = Future()  # running: size asked for; done: known, or not
        self.size_error: Exception | None = None  # why it could not be found
        self.ready: Future[None] = Future()  # located (and sized, where needed)
        self.started = False
        self.blocks: deque[Block] = deque()
        self.next = 0  # index in ranges of the range being cut into blocks
        self.cursor: int | None = None  # next offset to ask for in that range
        self.grow = 0  # the next block's size (0: not cut yet)
        self.closed = False
        self.chained = "::" in read.url  # opened whole (its filesystem caches it)
        self.opened: Future[ResilientStream] | None = None

    @property
    def sizing(self) -> bool:
        """Whether its size was asked for."""
        return self.sized.running() or self.sized.done()

    def needs_size(self, cache: bool) -> bool:
        """Whether the file's size must be known (a range to its end, or a cache to fill)."""
        assert self.ranges is not None
        return cache or any(end is None for _, end in self.ranges)

    def limit(self, end: int | None) -> int | None:
        """Where a range ending at ``end`` (``None``: the file's end) stops, where known."""
        return self.size if end is None else end if self.size is None else min(end, self.size)


def speculate(source: Source, start: int) -> bool:
    """Whether to ask for a waited-on read's second block before its file's size is known.

    Its first samples may need more than the first block: both go out at once (a round
    trip saved); past the end of a small file, the second comes back empty.
    """
    assert source.cursor is not None
    return source.started and source.cursor - start <= FIRST_BLOCK


def next_offset(source: Source) -> int | None:
    """The offset of the next block ``source`` would ask for (``None``: none left)."""
    assert source.ranges is not None
    if source.next >= len(source.ranges):
        return None
    return source.cursor if source.cursor is not None else source.ranges[source.next][0]
