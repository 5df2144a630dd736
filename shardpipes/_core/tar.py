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

import gzip
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import IO, NamedTuple

from shardpipes.errors import ShardpipesError, TarFormatError

__all__ = ["MAX_EXTENDED", "MAX_MEMBER_BYTES", "PIECE", "Member", "iter_members"]

BLOCK = 512
CHUNK = 1 << 20
_ZERO = bytes(BLOCK)
_REGULAR = frozenset(b"0\x007")
_SUPPORTED = frozenset(b"0\x0071234567LKS")
_HEADERS = _SUPPORTED | frozenset(b"xg")  # what a scan after a bad header may resume at
_SIGNED = struct.Struct("148b8x356b")
_MAX_META = 1 << 20  # long names and pax headers larger than this are refused
MAX_MEMBER_BYTES = 1 << 30  #: default ``max_member_bytes``: larger members are refused
MAX_EXTENDED = 16  #: more long-name/pax headers than this before one member are refused
PIECE = 16 << 20  #: the largest single read: a bogus size never allocates more than this
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


class _Reader:
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

    def _raw(self, n: int) -> bytes:
        """Read up to ``n`` bytes (fewer only at the end of the stream or of the limit)."""
        if self.left is not None:
            n = min(n, self.left)
        if self.failed is not None:
            raise self.failed
        parts: list[bytes] = []
        got = 0
        while got < n:
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
            self.buf = self._raw(CHUNK)
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


class _Prepend:
    """A read-only stream that gives ``head`` first, then the rest of ``stream``."""

    def __init__(self, head: bytes, stream: IO[bytes]) -> None:
        self.head, self.stream = head, stream

    def read(self, n: int = -1) -> bytes:
        if self.head:
            out, self.head = (self.head, b"") if n < 0 else (self.head[:n], self.head[n:])
            return out
        return self.stream.read(n)

    def readable(self) -> bool:
        return True


class _Pieces:
    """A gzip stream read with ``read1``: what came before a cut or a bad CRC is given first.

    ``GzipFile.read(n)`` gathers ``n`` bytes and loses them all to an error met on the way.
    """

    def __init__(self, gz: gzip.GzipFile) -> None:
        self.gz = gz

    def read(self, n: int = -1) -> bytes:
        return self.gz.read1(n)

    def seekable(self) -> bool:
        return False

    def drain(self) -> None:
        """Read to the end of the gzip stream: its trailer's CRC and length are checked."""
        while self.gz.read1(CHUNK):
            pass


def _open(stream: IO[bytes], base: int, limit: int | None) -> _Reader:
    """Wrap ``stream``, transparently decompressing it when it is gzip."""
    reader = _Reader(stream, base=base, limit=limit)
    head = reader._raw(2)
    if head == b"\x1f\x8b":
        gz = gzip.GzipFile(fileobj=_Prepend(head, stream), mode="rb")  # type: ignore[call-overload]
        return _Reader(_Pieces(gz), base=0)  # type: ignore[arg-type]  # offsets: uncompressed
    reader.buf = head
    return reader


def _nts(field: bytes) -> str:
    end = field.find(b"\0")
    return (field if end < 0 else field[:end]).decode("utf-8", "surrogateescape")


def _number(field: bytes) -> int:
    """Parse a numeric header field: octal text, or GNU base-256."""
    if field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * len(field) - 8)) if field[0] == 0xFF else value
    text = field.split(b"\0", 1)[0]
    return int(text, 8) if text.strip() else 0  # int() itself allows surrounding spaces


def _sum(data: bytes) -> int:
    """The byte sum of at most 256 bytes, in C: adler32's low half is 1 + the sum mod 65521."""
    return (zlib.adler32(data) & 0xFFFF) - 1


def _checksum_ok(header: bytes) -> bool:
    stored = _number(header[148:156])
    # the checksum field counts as 8 spaces (256); three pieces of <= 256 bytes each
    unsigned = 256 + _sum(header[:148]) + _sum(header[156:356]) + _sum(header[356:])
    return stored == unsigned or stored == 256 + sum(_SIGNED.unpack_from(header))


def _pax(data: bytes) -> dict[str, str]:
    r"""Parse pax records: ``"%d %s=%s\\n"``."""
    out, pos = {}, 0
    while pos < len(data) and data[pos] != 0:
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        record = data[space + 1 : pos + length - 1]
        if not space - pos < length <= len(data) - pos or data[pos + length - 1] != 0x0A:
            raise ValueError(f"bad pax record at {pos}")  # noqa: EM102 - rewrapped by caller
        key, _, value = record.partition(b"=")
        out[key.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _strip(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name


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
    reader = _open(stream, base, limit)
    try:
        if skip and not reader.skip(skip, seek=True):
            msg = f"the stream ends before offset {skip}"
            raise TarFormatError(msg, url=url, offset=reader.tell())
        yield from _members(reader, url, keep, max_member_bytes, on_error)
        if isinstance(reader.stream, _Pieces):
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


# How the reader goes on after a bad member (see _BadMember)
_STOP = -1  # the stream cannot be followed further
_SCAN = -2  # look for the next block that is a valid header
_DROP = -3  # drop the next member (its pax header was bad), then go on
_GO_ON = -4  # nothing was lost (a lone zero block): read the next header
# n >= 0: skip n bytes (the member's padded data), then read the next header


_TAR_NAMES = (".tar", ".tar.gz", ".tgz")


_NO_HEADER = frozenset(
    ("truncated header", "bad header checksum", "bad header: a numeric field is not octal")
)


def _no_header(error: TarFormatError) -> bool:
    """Whether ``error`` says a block is no tar header at all (not a tar's own fault)."""
    return error.problem in _NO_HEADER


def _not_a_tar(error: TarFormatError, url: str) -> TarFormatError:
    """The error of a stream whose very first header is bad: it is likely no tar at all."""
    name = url.rstrip("/").rpartition("/")[2]
    hint = ""
    if not name.lower().endswith(_TAR_NAMES):
        hint = f"; is {name!r} a shard? A glob such as 'train-*.tar' matches tar files only"
    msg = f"not a tar archive: no tar header at its start ({error.problem}){hint}"
    found = TarFormatError(msg, url=url, member=error.member, offset=0)
    found.__cause__ = error.__cause__
    return found


class _BadMember(Exception):  # noqa: N818 - internal control flow, never escapes
    """A bad member, and how to go on past it."""

    def __init__(self, error: TarFormatError, then: int) -> None:
        super().__init__(error)
        self.error, self.then = error, then


def _members(
    reader: _Reader,
    url: str,
    keep: Callable[[str], bool] | None,
    max_size: int,
    on_error: ErrorCallback | None,
) -> Iterator[Member]:
    long_name: str | None = None
    pax: dict[str, str] = {}
    pax_global: dict[str, str] = {}
    start = -1
    extended = 0  # extended headers since the last member
    drop = False  # the next member's pax header was bad: its name is unknown
    member = tuple.__new__  # Member(...) goes through a Python-level __new__
    adler32 = zlib.adler32
    while True:
        # The fast path, inlined (this loop is the reader's cost per member): the header
        # of a regular file as tarfile and GNU tar write it, with NUL-terminated octal
        # size and checksum fields, no ustar prefix, a correct unsigned checksum, and its
        # padded data inside the buffer. Anything else goes the general way below, which
        # also makes the errors; nothing is consumed until the fast path succeeds.
        buf, p = reader.buf, reader.pos
        if (
            start < 0
            and not (pax_global or drop)
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
        pos, end = reader.pos, reader.pos + BLOCK
        if end <= len(reader.buf):  # the header is in the buffer
            header, reader.pos, pos = reader.buf[pos:end], end, reader.base + pos
        else:
            pos, header = reader.tell(), reader.read(BLOCK)
        try:
            if len(header) < BLOCK or header == _ZERO:
                if 0 < len(header) < BLOCK or start >= 0:
                    raise _BadMember(TarFormatError("truncated header", url=url, offset=pos), _STOP)
                if not header and reader.left is None:  # not a byte range: the real end
                    msg = "empty file" if pos == 0 else "no end-of-archive blocks: truncated"
                    raise _BadMember(TarFormatError(msg, url=url, offset=pos), _STOP)
                if header and not _archive_ends(reader):
                    msg = "an all-zero block in the middle of the archive"
                    raise _BadMember(TarFormatError(msg, url=url, offset=pos), _GO_ON)
                return
            if start < 0:
                start = pos
            name, size, kind = _parse(header, url, pos)
            padded = size + (-size) % BLOCK
            if kind in b"LKxg":
                extended += 1
                if extended > MAX_EXTENDED:
                    msg = f"more than {MAX_EXTENDED} extended headers before one member"
                    raise _BadMember(TarFormatError(msg, url=url, offset=start), _STOP)
                meta = _meta(reader, size, padded, url, pos)
                if kind == 0x4C:  # L: GNU long name
                    long_name = _nts(meta)
                elif kind in b"xg":
                    records = _pax_or_raise(meta, url, pos)
                    (pax if kind == 0x78 else pax_global).update(records)
                continue
            if pax or pax_global:
                name, size, padded = _apply_pax({**pax_global, **pax}, name, size, padded, url, pos)
            if long_name is not None:
                name = long_name
            member_start, start, long_name, pax, extended = start, -1, None, {}, 0
            if kind not in _REGULAR or (kind == 0 and name.endswith("/")):
                if kind not in _SUPPORTED or kind == 0x53:  # unknown types and sparse files
                    reader.skip(padded)
                continue
            name = _strip(name)
            if drop:  # reported with its pax header: mark it by the name it has
                drop = False
                reader.skip(padded)
                yield Member(name, None, member_start, -1)
                continue
            _check(name, size, padded, max_size, url, member_start)
            if keep is not None and not keep(name):
                reader.skip(padded)
                yield Member(name, None, member_start, reader.tell())
                continue
            data = reader.read(size)
            if len(data) < size or not reader.skip(padded - size):
                msg = f"truncated member ({len(data)} of {size} bytes, padded to {padded})"
                error = TarFormatError(msg, url=url, member=name, offset=member_start)
                raise _BadMember(error, _STOP)
            yield Member(name, data, member_start, reader.tell())
        except (_BadMember, TarFormatError) as exc:
            bad = exc if isinstance(exc, _BadMember) else _BadMember(exc, _SCAN)  # a bad header
            if pos == 0 and bad.error.offset == 0 and _no_header(bad.error):
                bad.error = _not_a_tar(bad.error, url)
            if on_error is None:
                raise bad.error from bad.error.__cause__
            fatal = bad.then == _STOP or (bad.then == _SCAN and not _scan(reader))
            on_error(bad.error, fatal)
            if bad.then != _GO_ON:
                name = bad.error.member or ""
                at = pos if bad.error.offset is None else bad.error.offset
                yield Member(name, None, at, -1)
            start, long_name, pax, extended = -1, None, {}, 0
            drop = bad.then == _DROP
            if fatal or (bad.then > 0 and not (bad.then < 1 << 62 and reader.skip(bad.then))):
                return


def _check(name: str, size: int, padded: int, max_size: int, url: str, offset: int) -> None:
    """Refuse an unsafe name or an oversized member (its data is then skipped)."""
    parts = name.replace("\\", "/").split("/")
    if name.startswith("/") or "\0" in name or ".." in parts:
        msg = "unsafe member name (absolute, with a '..' component or a NUL byte)"
        raise _BadMember(TarFormatError(msg, url=url, member=name, offset=offset), padded)
    if size > max_size:
        msg = f"member of {size} bytes is larger than max_member_bytes={max_size}"
        raise _BadMember(TarFormatError(msg, url=url, member=name, offset=offset), padded)


def _archive_ends(reader: _Reader) -> bool:
    """After one zero block: whether the archive ends (a second one, or the stream's end)."""
    block = reader.read(BLOCK)
    if len(block) < BLOCK or block == _ZERO:
        return True
    reader.unread(block)
    return False


def _scan(reader: _Reader) -> bool:
    """Go on to the next block that is a valid header; ``False`` at the end of the stream."""
    while True:
        block = reader.read(BLOCK)
        if len(block) < BLOCK:
            return False
        if block != _ZERO and block[156] in _HEADERS:
            try:
                valid = _checksum_ok(block)
            except ValueError:
                valid = False
            if valid:
                reader.unread(block)
                return True


def _parse(header: bytes, url: str, pos: int) -> tuple[str, int, int]:
    """Return ``(name, size, typeflag)`` of one header block."""
    name = _nts(header[0:100])
    # a damaged header's name is reported (and marks the sample) only if it reads as text
    shown = name if name and name.isprintable() else None
    try:
        ok = _checksum_ok(header)
        size = _number(header[124:136])
    except ValueError as exc:
        msg = "bad header: a numeric field is not octal"
        raise TarFormatError(msg, url=url, member=shown, offset=pos) from exc
    if not ok:
        msg = "bad header checksum"
        raise TarFormatError(msg, url=url, member=shown, offset=pos)
    if size < 0:
        msg = f"bad header: negative size {size}"
        raise TarFormatError(msg, url=url, member=shown, offset=pos)
    kind = header[156]
    if header[345] and kind not in b"LKS":  # a ustar prefix (GNU uses the bytes otherwise)
        name = f"{_nts(header[345:500])}/{name}"
    return name, size, kind


def _meta(reader: _Reader, size: int, padded: int, url: str, pos: int) -> bytes:
    """Read the data of a long-name or pax header."""
    if size > _MAX_META:
        msg = f"extended header of {size} bytes (limit {_MAX_META})"
        raise TarFormatError(msg, url=url, offset=pos)
    data = reader.read(size)
    if len(data) < size:
        msg = "truncated extended header"
        raise TarFormatError(msg, url=url, offset=pos)
    reader.skip(padded - size)
    return data


def _pax_or_raise(meta: bytes, url: str, pos: int) -> dict[str, str]:
    try:
        return _pax(meta)
    except (ValueError, UnicodeDecodeError) as exc:
        error = TarFormatError("bad pax header", url=url, offset=pos)
        error.__cause__ = exc
        raise _BadMember(error, _DROP) from exc


def _apply_pax(
    records: dict[str, str], name: str, size: int, padded: int, url: str, pos: int
) -> tuple[str, int, int]:
    name = records.get("path", name)
    if "size" in records:
        try:
            size = int(records["size"])
        except ValueError as exc:
            msg = f"bad pax size {records['size']!r}"
            raise TarFormatError(msg, url=url, member=name, offset=pos) from exc
        if size < 0:
            msg = f"bad pax size {size}"
            raise TarFormatError(msg, url=url, member=name, offset=pos)
        padded = size + (-size) % BLOCK
    return name, size, padded
