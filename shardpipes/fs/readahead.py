"""Reading remote shards ahead of use: parallel ranged reads, bounded in bytes per reader.

A real bucket costs a round trip before the first byte of every request (20–100 ms) and
carries only so many MB/s on one connection. Read stop-and-wait — ask for a block, parse
it, ask for the next — a worker spends most of its time waiting. :class:`ReadAhead`
instead knows what a worker will read (the current shard or part, and the next ones of
its plan, from :meth:`ReadAhead.plan`) and keeps fetching it in blocks, several at once
(``concurrency`` connections), ahead of the tar reader, as far as its byte budget allows:

* each planned read is a :class:`Read` — a URL and byte ranges (``end=None``: to the end
  of the file, whose size is then asked for, in parallel with the first block);
* blocks are ``budget / (2 × concurrency)`` bytes, within [:data:`MIN_BLOCK`,
  :data:`MAX_BLOCK`]; a read that the reader already waits for (the first one, or one
  not planned) starts with two blocks of :data:`FIRST_BLOCK`, asked for at once, then
  doubles, so that its first samples (up to 2 MiB) come after one round trip and one
  block's transfer (a block is used once whole: a 2 MiB second block made a first batch
  of 1.6 MB wait for 2 MiB);
* a block counts against the budget from the moment it is asked for until the reader has
  read past it: fetched, in flight and unread bytes together never exceed ``budget``
  (one block may, when the budget is smaller than a block);
* a block that fails transiently is fetched again (``RetryPolicy``): the reader sees each
  byte exactly once, as with :class:`~shardpipes.fs.resilient.ResilientStream`;
* a :class:`~shardpipes.fs.cache.ShardCache` is filled block by block — from whole shards
  and from parts alike — and serves the blocks it holds.

:meth:`ReadAhead.open` gives a seekable stream over a read. Reading or seeking outside the
planned ranges is allowed: the read is planned again from there. Chained URLs
(``simplecache::s3://…``) are not fetched in blocks: their filesystem downloads the file
itself, so the next one is opened in the background instead.

Threads: one pool of daemon threads per process (a forked DataLoader worker starts its
own), as many as the largest ``concurrency`` asked for plus one, idle when nothing is
planned; each :class:`ReadAhead` keeps at most ``concurrency`` of its requests in flight.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from shardpipes.fs.cache import ShardCache
from shardpipes.fs.io_threads import io_threads
from shardpipes.fs.read_plan import (
    FIRST_BLOCK,
    Block,
    Ranges,
    Read,
    Source,
    speculate,
)
from shardpipes.fs.readahead_file import AheadFile
from shardpipes.fs.resilient import READ_STATS, ResilientStream, call_storage
from shardpipes.fs.retry import RetryPolicy

__all__ = [
    "FIRST_BLOCK",
    "IO_CONCURRENCY",
    "MAX_BLOCK",
    "MIN_BLOCK",
    "READAHEAD",
    "Ranges",
    "Read",
    "ReadAhead",
]

READAHEAD = 64 * 2**20  #: default byte budget of one reader (one per DataLoader worker)
IO_CONCURRENCY = 4  #: default ranged reads in flight at once, per reader
MIN_BLOCK = 1 * 2**20
MAX_BLOCK = 8 * 2**20


class ReadAhead:
    """Fetches planned reads ahead of use, within a byte budget; see the module docs.

    Args:
        resolve: ``resolve(url) -> (filesystem, path)``.
        fetch: ``fetch(filesystem, url, path, start, end) -> bytes``, one ranged GET.
        size: ``size(filesystem, path) -> int``, the file's size in one request.
        retry: The retry policy of every request.
        cache: A local shard cache to fill and read from, or ``None``.
        budget: Bytes fetched ahead at most (see the module docs); 0 reads block by block,
            on demand, with no read ahead.
        concurrency: Requests in flight at once.
    """

    def __init__(
        self,
        resolve: Callable[[str], tuple[Any, str]],
        fetch: Callable[[Any, str, str, int, int], bytes],
        size: Callable[[Any, str], int],
        retry: RetryPolicy,
        cache: ShardCache | None,
        *,
        budget: int = READAHEAD,
        concurrency: int = IO_CONCURRENCY,
    ) -> None:
        self.resolve, self._fetch, self._size = resolve, fetch, size
        self.retry, self.cache = retry, cache
        self.budget, self.concurrency = budget, concurrency
        self.block = min(MAX_BLOCK, max(MIN_BLOCK, budget // (2 * concurrency)))
        self._lock = threading.Lock()
        self._sources: list[Source] = []  # the open ones first, then the planned ones
        self._held = 0  # bytes of blocks asked for and not yet read past
        self.peak = 0  #: the most bytes held at once (the budget, plus a block at most)
        self._inflight = 0  # blocks asked for and not yet come
        self._pid = os.getpid()  # the process whose reads these are

    # -- what the reader calls -----------------------------------------------------------

    def plan(self, reads: Sequence[Read]) -> None:
        """The reads that come after the open one(s), in order; others planned are dropped."""
        self._fork_check()
        with self._lock:
            planned = {s.read.key: s for s in self._sources if not s.started}
            keep = [s for s in self._sources if s.started]
            keep += [
                planned.pop(read.key) if read.key in planned else Source(read) for read in reads
            ]
            for source in planned.values():
                self._drop(source)
            self._sources = keep
            self._pump()

    def open(self, read: Read) -> AheadFile:
        """A stream over ``read``: the planned one if it was planned, else a new one.

        Raises:
            ShardNotFoundError, StorageAccessError, StorageError: As the file's size or
                location is found (where they must be), else at the first read.
        """
        self._fork_check()
        with self._lock:
            source = next(
                (s for s in self._sources if not s.started and s.read.key == read.key), None
            )
            if source is None:
                source = Source(read)
                self._sources.insert(sum(s.started for s in self._sources), source)
            source.started = True
            self._pump()
        if not source.chained:  # a chained read's ResilientStream counts its own
            READ_STATS.count(opens=1)
        stream = AheadFile(self, source)
        try:
            source.ready.result()  # raises what finding it raised
        except BaseException:
            stream.close()  # forgotten: its error would otherwise be kept (with a traceback)
            raise
        return stream

    def close(self) -> None:
        """Drop everything planned and open (a reader's epoch ended or was abandoned)."""
        with self._lock:
            for source in self._sources:
                self._drop(source)
            self._sources = []

    # -- scheduling (under the lock) -----------------------------------------------------

    def _pump(self) -> None:
        """Ask for what the budget allows, in plan order."""
        for source in self._sources:
            if source.closed:
                continue
            if source.ranges is None:
                if not source.ready.running():
                    source.ready.set_running_or_notify_cancel()
                    self._submit(lambda s=source: self._locate(s))  # type: ignore[misc]
                return  # the next sources wait for this one to be located
            if source.chained:
                if source.opened is None:
                    source.opened = Future()
                    self._submit(lambda s=source: self._open_whole(s))  # type: ignore[misc]
                continue
            if not self._cut(source):
                return  # out of budget

    def _cut(self, source: Source, *, force: bool = False) -> bool:
        """Ask for the blocks of ``source`` the budget allows; whether all were asked for.

        With ``force``, one block is asked for whatever the budget: the reader waits on it.
        """
        assert source.ranges is not None
        while source.next < len(source.ranges):
            start, end = source.ranges[source.next]
            if source.cursor is None:
                source.cursor = start
            limit = source.limit(end)
            if limit is not None and source.cursor >= limit:
                source.next, source.cursor = source.next + 1, None
                continue
            if limit is None and source.cursor != start and not speculate(source, start):
                return False  # to the end of a file of unknown size: wait for its size
            if not source.grow:  # a read waited for starts small; one fetched ahead does not
                source.grow = min(FIRST_BLOCK, self.block) if source.started else self.block
            length = source.grow if limit is None else min(source.grow, limit - source.cursor)
            busy = self._inflight >= self.concurrency
            if not force and (busy or (self._held and self._held + length > self.budget)):
                return False
            force = False
            block = Block(source.cursor, length)
            block.future.set_running_or_notify_cancel()
            source.blocks.append(block)
            self._held += length
            self.peak = max(self.peak, self._held)
            self._inflight += 1
            source.cursor += length
            if source.cursor - start > FIRST_BLOCK:  # 1, 1, 2, 4… MiB: the first two at once
                source.grow = min(source.grow * 2, self.block)
            self._submit(lambda s=source, b=block: self._get(s, b))  # type: ignore[misc]
        return True

    def settle_size(self, source: Source, size: int) -> None:
        """A block came back short: the file ends at ``size``."""
        with self._lock:
            if source.size is None or source.size > size:
                source.size = size

    def _drop(self, source: Source) -> None:
        source.closed = True
        for block in source.blocks:
            self._release(block)
        source.blocks.clear()
        if source.opened is not None and source.opened.done() and not source.opened.exception():
            with contextlib.suppress(Exception):
                source.opened.result().close()

    def _release(self, block: Block) -> None:
        """Give back a block's bytes: now if it has come, else when it does (in ``_get``)."""
        block.dropped = True
        if block.future.done() and not block.released:
            block.released = True
            self._held -= block.length

    # -- the work, in the fetching threads ------------------------------------------------

    def _submit(self, task: Callable[[], None]) -> None:
        # one thread more than the requests in flight: a read being located may itself
        # read (an index) through the pool
        io_threads(self.concurrency + 1).put(task)

    def _fork_check(self) -> None:
        """In a forked process, forget the parent's reads: its threads did not come along."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._sources, self._held, self._inflight = [], 0, 0

    def _locate(self, source: Source) -> None:
        try:
            ranges = list(source.read.locate())
            with self._lock:
                source.ranges = ranges
                self._pump()  # the first block goes out before the size is known
            if source.needs_size(self.cache is not None) and not source.chained:
                source.sized.set_running_or_notify_cancel()
                self._measure(source)
        except BaseException as exc:
            with self._lock:
                self._drop(source)  # its first block's retries stop (see _call)
                source.ranges = source.ranges or []
            source.ready.set_exception(exc)
        else:
            source.ready.set_result(None)
        with self._lock:
            self._pump()

    def _measure(self, source: Source) -> int:
        """Find the size of ``source``'s file (one request), record it and go on cutting.

        Raises:
            What finding it raised, also kept in ``size_error`` for a reader that waits.
        """
        try:
            filesystem, path = self.resolve(source.read.url)
            size: int = self._call(source, 0, lambda: self._size(filesystem, path), "open")
        except Exception as exc:
            with self._lock:
                source.size_error = exc
            raise
        else:
            with self._lock:
                source.size = size if source.size is None else min(size, source.size)
                self._pump()
                return source.size
        finally:
            with self._lock:
                if not source.sized.done():
                    source.sized.set_result(None)

    def _open_whole(self, source: Source) -> None:
        assert source.opened is not None
        url = source.read.url
        try:
            stream = ResilientStream(url, *self.resolve(url), self.retry)
        except BaseException as exc:
            source.opened.set_exception(exc)
            return
        source.opened.set_result(stream)
        with self._lock:
            if source.closed:  # dropped while it was being opened
                stream.close()

    def _get(self, source: Source, block: Block) -> None:
        try:
            self._get_block(source, block)
        finally:
            with self._lock:
                self._inflight -= 1
                if block.dropped:
                    self._release(block)
                self._pump()

    def _get_block(self, source: Source, block: Block) -> None:
        if block.dropped or source.closed:
            block.future.set_result(b"")
            return
        url = source.read.url
        try:
            data = self.cache.read(url, block.offset, block.length) if self.cache else None
            if data is None:
                filesystem, path = self.resolve(url)
                data = self._call(
                    source,
                    block.offset,
                    lambda: self._fetch(filesystem, url, path, block.offset, block.end),
                )
                READ_STATS.count(requests=1, fetched=len(data))
                if self.cache is not None:
                    source.ready.result()
                    if source.size is not None and data:
                        self.cache.fill(url, source.size, block.offset, data)
        except BaseException as exc:
            if not self._past_end(source, block):
                block.future.set_exception(exc)
                return
            data = b""
        block.future.set_result(data)

    def _past_end(self, source: Source, block: Block) -> bool:
        """Whether ``block`` starts past its file's end (asked for before the size was known).

        Backends refuse such a range (S3's ``InvalidRange``, an HTTP 416) instead of
        answering with nothing.
        """
        if block.offset == 0 or not source.sizing:
            return False
        source.sized.result()
        return source.size is not None and block.offset >= source.size

    def _call(self, source: Source, offset: int, fn: Callable[[], Any], what: str = "read") -> Any:
        """``fn()`` with the retry policy; failures as shardpipes errors naming the URL.

        A block's retries stop once its ``source`` is dropped (nobody will read it).
        """

        def recover() -> None:
            if source.closed:
                raise _DroppedError
            READ_STATS.count(retries=1)

        return call_storage(self.retry, source.read.url, fn, what, offset, recover)


class _DroppedError(Exception):
    """A block's read was dropped while it was being retried."""
