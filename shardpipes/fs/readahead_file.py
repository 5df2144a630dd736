"""The seekable file :meth:`~shardpipes.fs.readahead.ReadAhead.open` gives over one planned read.

It belongs to its :class:`~shardpipes.fs.readahead.ReadAhead` and works on its blocks
under its lock; reading or seeking outside the planned ranges plans the read again.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from shardpipes.fs.read_plan import Block, Source, next_offset
from shardpipes.fs.resilient import READ_STATS, ReadOnly, ResilientStream

if TYPE_CHECKING:
    from shardpipes.fs.readahead import ReadAhead

__all__ = ["AheadFile"]


class AheadFile(ReadOnly):
    """A seekable, read-only stream over one planned read (see :meth:`ReadAhead.open`)."""

    def __init__(self, ahead: ReadAhead, source: Source) -> None:
        self._ahead, self._source = ahead, source
        self.pos = 0

    def _whole(self) -> ResilientStream | None:
        opened = self._source.opened
        if opened is None:
            return None
        stream = opened.result()
        if stream.tell() != self.pos:
            stream.seek(self.pos)
        return stream

    def read(self, n: int = -1) -> bytes:
        """Read up to ``n`` bytes (all to the end with ``-1``), waiting for their blocks.

        Fewer than ``n`` where the next block has not come yet and some bytes have: at
        least one byte, unless at the end of the file (as a raw stream reads).
        """
        whole = self._whole()
        if whole is not None:
            data = whole.read(n)  # counted by the ResilientStream
            self.pos += len(data)
            return data
        parts: list[bytes] = []
        want = n if n >= 0 else None
        while want is None or want > 0:
            block = self._block()
            if block is None or (parts and want is not None and not block.future.done()):
                break  # what has come so far, rather than wait (a reader parses it meanwhile)
            data = block.future.result()
            start = self.pos - block.offset
            stop = len(data) if want is None else min(len(data), start + want)
            if len(data) < block.length:  # a short block: the file ends there
                self._ahead.settle_size(self._source, block.offset + len(data))
            if stop <= start:
                break
            parts.append(data[start:stop])
            self.pos += stop - start
            if want is not None:
                want -= stop - start
        out = parts[0] if len(parts) == 1 else b"".join(parts)
        READ_STATS.count(bytes=len(out))
        return out

    def _block(self) -> Block | None:
        """The block holding ``pos``, asked for now if it was not; ``None`` at the file's end."""
        while (block := self._next_block()) is None:
            if self._source.size is not None and self.pos >= self._source.size:
                return None  # the end of the file
            self._source.sized.result()  # to the end of a file whose size is being found
        return block

    def _next_block(self) -> Block | None:
        ahead, source = self._ahead, self._source
        with ahead._lock:
            while source.blocks and source.blocks[0].end <= self.pos:
                ahead._release(source.blocks.popleft())
            if not (source.blocks and source.blocks[0].offset <= self.pos):
                if source.size is not None and self.pos >= source.size:
                    return None
                if source.blocks or next_offset(source) != self.pos:
                    replan(ahead, source, self.pos)  # outside the plan: from here to the end
                ahead._cut(source, force=True)
            ahead._pump()
            if source.blocks:
                return source.blocks[0]
            if source.size_error is not None:  # the size it waits for could not be found
                raise source.size_error
            return None

    def seek(self, offset: int, whence: int = 0) -> int:
        """Move to ``offset``; the blocks are asked for when read."""
        if whence == 2:
            source = self._source
            size = source.size if source.size is not None else self._ahead._measure(source)
            target = size + offset
        else:
            target = offset if whence == 0 else self.pos + offset
        if target < 0:
            msg = f"negative seek position {target}"
            raise ValueError(msg)
        self.pos = target
        return target

    def close(self) -> None:
        """Drop the read's blocks and give their bytes back to the budget."""
        ahead = self._ahead
        with ahead._lock:
            ahead._drop(self._source)
            with contextlib.suppress(ValueError):
                ahead._sources.remove(self._source)
            ahead._pump()


def replan(ahead: ReadAhead, source: Source, pos: int) -> None:
    """Plan ``source`` anew from ``pos`` to the end of its file (whose size it then needs)."""
    for block in source.blocks:
        ahead._release(block)
    source.blocks.clear()
    source.ranges, source.next, source.cursor = [(pos, None)], 0, None
    source.grow = 0
    if source.size is None and not source.sizing and not source.chained:
        source.sized.set_running_or_notify_cancel()

        def measure() -> None:
            with contextlib.suppress(Exception):  # a reader waiting on it raises it
                ahead._measure(source)

        ahead._submit(measure)
