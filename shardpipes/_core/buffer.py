"""Buffered reads of a shard's byte stream for the tar reader: plain, ranged or gzip.

:class:`Reader` reads large chunks and hands out slices, tracking the absolute position in
the (uncompressed) stream; nothing is ever allocated beyond what the stream holds.
"""

from __future__ import annotations

import gzip
import zlib
from typing import IO

CHUNK = 1 << 20  #: how much the reader asks of its stream at a time
PIECE = 16 << 20  #: the largest single read: a bogus size never allocates more than this


class Reader:
    """Buffered reads and skips over a binary stream, tracking the absolute position."""

    def __init__(self, stream: IO[bytes], *, base: int = 0, limit: int | None = None) -> None:
        self.stream = stream
        self.buf = b""
        self.pos = 0
        self.base = base  # stream offset of buf[0]
        self.left = limit  # bytes the stream may still give, None for no limit
        self.failed: BaseException | None = None  # a read error held back (see _raw)
        try:
            self.seekable = bool(stream.seekable())
        except (AttributeError, OSError):
            self.seekable = False

    def tell(self) -> int:
        return self.base + self.pos

    def _raw(self, n: int, least: int | None = None) -> bytes:
        """Read up to ``n`` bytes, and at least ``least`` (default ``n``) unless the stream ends.

        A stream may give fewer than it was asked for (a remote read gives what has come):
        the reader goes on with that where it needs no more (its samples parse meanwhile).
        """
        if self.left is not None:
            n = min(n, self.left)
        least = n if least is None else min(least, n)
        if self.failed is not None:
            raise self.failed
        parts: list[bytes] = []
        got = 0
        while got < least:
            try:
                data = self.stream.read(min(n - got, PIECE))
            except (OSError, EOFError, zlib.error) as exc:
                if not parts:
                    raise
                self.failed = exc  # a cut gzip stream: first give what came before the cut
                break
            if not data:
                break
            parts.append(data)
            got += len(data)
        if self.left is not None:
            self.left -= got
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def read(self, n: int) -> bytes:
        end = self.pos + n
        if end <= len(self.buf):
            out = self.buf[self.pos : end]
            self.pos = end
            return out
        head = self.buf[self.pos :]
        self.base += len(self.buf)
        need = n - len(head)
        if need >= CHUNK:
            self.buf, self.pos = b"", 0
            tail = self._raw(need)
            self.base += len(tail)
        else:
            self.buf = self._raw(CHUNK, need)
            tail = self.buf[:need]
            self.pos = len(tail)
        return head + tail if head else tail

    def unread(self, block: bytes) -> None:
        """Put back ``block``, the bytes just read, to be read again."""
        start = self.tell() - len(block)
        self.buf, self.pos, self.base = block + self.buf[self.pos :], 0, start

    def skip(self, n: int, *, seek: bool = False) -> bool:
        """Skip ``n`` bytes; return ``False`` if the stream ended first (when it can tell).

        A seekable stream is seeked over when that saves reading more than a chunk, or
        always with ``seek``.
        """
        end = self.pos + n
        if end <= len(self.buf):
            self.pos = end
            return True
        rest = end - len(self.buf)
        self.base += len(self.buf)
        self.buf, self.pos = b"", 0
        if self.seekable and (seek or rest > CHUNK) and (self.left is None or rest <= self.left):
            try:
                self.stream.seek(rest, 1)  # a seek past the end shows as EOF at the next header
            except (OverflowError, ValueError):  # a size no stream has: go to the end
                self.stream.seek(0, 2)
                return False
            self.base += rest
            if self.left is not None:
                self.left -= rest
            return True
        while rest > 0:
            got = len(self._raw(min(rest, CHUNK)))
            if not got:
                return False
            self.base += got
            rest -= got
        return True


class Prepend:
    """A read-only stream that gives ``head`` first, then the rest of ``stream``."""

    def __init__(self, head: bytes, stream: IO[bytes]) -> None:
        self.head, self.stream = head, stream

    def read(self, n: int = -1) -> bytes:
        if self.head:
            out, self.head = (self.head, b"") if n < 0 else (self.head[:n], self.head[n:])
            return out
        return self.stream.read(n)


class Pieces:
    """A gzip stream read with ``read1``: what came before a cut or a bad CRC is given first.

    ``GzipFile.read(n)`` gathers ``n`` bytes and loses them all to an error met on the way.
    """

    def __init__(self, gz: gzip.GzipFile) -> None:
        self.gz = gz

    def read(self, n: int = -1) -> bytes:
        return self.gz.read1(n)

    def drain(self) -> None:
        """Read to the end of the gzip stream: its trailer's CRC and length are checked."""
        while self.gz.read1(CHUNK):
            pass


def open_reader(stream: IO[bytes], base: int, limit: int | None) -> Reader:
    """Wrap ``stream``, transparently decompressing it when it is gzip."""
    reader = Reader(stream, base=base, limit=limit)
    head = reader._raw(2)
    if head == b"\x1f\x8b":
        gz = gzip.GzipFile(fileobj=Prepend(head, stream), mode="rb")  # type: ignore[call-overload]
        return Reader(Pieces(gz), base=0)  # type: ignore[arg-type]  # offsets: uncompressed
    reader.buf = head
    return reader
