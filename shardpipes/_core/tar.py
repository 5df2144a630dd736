"""A streaming tar reader that parses 512-byte headers itself.

It reads large chunks (1 MiB) from any binary stream and slices members out of them, with
no per-member ``TarInfo`` objects and nothing written to disk. It reads what GNU tar and
Python's ``tarfile`` write: ustar (with the ``prefix`` field), GNU long names and long
links (``././@LongLink``), pax extended headers (``path=`` and ``size=`` records, local and
global), base-256 sizes, and gzip-compressed streams (detected by their magic bytes).
Directories, links, devices and sparse files are skipped; only regular files are yielded.
Like ``tarfile``, it stops at the first all-zero block and accepts a stream that ends at a
header boundary without one.

Every error is a :class:`~shardpipes.errors.TarFormatError` naming the URL, the member
(where known) and the byte offset of the header in the uncompressed stream. Besides
malformed headers, the reader refuses what a hostile shard may hold: a member larger than
``max_member_bytes`` (checked before reading it), a name with a ``..`` component, an
absolute name or a NUL byte, a lone all-zero block followed by more headers, and more than
:data:`MAX_EXTENDED` extended headers in a row. Nothing it reads is ever allocated beyond
what the stream actually holds (reads are made in pieces of at most :data:`PIECE` bytes).

With an ``on_error`` callback the reader goes on past a bad member instead of raising:
it skips the member's data when its header is sound (an unsafe name, an oversized member),
or scans forward to the next block that is a valid header (a bad checksum, a field that is
not a number), and marks the spot with a ``Member`` whose ``end`` is ``-1``, so that the
sample holding the bad member can be dropped whole.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Callable, Iterator
from typing import IO, NamedTuple

from shardpipes._core.buffer import CHUNK, PIECE, Pieces, Reader, open_reader
from shardpipes._core.tar_headers import (
    BLOCK,
    BadMember,
    Then,
    apply_pax,
    check,
    checksum_ok,
    not_a_tar,
    nts,
    parse,
    pax_records,
)
from shardpipes.errors import ShardpipesError, TarFormatError

__all__ = ["CHUNK", "MAX_EXTENDED", "MAX_MEMBER_BYTES", "PIECE", "Member", "iter_members"]

_ZERO = bytes(BLOCK)
_REGULAR = frozenset(b"0\x007")
_SUPPORTED = frozenset(b"0\x0071234567LKS")
_HEADERS = _SUPPORTED | frozenset(b"xg")  # what a scan after a bad header may resume at
_MAX_META = 1 << 20  # long names and pax headers larger than this are refused
MAX_MEMBER_BYTES = 1 << 30  #: default ``max_member_bytes``: larger members are refused
MAX_EXTENDED = 16  #: more long-name/pax headers than this before one member are refused
ErrorCallback = Callable[[TarFormatError, bool], None]


class Member(NamedTuple):
    """A regular file in a tar stream.

    ``data`` is ``None`` when the caller's ``keep`` function declined the member (its bytes
    were skipped, not read). ``offset`` is where its first header starts (long-name and pax
    headers included) and ``end`` where its padded data ends, in the uncompressed stream.
    ``end == -1`` (with ``data=None``) marks a bad member reported to ``on_error``.
    """

    name: str
    data: bytes | None
    offset: int
    end: int


def iter_members(
    stream: IO[bytes],
    *,
    url: str,
    keep: Callable[[str], bool] | None = None,
    base: int = 0,
    limit: int | None = None,
    skip: int = 0,
    max_member_bytes: int = MAX_MEMBER_BYTES,
    on_error: ErrorCallback | None = None,
) -> Iterator[Member]:
    """Yield the regular files of a tar (or gzip-compressed tar) stream, in order.

    Args:
        stream: A binary stream positioned at a header boundary.
        url: The shard's URL, for error messages.
        keep: Called with each regular member's name before its data is read; when it
            returns ``False`` the data is skipped (seeked over where possible) and the member
            is yielded with ``data=None``.
        base: The absolute offset of the stream's position (for reading a byte range).
        limit: Read at most this many bytes from ``stream``.
        skip: Start at this header boundary, counted in uncompressed bytes from the
            stream's position: seeked over in a plain tar, decompressed and dropped in a
            gzip one (resuming a shard mid-way). A pax global header before it is not seen.
        max_member_bytes: Refuse a regular member larger than this, before reading it.
        on_error: Called with each :class:`~shardpipes.errors.TarFormatError` instead of
            raising it, and whether the stream ends there (a truncation, bad gzip data). It
            raises to stop, or returns to go on past the bad member (see the module docs);
            a marker ``Member(name, None, offset, -1)`` is then yielded.

    Yields:
        :class:`Member` tuples.

    Raises:
        TarFormatError: On a bad header, a bad checksum, truncation or bad gzip data, an
            unsafe name or an oversized member (unless ``on_error`` takes it).
    """
    reader = open_reader(stream, base, limit)
    try:
        if skip and not reader.skip(skip, seek=True):
            msg = f"the stream ends before offset {skip}"
            raise TarFormatError(msg, url=url, offset=reader.tell())
        yield from _members(reader, url, keep, max_member_bytes, on_error)
        if isinstance(reader.stream, Pieces):
            if reader.failed is not None:  # held back (a CRC failure at the trailer): say it
                raise reader.failed
            reader.stream.drain()
    except (OSError, EOFError, zlib.error) as exc:  # gzip errors surface from reads
        if isinstance(exc, ShardpipesError | FileNotFoundError | PermissionError):
            raise  # storage failures are the caller's, not the tar's
        msg = f"unreadable compressed stream: {exc}"
        error = TarFormatError(msg, url=url, offset=reader.tell())
        if on_error is None:
            raise error from exc
        error.__cause__ = exc
        on_error(error, True)
        yield Member("", None, reader.tell(), -1)


class _Headers:
    """What the headers read since the last member said: its long name, pax records, start."""

    __slots__ = ("drop", "extended", "long_name", "pax", "pax_global", "pos", "start")

    def __init__(self) -> None:
        self.pax_global: dict[str, str] = {}
        self.drop = False  # the next member's pax header was bad: its name is unknown
        self.pos = 0  # where the header being read starts
        self.clear()

    def clear(self) -> None:
        """Forget what was said of the member just read (all but the global pax records)."""
        self.start = -1  # where the member's first header starts, once one is read
        self.long_name: str | None = None
        self.pax: dict[str, str] = {}
        self.extended = 0  # extended headers since the last member


class _Step(enum.Enum):
    """What a header that yields no member leads to."""

    NEXT = "read the next header"
    END = "the archive ends"


def _members(
    reader: Reader,
    url: str,
    keep: Callable[[str], bool] | None,
    max_size: int,
    on_error: ErrorCallback | None,
) -> Iterator[Member]:
    headers = _Headers()
    member = tuple.__new__  # Member(...) goes through a Python-level __new__
    adler32 = zlib.adler32
    while True:
        # The fast path, inlined (this loop is the reader's cost per member): the header
        # of a regular file as tarfile and GNU tar write it, with NUL-terminated octal
        # size and checksum fields, no ustar prefix, a correct unsigned checksum, and its
        # padded data inside the buffer. Anything else goes the general way (_general),
        # which also makes the errors; nothing is consumed until the fast path succeeds.
        buf, p = reader.buf, reader.pos
        if (
            headers.start < 0
            and not (headers.pax_global or headers.drop)
            and len(buf) - p >= BLOCK
            and buf[p + 156] in _REGULAR
            and not (buf[p + 345] or buf[p + 135] or buf[p + 154])
            and buf[p]
        ):
            try:
                size, stored = int(buf[p + 124 : p + 135], 8), int(buf[p + 148 : p + 154], 8)
            except ValueError:
                size = stored = -1
            # byte sums of <= 256 bytes in C (adler32's low half is 1 + the sum); the
            # checksum field itself counts as 8 spaces (256)
            total = (
                (adler32(buf[p : p + 256]) & 0xFFFF)
                + (adler32(buf[p + 256 : p + 512]) & 0xFFFF)
                + 254
                - sum(buf[p + 148 : p + 156])
            )
            data_start = p + BLOCK
            data_end = data_start + size
            after = data_end + (-size) % BLOCK
            if 0 <= size <= max_size and total == stored and after <= len(buf):
                end = buf.find(0, p, p + 100)
                name = buf[p : end if end >= 0 else p + 100].decode("utf-8", "surrogateescape")
                # names needing a closer look (./, /, ..) go the general way
                if not (name.endswith("/") or name.startswith(("./", "/")) or ".." in name):
                    reader.pos = after
                    kept = keep is None or keep(name)
                    data = buf[data_start:data_end] if kept else None
                    yield member(Member, (name, data, reader.base + p, reader.base + after))
                    continue
        try:
            found = _general(reader, headers, url, keep, max_size)
        except (BadMember, TarFormatError) as exc:
            bad = exc if isinstance(exc, BadMember) else BadMember(exc, Then.SCAN)  # a header
            marker, go_on = _recover(reader, headers, bad, url, on_error)
            if marker is not None:
                yield marker
            if not go_on:
                return
            continue
        if found is _Step.END:
            return
        if found is not _Step.NEXT:
            yield found


def _general(
    reader: Reader,
    headers: _Headers,
    url: str,
    keep: Callable[[str], bool] | None,
    max_size: int,
) -> Member | _Step:
    """Read one header the general way: a member, or what it leads to; raises what is bad."""
    pos, header = reader.tell(), reader.read(BLOCK)
    headers.pos = pos
    if len(header) < BLOCK or header == _ZERO:
        return _zero_or_short(reader, headers, header, url)
    if headers.start < 0:
        headers.start = pos
    name, size, kind = parse(header, url, pos)
    padded = size + (-size) % BLOCK
    if kind in b"LKxg":
        _extended(reader, headers, kind, size, padded, url)
        return _Step.NEXT
    if headers.pax or headers.pax_global:
        records = {**headers.pax_global, **headers.pax}
        name, size, padded = apply_pax(records, name, size, padded, url, pos)
    if headers.long_name is not None:
        name = headers.long_name
    start = headers.start
    headers.clear()
    if kind not in _REGULAR or (kind == 0 and name.endswith("/")):
        if kind not in _SUPPORTED or kind == 0x53:  # unknown types and sparse files
            reader.skip(padded)
        return _Step.NEXT
    while name.startswith("./"):
        name = name[2:]
    if headers.drop:  # reported with its pax header: mark it by the name it has
        headers.drop = False
        reader.skip(padded)
        return Member(name, None, start, -1)
    check(name, size, padded, max_size, url, start)
    if keep is not None and not keep(name):
        reader.skip(padded)
        return Member(name, None, start, reader.tell())
    data = reader.read(size)
    if len(data) < size or not reader.skip(padded - size):
        msg = f"truncated member ({len(data)} of {size} bytes, padded to {padded})"
        raise BadMember(TarFormatError(msg, url=url, member=name, offset=start), Then.STOP)
    return Member(name, data, start, reader.tell())


def _zero_or_short(reader: Reader, headers: _Headers, header: bytes, url: str) -> _Step:
    """A zero or short block where a header should be: the archive's end, or an error."""
    pos = headers.pos
    if 0 < len(header) < BLOCK or headers.start >= 0:
        raise BadMember(TarFormatError("truncated header", url=url, offset=pos), Then.STOP)
    if not header and reader.left is None:  # not a byte range: the real end
        msg = "empty file" if pos == 0 else "no end-of-archive blocks: truncated"
        raise BadMember(TarFormatError(msg, url=url, offset=pos), Then.STOP)
    if header and not _archive_ends(reader):
        msg = "an all-zero block in the middle of the archive"
        raise BadMember(TarFormatError(msg, url=url, offset=pos), Then.GO_ON)
    return _Step.END


def _extended(
    reader: Reader, headers: _Headers, kind: int, size: int, padded: int, url: str
) -> None:
    """Take in a GNU long name or a pax header, for the member that follows."""
    headers.extended += 1
    if headers.extended > MAX_EXTENDED:
        msg = f"more than {MAX_EXTENDED} extended headers before one member"
        raise BadMember(TarFormatError(msg, url=url, offset=headers.start), Then.STOP)
    if size > _MAX_META:
        msg = f"extended header of {size} bytes (limit {_MAX_META})"
        raise TarFormatError(msg, url=url, offset=headers.pos)
    meta = reader.read(size)
    if len(meta) < size:
        msg = "truncated extended header"
        raise TarFormatError(msg, url=url, offset=headers.pos)
    reader.skip(padded - size)
    if kind == 0x4C:  # L: GNU long name
        headers.long_name = nts(meta)
    elif kind in b"xg":
        records = pax_records(meta, url, headers.pos)
        (headers.pax if kind == 0x78 else headers.pax_global).update(records)


def _recover(
    reader: Reader, headers: _Headers, bad: BadMember, url: str, on_error: ErrorCallback | None
) -> tuple[Member | None, bool]:
    """Report a bad member; return the marker to yield and whether to go on (module docs)."""
    pos = headers.pos
    if pos == 0 and bad.error.offset == 0:
        bad.error = not_a_tar(bad.error, url)
    if on_error is None:
        raise bad.error from bad.error.__cause__
    fatal = bad.then is Then.STOP or (bad.then is Then.SCAN and not _scan(reader))
    on_error(bad.error, fatal)
    marker = None
    if bad.then is not Then.GO_ON:
        at = pos if bad.error.offset is None else bad.error.offset
        marker = Member(bad.error.member or "", None, at, -1)
    headers.clear()
    headers.drop = bad.then is Then.DROP
    skip = bad.then if isinstance(bad.then, int) else 0
    go_on = not fatal and (skip == 0 or (skip < 1 << 62 and reader.skip(skip)))
    return marker, go_on


def _archive_ends(reader: Reader) -> bool:
    """After one zero block: whether the archive ends (a second one, or the stream's end)."""
    block = reader.read(BLOCK)
    if len(block) < BLOCK or block == _ZERO:
        return True
    reader.unread(block)
    return False


def _scan(reader: Reader) -> bool:
    """Go on to the next block that is a valid header; ``False`` at the end of the stream."""
    while True:
        block = reader.read(BLOCK)
        if len(block) < BLOCK:
            return False
        if block != _ZERO and block[156] in _HEADERS:
            try:
                valid = checksum_ok(block)
            except ValueError:
                valid = False
            if valid:
                reader.unread(block)
                return True
